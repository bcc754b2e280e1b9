"""The run as its cases were received: what a clinician reviews, signs and finds in the PACS.

The audit's variants are cases of the run like any other (their samples are in the run log, the
audit's measures read them there), but an answer given on a mirrored study or under a planted
instruction says nothing about the patient: the gateway's write-back (SR and PDF), its checklist
and its review pages take the run without them.
"""

from __future__ import annotations

from evaluation.log.rundata import RunData
from evaluation.robustness.records import variant_of


def as_received(run: RunData) -> RunData:
    """``run`` without the audit's variants (their cases, image folders and samples); the run
    itself when it has none."""
    if not any(variant_of(c.case_id)[1] is not None for c in run.cases) and not any(
        variant_of(s.scored.case_id)[1] is not None for s in run.samples
    ):
        return run
    cases = [c for c in run.cases if variant_of(c.case_id)[1] is None]
    kept = {c.case_id for c in cases}
    return run.model_copy(
        update={
            "cases": cases,
            "case_roots": {k: v for k, v in run.case_roots.items() if k in kept},
            "samples": [s for s in run.samples if s.scored.case_id in kept],
        }
    )
