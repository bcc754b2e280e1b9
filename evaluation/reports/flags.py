"""Automatic flags of an answer: what a clinician should look at first."""

from __future__ import annotations

from evaluation.case import Case
from evaluation.reports.model import AnswerChecklist, Flag, FlagKind, Mark
from evaluation.reports.rundata import SampleResult
from evaluation.scores import ParseStatus
from evaluation.scoring.truth import is_normal_control


def answer_flags(case: Case, a: AnswerChecklist, s: SampleResult, low: float) -> list[Flag]:
    """The automatic flags of one answer, from its marked checklist lines and its scores."""
    flags: list[Flag] = []
    status = s.scored.status
    if status is ParseStatus.FORMAT_FAILURE:
        flags.append(Flag(kind=FlagKind.FORMAT_FAILURE, detail="no valid JSON answer"))
    elif status is ParseStatus.REFUSAL:
        flags.append(Flag(kind=FlagKind.REFUSAL, detail="the model refused or was blocked"))
    elif status is ParseStatus.ERROR:
        flags.append(Flag(kind=FlagKind.CALL_ERROR, detail="the call failed"))
    normal = case.ground_truth is not None and is_normal_control(case.ground_truth)
    halluc = [f"finding {f.index}" for f in a.findings if f.mark is Mark.HALLUCINATED]
    subs = set(s.scored.error.sub_labels) if s.scored.error else set()
    nfp = s.scored.value("normal_control_false_positive")
    if normal and (halluc or nfp == 1.0 or "hallucinated_finding" in subs):
        positive = [f"finding {f.index}" for f in a.findings if f.mark is not Mark.NEGATIVE]
        detail = ", ".join(positive) or "abnormal class stated"
        flags.append(Flag(kind=FlagKind.FINDINGS_ON_NORMAL_CONTROL, detail=detail))
    elif halluc or "hallucinated_finding" in subs:
        detail = ", ".join(halluc) + " match no lesion" if halluc else "per the error rules"
        flags.append(Flag(kind=FlagKind.SUSPECTED_HALLUCINATION, detail=detail))
    missed = [f"lesion {x.id}" for x in a.lesions if x.mark is Mark.MISSED]
    if missed or "missed_lesion" in subs:
        why = ", ".join(missed) or (s.scored.error.evidence[:200] if s.scored.error else "")
        flags.append(Flag(kind=FlagKind.MISSED_LESION, detail=why))
    wrong = [
        f"{x.stated!r} for {x.header_class or 'an image'}"
        for x in a.sequences
        if x.mark is Mark.WRONG
    ]
    if wrong or "sequence_misidentification" in subs:
        flags.append(
            Flag(kind=FlagKind.SEQUENCE_MISIDENTIFIED, detail="; ".join(wrong) or "per the rules")
        )
    conf = a.confidence.value if a.confidence else None
    if conf is not None and conf < low:
        flags.append(
            Flag(kind=FlagKind.LOW_CONFIDENCE, detail=f"confidence {conf:.2f} < {low:.2f}")
        )
    return flags
