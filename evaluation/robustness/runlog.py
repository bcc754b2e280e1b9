"""The run log's record of a run's variants: one run note (``robustness_variants``) holding
every :class:`CaseVariant` the run asked on, keyed by the variant's case id. A sample names its
variant by its case id (``<source>~<kind>``, :func:`variant_of`); the note says what that
variant was (what was planted and where, the truth transform, the images sent by hash). No
column is added to the samples table: the note is written once when the run starts and read
back typed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, ValidationError

from evaluation.errors import StoreError, first_error
from evaluation.robustness.records import CaseVariant

VARIANTS_NOTE = "robustness_variants"
MAX_NOTE_CHARS = 64_000_000  # a note longer than this is not ours: refused, not parsed


class _Notes(Protocol):
    def set_note(self, key: str, value: str) -> None: ...
    def note(self, key: str) -> str | None: ...


class RunVariants(BaseModel):
    """Every variant of a run, in the order they were made."""

    variants: list[CaseVariant]


def recorded_variants(store: _Notes) -> dict[str, CaseVariant]:
    """The run's variants by their case id (empty: the run asked on none)."""
    text = store.note(VARIANTS_NOTE)
    if text is None:
        return {}
    if len(text) > MAX_NOTE_CHARS:
        raise StoreError(f"the run note {VARIANTS_NOTE!r} is {len(text)} characters: not ours")
    try:
        held = RunVariants.model_validate_json(text)
    except ValidationError as exc:
        raise StoreError(
            f"the run note {VARIANTS_NOTE!r} is not a list of variants: "
            f"{first_error(exc, 'the note')}"
        ) from exc
    return {v.case_id: v for v in held.variants}


def record_variants(store: _Notes, variants: Iterable[CaseVariant]) -> None:
    """Add ``variants`` to the run's note; a variant recorded earlier (a resumed run) is kept
    as it was when it differs only in the image paths, else the new one is refused: a resumed
    run must ask on the same variants."""
    held = recorded_variants(store)
    for v in variants:
        old = held.get(v.case_id)
        if old is not None and _sans_paths(old) != _sans_paths(v):
            raise StoreError(
                f"variant {v.case_id}: this run recorded another one (seed {old.seed}, images "
                f"{[i.sha256[:12] for i in old.images]}); resume with the run's own seed"
            )
        held.setdefault(v.case_id, v)
    store.set_note(VARIANTS_NOTE, RunVariants(variants=list(held.values())).model_dump_json())


def _sans_paths(v: CaseVariant) -> tuple[object, ...]:
    return (v.model_dump(exclude={"images"}), [(i.index, i.sha256) for i in v.images])
