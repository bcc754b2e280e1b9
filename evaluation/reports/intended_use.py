"""The intended use of a pilot, as the hospital team writes it: a short YAML file, or a Markdown
file (optional YAML front matter with the same keys, then ``#`` headed sections of prose).

Validated at the boundary (unknown keys, wrong types, sizes are refused with the key named), so
the pilot report never prints a half-read statement; when no file is given the report says so
(``not_given``) instead of inventing one. The text is shown as text: never as HTML or Markdown
markup, which a governance board's PDF has no use for and a pasted snippet could abuse.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

MAX_FILE_BYTES = 64 * 1024
MAX_TEXT = 4000
MAX_ITEMS = 30
YAML_SUFFIXES = (".yaml", ".yml")
MARKDOWN_SUFFIXES = (".md", ".markdown", ".txt")

Line = Annotated[str, StringConstraints(strip_whitespace=True, max_length=300)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_TEXT)]

_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*\r?$\n?", re.S | re.M)
_HEADING = re.compile(r"^[ \t]{0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")


class IntendedUseError(ValueError):
    """The intended-use file cannot be read or does not say what it must."""


class UseSection(BaseModel):
    """A headed section of a Markdown statement (the text as written, shown as text)."""

    model_config = ConfigDict(extra="forbid")
    heading: Line = ""
    text: Text = ""


class IntendedUse(BaseModel):
    """What the models of the pilot are meant to do, for whom, and what they must not do."""

    model_config = ConfigDict(extra="forbid")

    given: bool = True  # False: no statement was given (the report says so)
    source: str = ""  # the file's name
    sha256: str = ""  # of the file's bytes, so a board can tell which version it read
    title: Line = ""  # the pilot's name
    organisation: Line = ""
    purpose: Text = ""  # what the model's output is for (required in a YAML statement)
    users: Text = ""  # who reads the output
    population: Text = ""  # which patients and studies
    setting: Text = ""  # where and when in the workflow
    decisions: Text = ""  # what the output may inform, and what it may not decide
    human_oversight: Text = ""  # who checks the output before anything is done with it
    out_of_scope: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS)
    contact: Line = ""
    sections: list[UseSection] = Field(default_factory=list, max_length=MAX_ITEMS)


KEYS = tuple(
    k for k in IntendedUse.model_fields if k not in {"given", "source", "sha256", "sections"}
)
# The statement's fields as the report labels them (also the YAML keys' documentation).
LABELS = {
    "purpose": "Purpose",
    "users": "Intended users",
    "population": "Patients and studies",
    "setting": "Setting",
    "decisions": "Decisions it may inform",
    "human_oversight": "Human oversight",
    "out_of_scope": "Out of scope",
    "contact": "Contact",
}


def not_given() -> IntendedUse:
    """The statement of a report made without one: says it was not given."""
    return IntendedUse(given=False)


def _problem(exc: ValidationError, path: Path) -> IntendedUseError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the file"
    if err["type"] == "extra_forbidden":
        import difflib

        near = difflib.get_close_matches(str(err["loc"][0]), KEYS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return IntendedUseError(
            f"intended use {path.name}: unknown key {where!r}{hint}; the keys are "
            + ", ".join(KEYS)
        )
    return IntendedUseError(f"intended use {path.name}: {where}: {err['msg']}")


def _mapping(text: str, path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise IntendedUseError(f"intended use {path.name}: not YAML ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise IntendedUseError(
            f"intended use {path.name}: expected keys ({', '.join(KEYS[:4])}, ...), "
            f"found a {type(data).__name__}"
        )
    if "out_of_scope" in data and isinstance(data["out_of_scope"], str):
        data["out_of_scope"] = [data["out_of_scope"]]
    for key in ("given", "source", "sha256", "sections"):  # the reader's, not the team's
        if key in data:
            raise IntendedUseError(
                f"intended use {path.name}: {key!r} is set by the reader, not the file"
            )
    return {str(k): v for k, v in data.items()}


def _sections(body: str) -> list[dict[str, str]]:
    sections: list[dict[str, str]] = []
    heading, lines = "", list[str]()
    for line in body.splitlines():
        m = _HEADING.match(line)
        if m:
            if heading or "".join(lines).strip():
                sections.append({"heading": heading, "text": "\n".join(lines).strip()})
            heading, lines = m.group(2), []
        else:
            lines.append(line)
    if heading or "".join(lines).strip():
        sections.append({"heading": heading, "text": "\n".join(lines).strip()})
    return sections


def load_intended_use(path: Path) -> IntendedUse:
    """The statement in ``path`` (YAML: the keys of ``IntendedUse``; Markdown: optional front
    matter with those keys, then ``#`` sections). Raises ``IntendedUseError`` saying what to
    fix: not a regular file, over 64 KiB, not UTF-8, an unknown key, no purpose."""
    from dicom import FileTooLargeError, NotRegularFileError, read_regular

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in YAML_SUFFIXES + MARKDOWN_SUFFIXES:
        raise IntendedUseError(
            f"intended use {path.name}: give a .yaml/.yml or .md file (found {suffix or 'none'})"
        )
    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except NotRegularFileError:
        raise IntendedUseError(f"intended use {path}: not a regular file") from None
    except FileTooLargeError:
        raise IntendedUseError(
            f"intended use {path}: over {MAX_FILE_BYTES >> 10} KiB; a statement for a board "
            "is a page, not a document"
        ) from None
    except OSError as exc:
        raise IntendedUseError(f"intended use {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IntendedUseError(f"intended use {path.name}: not UTF-8 ({exc.reason})") from None
    fields: dict[str, Any]
    if suffix in YAML_SUFFIXES:
        fields = _mapping(text, path)
    else:
        front = _FRONT.match(text)
        fields = _mapping(front.group(1), path) if front else {}
        fields["sections"] = _sections(text[front.end() :] if front else text)
    fields |= {"given": True, "source": path.name, "sha256": hashlib.sha256(data).hexdigest()}
    try:
        use = IntendedUse.model_validate(fields)
    except ValidationError as exc:
        raise _problem(exc, path) from None
    if not use.purpose and not any(s.text for s in use.sections):
        raise IntendedUseError(
            f"intended use {path.name}: says nothing: give at least 'purpose: ...' "
            "(what the models' output is for)"
        )
    return use
