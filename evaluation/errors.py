"""Specific error types of the evaluation engine, with messages a user can act on, and the one
way an input file's error names the field at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class EvaluationError(Exception):
    """Base class for evaluation-engine errors."""


class DatasetError(EvaluationError):
    """A dataset or case could not be loaded (missing file, bad field, unsafe path)."""


class PromptError(EvaluationError):
    """A prompt template is missing or could not be rendered."""


class ModelConfigError(EvaluationError):
    """A model name, models file or endpoint setting is unusable."""


class PHIError(EvaluationError):
    """Content could not be made safe to leave for a remote endpoint."""


class StoreError(EvaluationError):
    """The run store is missing, locked, of another version, or inconsistent with the request."""


def is_union_tag(part: int | str) -> bool:
    """A tag of one of our tagged unions (they start with "~"; pydantic puts the member's tag
    into an error's location)."""
    return isinstance(part, str) and part.startswith("~")


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """A validation error's location as a person reads it, the one notation of every input
    file's errors (manifests, case folders, models files, routing rules):
    ``('cases', 1, 'tasks', 0)`` -> ``cases[1].tasks[0]``; union tags are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not is_union_tag(part):
            out += f".{part}" if out else str(part)
    return out


def first_error(exc: ValidationError, whole: str = "the input") -> str:
    """A validation error as a person fixes it: the field's path (``whole`` when the input
    itself is wrong), what is wrong, the value (bounded), and how many more there are."""
    errors = exc.errors()
    err = errors[0]
    where = field_path(err["loc"]) or whole
    got = f" (got {err['input']!r:.80})" if err["type"] != "missing" else ""
    more = f"; and {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"{where}: {err['msg']}{got}{more}"
