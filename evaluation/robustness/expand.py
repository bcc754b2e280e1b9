"""The ``robustness`` option's two steps: which kinds a run asks for (``parse_kinds``), and the
dataset with each case's variants beside it (``with_variants``): the same questions are asked of
every variant because a variant is a case like any other, so the dry run and ``--max-cost`` count
its calls with the rest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from evaluation.case import Case
from evaluation.datasets import Dataset
from evaluation.errors import EvaluationError
from evaluation.robustness.generate import VariantError, make_variant
from evaluation.robustness.records import (
    ATTACKS,
    IMAGE_ABLATIONS,
    MIRRORS,
    CaseVariant,
    VariantKind,
)

# names for groups of kinds (an option's words)
GROUPS: dict[str, frozenset[VariantKind]] = {
    "all": frozenset(VariantKind),
    "ablations": IMAGE_ABLATIONS,
    "mirrors": MIRRORS,
    "attacks": ATTACKS,
}
MAX_OPTION_CHARS = 1000


class RobustnessOptionError(EvaluationError):
    """A ``robustness`` option that names no kind we know."""


def parse_kinds(option: str) -> tuple[VariantKind, ...]:
    """The kinds a comma-separated option names (kinds or groups: ``all``, ``ablations``,
    ``mirrors``, ``attacks``), in VariantKind's order, each once; empty: none."""
    if len(option) > MAX_OPTION_CHARS:
        raise RobustnessOptionError(f"robustness: {len(option)} characters is not an option")
    chosen: set[VariantKind] = set()
    for word in (w.strip().lower() for w in option.split(",")):
        if not word:
            continue
        if word in GROUPS:
            chosen |= GROUPS[word]
        elif word in VariantKind.__members__.values():
            chosen.add(VariantKind(word))
        else:
            known = ", ".join([*GROUPS, *(k.value for k in VariantKind)])
            raise RobustnessOptionError(f"robustness: {word[:60]!r} is not a kind; one of {known}")
    return tuple(k for k in VariantKind if k in chosen)


class VariantSkipped(BaseModel):
    """A variant the option asked for that this case cannot have, and why."""

    case_id: str
    kind: VariantKind
    reason: str


class ExpandedDataset(BaseModel):
    """The cases a robustness run asks: the sources, then their variants (in source order, kind
    order); the variants' records; the ones that could not be made."""

    cases: list[Case]
    variants: list[CaseVariant]
    skipped: list[VariantSkipped]


def with_variants(
    cases: Sequence[Case], kinds: Sequence[VariantKind], out_dir: Path, seed: int = 0
) -> ExpandedDataset:
    """Each case, then every variant of ``kinds`` of each case (images under ``out_dir``); a
    variant a case cannot have is skipped with its reason, the rest are made."""
    out = list(cases)
    records: list[CaseVariant] = []
    skipped: list[VariantSkipped] = []
    for case in cases:
        for kind in kinds:
            try:
                variant, record = make_variant(case, kind, out_dir, seed=seed, pool=cases)
            except VariantError as exc:
                skipped.append(VariantSkipped(case_id=case.case_id, kind=kind, reason=str(exc)))
                continue
            out.append(variant)
            records.append(record)
    return ExpandedDataset(cases=out, variants=records, skipped=skipped)


def expand_dataset(
    dataset: Dataset, kinds: Sequence[VariantKind], cache_dir: Path, seed: int | None = None
) -> Dataset:
    """The dataset a run with the ``robustness`` option asks (the run and its dry run both read
    it here): each case then its variants (images under ``cache_dir/variants``); a variant a
    case cannot have is a warning. No kinds: the dataset as it is."""
    if not kinds:
        return dataset
    made = with_variants(dataset.cases, kinds, cache_dir / "variants", seed=seed or 0)
    notes = [f"{s.case_id}: no {s.kind.value} variant: {s.reason}" for s in made.skipped]
    return dataset.model_copy(update={"cases": made.cases, "warnings": [*dataset.warnings, *notes]})
