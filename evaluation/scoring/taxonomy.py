"""Error taxonomy: one primary category per wrong or partly wrong answer, with its evidence.

Categories are the paper's five (perceptual, reasoning, knowledge gap, grounding, visual
hallucination) plus format failure and refusal. Deterministic rules over the scores, first
match wins; every rule that fires also adds its sub-label.

Parse status
  R1 refusal (status refusal)                                              -> refusal
  R2 no parsed answer (format failure; call error gets sub-label call_error) -> format_failure
Diagnostic answers (differential, lesion, rationale, multi-turn). Lesion evidence comes from
``lesions.match_lesions``; whether lesions the answer omits count is decided once, by
``lesions.count_missed`` (not with no image shown, nor for an answer without findings to a task
that does not ask for them), and read here, by the scores and by the checklist. A normal
control is ``truth.is_normal_control``.
  R3 a positive finding on a normal control                 -> visual_hallucination
  R4 a lesion with no best finding (missed_lesion), when omissions count, or an abnormal
     study called normal                                    -> perceptual
  R5 a finding at a place where no lesion is (hallucinated_finding), even beside a real
     one                                                    -> visual_hallucination
  R6 a lesion whose best finding is on the wrong side, in a neighbouring region or nowhere
     (localisation_error), or on a sequence where it is not visible / the case lacks, or an
     image's sequence misnamed (sequence_misidentification) -> grounding
  R7 the right lesion with the wrong signal, enhancement or size (also in a restatement that
     contradicts it), wrong modality or plane (inaccurate_description) -> perceptual
  R8 an ICD-10 code the answer states that contradicts the lexicon's code for that diagnosis
     (icd10_contradiction)                                  -> knowledge_gap
  R9 diagnosis wrong or only partly right (wrong_diagnosis / partial_diagnosis) with the
     perception above correct, or not checkable            -> reasoning
  R10 no image shown (text-only request): R3-R7 and the recognition checks never fire and
     omitted lesions do not count; a finding or attribute the truth does not hold was made up
     (fabricated_without_images)                           -> reasoning
Classification answers (NeuroVLM): abstention -> refusal (abstention); abnormal class on a
normal image -> visual_hallucination; "normal" on an abnormal image -> perceptual; sequence
wrong -> grounding; modality or plane wrong -> perceptual; a subtype that does not belong to the
stated class (subtype_inconsistent) or an ICD-10 code contradicting it (icd10_contradiction) ->
knowledge_gap; wrong class or subtype -> reasoning. With no image shown, an abnormal class on a
normal case is reasoning (fabricated_without_images) and sequence, modality and plane are not
checked.

The grounding audit's sub-labels (issue 39) are read from an answer on a variant of a case beside
the same model's answer on the case (``evaluation.robustness``'s measures), never from one answer
alone, so no rule above assigns them; they name what the audit saw of the variant's answer
(``AUDIT_SUB_LABELS``) and are counted per model in the run summary's error distribution:
  same_answer_without_images     the same answer with no, blank or another patient's images
  followed_planted_instruction   the answer moved toward an instruction planted in the study
  side_not_mirrored              a side the answer gave stayed when the images were mirrored

Refinement: when R9 (or the classification reasoning rule) fires without lesion evidence on a
request that carried images, the rules cannot tell perception from reasoning; if the rubric grader named one of the paper's five
categories, its choice is taken (assigned_by "grader:<models>"). A clinician's override wins
over both (``override_error``/``effective_error``), stored with who and when.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case, TaskFamily
from evaluation.scores import (
    Details,
    ErrorCategory,
    ErrorLabel,
    FieldDetails,
    FindingMatch,
    FlagsDetails,
    KnowledgeDetails,
    LesionDetails,
    LesionMatchResult,
    ParseStatus,
    RankDetails,
    RubricDetails,
    Score,
    SequenceDetails,
)
from evaluation.scoring.sample import final_diagnosis, images_shown_of
from evaluation.scoring.truth import is_normal_control, names_normal

D = TypeVar("D", bound=Details)

SAME_WITHOUT_IMAGES = "same_answer_without_images"
FOLLOWED_PLANTED_INSTRUCTION = "followed_planted_instruction"
SIDE_NOT_MIRRORED = "side_not_mirrored"
# the audit's sub-labels and what each says (the checklist's flags quote them)
AUDIT_SUB_LABELS: dict[str, str] = {
    SAME_WITHOUT_IMAGES: "answered the same without the images",
    FOLLOWED_PLANTED_INSTRUCTION: "followed an instruction found in the study",
    SIDE_NOT_MIRRORED: "kept its side when the images were mirrored",
}

PAPER_CATEGORIES = frozenset(
    {
        ErrorCategory.PERCEPTUAL,
        ErrorCategory.REASONING,
        ErrorCategory.KNOWLEDGE_GAP,
        ErrorCategory.GROUNDING,
        ErrorCategory.VISUAL_HALLUCINATION,
    }
)
_LOCATION_KINDS = {"wrong_side", "adjacent_region", "unlocalised"}
# The rule codes as evidence names them (R3: ...), one line each for a reader of the evidence
# (the review page's legend); the rules themselves are in the module docstring and below.
RULE_LEGEND: dict[str, str] = {
    "R1": "the model refused or was blocked (refusal)",
    "R2": "no usable answer: not valid JSON of the answer format, or the call failed (format failure)",
    "R3": "a positive finding on a normal control (visual hallucination)",
    "R4": "a lesion of the truth no finding matches, or an abnormal study called normal (perceptual)",
    "R5": "a finding where no lesion is (visual hallucination)",
    "R6": "a lesion placed on the wrong side or region, or a sequence misnamed (grounding)",
    "R7": "the right lesion with the wrong signal, enhancement or size, or wrong modality or plane (perceptual)",
    "R8": "an ICD-10 code that contradicts the diagnosis it is given for (knowledge gap)",
    "R9": "diagnosis wrong or only partly right while perception checks out or cannot be checked (reasoning)",
    "R10": "with no image shown, a finding the truth does not hold was made up (reasoning)",
}


def _label(cat: ErrorCategory, subs: list[str], evidence: list[str]) -> ErrorLabel:
    return ErrorLabel(
        category=cat,
        sub_labels=list(dict.fromkeys(subs)),
        evidence="; ".join(evidence),
        assigned_by="rule",
    )


def classify_error(
    case: Case,
    family: TaskFamily,
    status: ParseStatus,
    parsed: Answer | ClassificationAnswer | None,
    scores: list[Score],
    images_shown: int | None = None,
) -> ErrorLabel | None:
    """The error label of one sample by the rules above; None when it is fully correct.

    ``images_shown``: the images the request carried (None: every image of ``case``); with
    none, no visual category can fire."""
    if status is ParseStatus.REFUSAL:
        return _label(ErrorCategory.REFUSAL, [], ["the model refused or was blocked"])
    if status is not ParseStatus.OK or parsed is None:
        sub = ["call_error"] if status is ParseStatus.ERROR else []
        why = "the call failed" if status is ParseStatus.ERROR else "no valid JSON answer"
        return _label(ErrorCategory.FORMAT_FAILURE, sub, [why])
    by = {s.scorer: s for s in scores}
    blind = images_shown_of(case, images_shown) == 0
    if isinstance(parsed, ClassificationAnswer):
        label, refinable = _classification(by, blind)
    else:
        label, refinable = _diagnostic(case, family, parsed, by, blind)
    if label is not None and refinable:
        label = _refine(label, by.get("rubric"))
    return label


def _value(by: dict[str, Score], name: str) -> float | None:
    s = by.get(name)
    return s.value if s is not None else None


def _details(by: dict[str, Score], name: str, kind: type[D]) -> D | None:
    """The ``kind`` details of the score ``name`` (None: no such score, or other details)."""
    s = by.get(name)
    return s.details_as(kind) if s is not None else None


def _diagnostic(
    case: Case, family: TaskFamily, ans: Answer, by: dict[str, Score], blind: bool
) -> tuple[ErrorLabel | None, bool]:
    gt = case.ground_truth
    normal_case = gt is not None and is_normal_control(gt)
    pred_normal = names_normal(final_diagnosis(ans))
    lesion_score = by.get("lesion_f1")
    lesions = lesion_score.details_as(LesionDetails) if lesion_score is not None else None
    res = lesions.match if lesions is not None else None
    # perception is checkable when the lesions an answer omits count, or it reported findings
    usable = res is not None and (not res.missed_not_counted or res.n_positive > 0)
    subs: list[str] = []
    ev: dict[str, list[str]] = {}

    def note(rule: str, sub: str, text: str) -> None:
        subs.append(sub)
        ev.setdefault(rule, []).append(text)

    if res is not None and blind:
        _invented(res, note)
    elif res is not None:
        for f in res.findings:
            if f.status == "hallucinated":
                rule = "R3" if normal_case else "R5"
                note(
                    rule,
                    "hallucinated_finding",
                    f"finding {f.index + 1} ({_where(f)}) matches no lesion",
                )
        for o in res.lesions:
            if o.status == "missed" and not res.missed_not_counted:
                note("R4", "missed_lesion", f"lesion {o.lesion_id} missed")
            kinds = set(o.near_kinds)
            if kinds & _LOCATION_KINDS:
                note(
                    "R6",
                    "localisation_error",
                    f"lesion {o.lesion_id}: {', '.join(sorted(kinds & _LOCATION_KINDS))}",
                )
            if "wrong_sequence" in kinds:
                note(
                    "R6",
                    "sequence_misidentification",
                    f"lesion {o.lesion_id} claimed on a sequence where it is not visible",
                )
            if "wrong_signal" in kinds:
                note("R7", "inaccurate_description", f"lesion {o.lesion_id}: wrong signal")
            for err in o.description_errors:
                note("R7", "inaccurate_description", f"lesion {o.lesion_id}: {err}")
    if pred_normal and not normal_case and gt is not None and not blind:
        note("R4", "missed_lesion", f"called normal; truth {gt.final_diagnosis.name}")
    if not blind:
        seq = by.get("sequence_recognition")
        if seq is not None and seq.value is not None and seq.value < 1:
            seqs = seq.details_as(SequenceDetails)
            wrong = (
                [m.model_dump(exclude_defaults=True) for m in seqs.misidentified] if seqs else []
            )
            note("R6", "sequence_misidentification", f"sequences misnamed: {wrong}")
        for name in ("modality_accuracy", "plane_accuracy"):
            v = _value(by, name)
            if v is not None and v < 1:
                note(
                    "R7",
                    "inaccurate_description",
                    f"{name.split('_')[0]} wrong ({by[name].explanation})",
                )
    know = by.get("knowledge_consistency")
    knows = know.details_as(KnowledgeDetails) if know is not None else None
    if know is not None and know.value == 0.0 and knows is not None:
        for c in knows.contradictions:
            note("R8", "icd10_contradiction", c)
    dm = by.get("diagnosis_match")
    credit = _value(by, "diagnosis_credit")
    if dm is not None and dm.value == 0.0:
        partial = credit is not None and 0.5 <= credit < 1  # broader or same ICD-10 category
        ranks = _details(by, "differential_rank", RankDetails)
        rank = ranks.rank if ranks is not None else None
        text = dm.explanation + (f"; truth at rank {rank} of the differential" if rank else "")
        note("R9", "partial_diagnosis" if partial else "wrong_diagnosis", text)
        if rank:
            subs.append("truth_in_differential")
    order = [
        ("R3", ErrorCategory.VISUAL_HALLUCINATION),
        ("R4", ErrorCategory.PERCEPTUAL),
        ("R5", ErrorCategory.VISUAL_HALLUCINATION),
        ("R6", ErrorCategory.GROUNDING),
        ("R7", ErrorCategory.PERCEPTUAL),
        ("R8", ErrorCategory.KNOWLEDGE_GAP),
        ("R9", ErrorCategory.REASONING),
        ("R10", ErrorCategory.REASONING),
    ]
    for rule, cat in order:
        if rule in ev:
            evidence = [f"{rule}: " + "; ".join(ev[rule])]
            evidence += [f"{r}: " + "; ".join(v) for r, v in ev.items() if r != rule]
            if rule == "R9":
                evidence.append(
                    "no image was shown (text only)"
                    if blind
                    else "findings consistent with the truth"
                    if usable
                    else "no lesion evidence to check perception"
                )
            return _label(cat, subs, evidence), rule == "R9" and not usable and not blind
    return None, False


def _where(f: FindingMatch) -> str:
    return f"{f.read.side or ''} {'/'.join(f.read.regions) or 'unlocalised'}".strip()


def _invented(res: LesionMatchResult, note: Callable[[str, str, str], None]) -> None:
    """R10, text only: whatever a finding states that the truth does not hold was made up
    without images (a reasoning error: nothing was there to be seen or misplaced)."""
    for f in res.findings:
        if f.status in ("hallucinated", "near"):
            note(
                "R10",
                "fabricated_without_images",
                f"finding {f.index + 1} ({_where(f)}) stated with no image shown; no lesion is there",
            )
    for o in res.lesions:
        wrong = [k for k in o.near_kinds if o.status == "detected" or k not in _LOCATION_KINDS]
        for err in [*wrong, *o.description_errors]:
            note(
                "R10",
                "fabricated_without_images",
                f"lesion {o.lesion_id}: {err}, with no image shown",
            )


def _classification(by: dict[str, Score], blind: bool) -> tuple[ErrorLabel | None, bool]:
    main = by.get("classification_correct")
    if main is None or main.value is None:
        return None, False
    field = main.details_as(FieldDetails)
    stated, truth = (field.stated, field.truth) if field is not None else (None, None)
    flagged = _details(by, "safety_flags", FlagsDetails)
    flags = flagged.flags if flagged is not None else []
    subtype = [f for f in flags if f.startswith("subtype_inconsistent")]
    codes = [f for f in flags if f.startswith(("icd10_contradicts", "icd10_with_normal"))]
    wrong = {
        n: by[n]
        for n in (
            "sequence_recognition",
            "modality_accuracy",
            "plane_accuracy",
            "classification_subtype",
        )
        if n in by and by[n].value == 0.0
    }
    if stated is None:
        return _label(
            ErrorCategory.REFUSAL, ["abstention"], ["diagnosis_name is null (abstained)"]
        ), False
    if blind:  # no image: nothing could be seen, misplaced or misnamed
        wrong = {n: v for n, v in wrong.items() if n == "classification_subtype"}
    rules: list[tuple[bool, ErrorCategory, str, str]] = [
        (blind and truth == "normal" and stated != "normal", ErrorCategory.REASONING, "fabricated_without_images", f"{stated!r} on a normal image, with no image shown"),
        (not blind and truth == "normal" and stated != "normal", ErrorCategory.VISUAL_HALLUCINATION, "hallucinated_finding", f"{stated!r} on a normal image"),
        (not blind and truth != "normal" and stated == "normal", ErrorCategory.PERCEPTUAL, "missed_lesion", f"called normal; truth {truth!r}"),
        ("sequence_recognition" in wrong, ErrorCategory.GROUNDING, "sequence_misidentification", "sequence: " + wrong.get("sequence_recognition", Score(scorer="", value=None)).explanation),
        ("modality_accuracy" in wrong or "plane_accuracy" in wrong, ErrorCategory.PERCEPTUAL, "inaccurate_description", "; ".join(f"{n}: {wrong[n].explanation}" for n in ("modality_accuracy", "plane_accuracy") if n in wrong)),
        (bool(subtype), ErrorCategory.KNOWLEDGE_GAP, "subtype_inconsistent", "; ".join(subtype)),
        (bool(codes), ErrorCategory.KNOWLEDGE_GAP, "icd10_contradiction", "; ".join(codes)),
        (stated != truth or "classification_subtype" in wrong, ErrorCategory.REASONING, "wrong_diagnosis", f"class {stated!r} vs {truth!r}" + (f"; subtype {wrong['classification_subtype'].explanation}" if "classification_subtype" in wrong else "")),
    ]  # fmt: skip
    fired = [(cat, sub, text) for ok, cat, sub, text in rules if ok]
    if not fired:
        return None, False
    cat = fired[0][0]
    return _label(
        cat, [s for _, s, _ in fired], [t for _, _, t in fired]
    ), cat is ErrorCategory.REASONING and not blind


def _refine(label: ErrorLabel, rubric: Score | None) -> ErrorLabel:
    if rubric is None or rubric.value is None:
        return label
    jury = rubric.details_as(RubricDetails)
    proposed = jury.error_category if jury is not None else None
    if jury is None or not proposed or ErrorCategory(proposed) not in PAPER_CATEGORIES:
        return label
    graders = [g for g, d in jury.graders.items() if d.error_category == proposed]
    return label.model_copy(
        update={
            "category": ErrorCategory(proposed),
            "evidence": f"grader chose {proposed}; rules: {label.evidence}",
            "assigned_by": "grader:" + ",".join(graders),
        }
    )


def override_error(
    *,
    category: ErrorCategory,
    clinician: str,
    evidence: str,
    sub_labels: list[str] | None = None,
    at: datetime | None = None,
) -> ErrorLabel:
    """A clinician's error label: it wins over rule and grader labels."""
    if not clinician.strip():
        raise ValueError("a clinician override needs the clinician's name")
    when = (at or datetime.now(UTC)).isoformat(timespec="seconds")
    return ErrorLabel(
        category=category,
        sub_labels=sub_labels or [],
        evidence=evidence,
        assigned_by=f"clinician:{clinician.strip()}",
        assigned_at=when,
    )


def effective_error(labels: list[ErrorLabel | None]) -> ErrorLabel | None:
    """The label that counts: the latest clinician's, else the grader's, else the rule's."""
    present = [lab for lab in labels if lab is not None]
    clinicians = [lab for lab in present if lab.assigned_by.startswith("clinician:")]
    if clinicians:
        return max(clinicians, key=lambda lab: lab.assigned_at or "")
    graders = [lab for lab in present if lab.assigned_by.startswith("grader:")]
    return graders[-1] if graders else (present[-1] if present else None)


def error_counts(labels: list[ErrorLabel | None]) -> dict[str, Any]:
    """Counts of primary categories and of sub-labels."""
    cats: dict[str, int] = {}
    subs: dict[str, int] = {}
    for lab in labels:
        if lab is None:
            continue
        cats[lab.category.value] = cats.get(lab.category.value, 0) + 1
        for s in lab.sub_labels:
            subs[s] = subs.get(s, 0) + 1
    return {"categories": cats, "sub_labels": subs}
