"""The run as its cases were received: what a clinician reviews, signs and finds in the PACS.

The audit's variants are cases of the run like any other (their samples are in the run log, the
audit's measures read them there), but an answer given on a mirrored study or under a planted
instruction says nothing about the patient: the gateway's write-back (SR and PDF), its checklist
and its review pages take the run without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

from evaluation.case import Case
from evaluation.robustness.measures import AuditedSample, VariantPair, variant_pairs
from evaluation.robustness.records import CaseVariant, variant_of


class _Run(Protocol):
    """What is read of a run (``log.RunData``; the log's records hold the variants' record, so
    this package does not import them)."""

    @property
    def cases(self) -> Sequence[Case]: ...
    @property
    def case_roots(self) -> Mapping[str, str]: ...
    @property
    def samples(self) -> Sequence[AuditedSample]: ...
    @property
    def variants(self) -> Sequence[CaseVariant]: ...
    @property
    def audit(self) -> Sequence[VariantPair]: ...
    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


R = TypeVar("R", bound=_Run)


def as_received(run: R) -> R:
    """``run`` without the audit's variants (their cases, image folders and samples); the run
    itself when it has none. What the variants showed stays, as the pairs of each variant's
    answer with its source's (``audit``): the checklists of the cases flag it."""
    if not any(variant_of(c.case_id)[1] is not None for c in run.cases) and not any(
        variant_of(s.scored.case_id)[1] is not None for s in run.samples
    ):
        return run
    pairs, _ = variant_pairs(run.samples, {v.case_id: v for v in run.variants})
    cases = [c for c in run.cases if variant_of(c.case_id)[1] is None]
    kept = {c.case_id for c in cases}
    return run.model_copy(
        update={
            "cases": cases,
            "case_roots": {k: v for k, v in run.case_roots.items() if k in kept},
            "samples": [s for s in run.samples if s.scored.case_id in kept],
            "variants": [],
            "audit": [*run.audit, *pairs],
        }
    )
