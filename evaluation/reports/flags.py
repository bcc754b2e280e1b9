"""Automatic flags of an answer: what a clinician should look at first.

Every error flag stands for a sub-label of the answer's effective error label (the one the page
shows), so a flag never contradicts the label: no "missed lesion" beside "No error". The item
marks only supply the detail (which lesion, which finding).
"""

from __future__ import annotations

from evaluation.case import Case
from evaluation.log.rundata import SampleResult
from evaluation.parsing import format_reason
from evaluation.reports.checklist_view import AnswerChecklist, Flag, FlagKind, Mark
from evaluation.scores import ParseStatus
from evaluation.scoring.truth import is_normal_control


def answer_flags(case: Case, a: AnswerChecklist, s: SampleResult, low: float) -> list[Flag]:
    """The automatic flags of one answer, from its effective error label and its marked lines."""
    flags: list[Flag] = []
    status = s.scored.status
    if status is ParseStatus.FORMAT_FAILURE:
        why = format_reason(s.parse_error or "")
        detail = f"no valid JSON answer: {why}" if why else "no valid JSON answer"
        flags.append(Flag(kind=FlagKind.FORMAT_FAILURE, detail=detail))
    elif status is ParseStatus.REFUSAL:
        flags.append(Flag(kind=FlagKind.REFUSAL, detail="the model refused or was blocked"))
    elif status is ParseStatus.ERROR:
        flags.append(Flag(kind=FlagKind.CALL_ERROR, detail="the call failed"))
    label = s.scored.effective_error
    subs = set(label.sub_labels) if label else set()
    evidence = label.evidence[:200] if label else ""
    normal = case.ground_truth is not None and is_normal_control(case.ground_truth)
    halluc = [f"finding {f.index}" for f in a.findings if f.mark is Mark.HALLUCINATED]
    if "hallucinated_finding" in subs:
        if normal:
            positive = [f"finding {f.index}" for f in a.findings if f.mark is not Mark.NEGATIVE]
            detail = ", ".join(positive) or "abnormal class stated"
            flags.append(Flag(kind=FlagKind.FINDINGS_ON_NORMAL_CONTROL, detail=detail))
        else:
            detail = ", ".join(halluc) + " match no lesion" if halluc else evidence
            flags.append(Flag(kind=FlagKind.SUSPECTED_HALLUCINATION, detail=detail))
    if "fabricated_without_images" in subs:
        invented = [
            f"finding {f.index}" for f in a.findings if f.mark in (Mark.HALLUCINATED, Mark.NEAR)
        ]
        detail = (", ".join(invented) or evidence) + " (no image was shown)"
        flags.append(Flag(kind=FlagKind.FABRICATED_WITHOUT_IMAGES, detail=detail))
    if "missed_lesion" in subs:
        missed = [f"lesion {x.id}" for x in a.lesions if x.mark is Mark.MISSED]
        flags.append(Flag(kind=FlagKind.MISSED_LESION, detail=", ".join(missed) or evidence))
    if "sequence_misidentification" in subs:
        wrong = [
            f"{x.stated!r} for {x.header_class or 'an image'}"
            for x in a.sequences
            if x.mark is Mark.WRONG
        ]
        flags.append(
            Flag(kind=FlagKind.SEQUENCE_MISIDENTIFIED, detail="; ".join(wrong) or evidence)
        )
    conf = a.confidence.value if a.confidence else None
    if conf is not None and conf < low:
        flags.append(
            Flag(kind=FlagKind.LOW_CONFIDENCE, detail=f"confidence {conf:.2f} < {low:.2f}")
        )
    return flags
