"""Golden tests: hand-written answers on phantom-like cases, each given the right category."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from scoring_cases import (
    abscess_case,
    answer,
    case,
    f,
    gbm_case,
    ich_case,
    meningioma_case,
    ms_case,
    normal_case,
    stroke_case,
)

from evaluation.answers import ClassificationAnswer
from evaluation.case import Case, DiseaseGroup, TaskFamily
from evaluation.scores import ErrorCategory, ErrorLabel, FlagsDetails, ParseStatus, Score
from evaluation.scoring import (
    classify_error,
    effective_error,
    make_scored_sample,
    override_error,
    score_sample,
    summarise,
)
from evaluation.scoring.rubric import DIMENSIONS, rubric_from_outputs

C = ErrorCategory
MS_ALL = [
    f("periventricular FLAIR hyperintense ovoid lesions", hemisphere="bilateral", region="periventricular", sequence="FLAIR", signal="hyperintense"),
    f("left frontal juxtacortical lesion", sequence="T2", signal="hyperintense"),
    f("pontine T2 hyperintense lesion"),
]  # fmt: skip
STROKE_OK = [f("left insula restricted diffusion", sequence="DWI", signal="hyperintense")]
GBM_OK = [
    f(
        "right temporal ring-enhancing mass",
        sequence="T1C",
        signal="hyperintense",
        enhancement="ring",
    )
]
ABSCESS_OK = [f("left parietal ring-enhancing lesion with restricted diffusion", sequence="DWI")]
ICH_OK = [f("right basal ganglia hyperdense haematoma", sequence="CT")]
MEN_OK = [f("right frontal extra-axial dural-based mass", enhancement="homogeneous")]


def label(
    c: Case,
    parsed: object,
    family: TaskFamily = TaskFamily.LESION,
    status: ParseStatus = ParseStatus.OK,
    text: str = "",
    extra: list[Score] | None = None,
) -> ErrorLabel | None:
    scores = score_sample(c, family, status, parsed, text, bertscore=False)  # type: ignore[arg-type]
    return classify_error(c, family, status, parsed, scores + (extra or []))  # type: ignore[arg-type]


def flair_case(name: str, icd: str, group: DiseaseGroup) -> Case:
    return case("cls-1", name, icd, group, [], series=("FLAIR",))


def cls(**kw: object) -> ClassificationAnswer:
    base: dict[str, object] = {"modality": "MRI", "plane": "axial", "diagnosis_confidence": 0.8}
    return ClassificationAnswer.model_validate(base | kw)


GOLDEN: list[tuple[str, Case, object, TaskFamily, ParseStatus, C, str | None]] = [
    # ---- perceptual
    ("stroke called normal", stroke_case(), answer("Normal study", [f("No acute intracranial abnormality")]), TaskFamily.LESION, ParseStatus.OK, C.PERCEPTUAL, "missed_lesion"),
    ("MS plaques partly missed", ms_case(), answer("multiple sclerosis", MS_ALL[:1]), TaskFamily.LESION, ParseStatus.OK, C.PERCEPTUAL, "missed_lesion"),
    ("GBM enhancement misdescribed", gbm_case(), answer("glioblastoma", [f("right temporal mass", enhancement="homogeneous")]), TaskFamily.LESION, ParseStatus.OK, C.PERCEPTUAL, "inaccurate_description"),
    ("infarct ADC signal reversed", stroke_case(), answer("acute ischaemic stroke", [f("left insula", sequence="ADC", signal="hyperintense")]), TaskFamily.LESION, ParseStatus.OK, C.PERCEPTUAL, "inaccurate_description"),
    ("NeuroVLM stroke called normal", flair_case("Acute ischaemic stroke", "I63.9", DiseaseGroup.ISCHAEMIC_STROKE), cls(diagnosis_name="normal", specialized_sequence="FLAIR"), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.PERCEPTUAL, "missed_lesion"),
    # ---- visual hallucination
    ("plaque on a normal control", normal_case(), answer("multiple sclerosis", [f("left frontal FLAIR hyperintense lesion")]), TaskFamily.LESION, ParseStatus.OK, C.VISUAL_HALLUCINATION, "hallucinated_finding"),
    ("extra bleed beside the real one", ich_case(), answer("intracerebral haemorrhage", [*ICH_OK, f("left cerebellar hyperdense focus", sequence="CT")]), TaskFamily.LESION, ParseStatus.OK, C.VISUAL_HALLUCINATION, "hallucinated_finding"),
    ("second mass beside a meningioma", meningioma_case(), answer("meningioma", [*MEN_OK, f("left occipital ring-enhancing lesion", enhancement="ring")]), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.VISUAL_HALLUCINATION, "hallucinated_finding"),
    ("NeuroVLM tumour on a normal image", flair_case("Normal study", "Z03.3", DiseaseGroup.NORMAL), cls(diagnosis_name="tumor", diagnosis_detailed="glioma", specialized_sequence="FLAIR"), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.VISUAL_HALLUCINATION, "hallucinated_finding"),
    # ---- grounding
    ("infarct on the wrong side", stroke_case(), answer("acute ischaemic stroke", [f("right insula restricted diffusion", sequence="DWI", signal="hyperintense")]), TaskFamily.LESION, ParseStatus.OK, C.GROUNDING, "localisation_error"),
    ("haematoma on a sequence not acquired", ich_case(), answer("intracerebral haemorrhage", [f("right basal ganglia blooming", sequence="SWI", signal="hypointense")]), TaskFamily.LESION, ParseStatus.OK, C.GROUNDING, "sequence_misidentification"),
    ("FLAIR image called T2", ms_case(), answer("multiple sclerosis", MS_ALL, sequences=[("1", "T1"), ("3", "T2"), ("4", "T2")]), TaskFamily.LESION, ParseStatus.OK, C.GROUNDING, "sequence_misidentification"),
    ("GBM placed in the neighbouring lobe", gbm_case(), answer("glioblastoma", [f("right parietal ring-enhancing mass", enhancement="ring")]), TaskFamily.LESION, ParseStatus.OK, C.GROUNDING, "localisation_error"),
    ("NeuroVLM FLAIR called T1", flair_case("Multiple sclerosis", "G35", DiseaseGroup.DEMYELINATING), cls(diagnosis_name="multiple sclerosis", specialized_sequence="T1"), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.GROUNDING, "sequence_misidentification"),
    # ---- knowledge gap
    ("GBM coded as an infarct", gbm_case(), answer("glioblastoma", GBM_OK, differential=[("glioblastoma", "I63.9")]), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.KNOWLEDGE_GAP, "icd10_contradiction"),
    ("MS coded as Alzheimer's", ms_case(), answer("multiple sclerosis", MS_ALL, differential=[("multiple sclerosis", "G30.9"), ("ADEM", "G04.0")]), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.KNOWLEDGE_GAP, "icd10_contradiction"),
    ("abscess mistaken, and the mimic miscoded", abscess_case(), answer("glioblastoma", ABSCESS_OK, differential=[("glioblastoma", "G06.0"), ("brain abscess", "G06.0")]), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.KNOWLEDGE_GAP, "icd10_contradiction"),
    ("NeuroVLM stroke with a glioma subtype", flair_case("Acute ischaemic stroke", "I63.9", DiseaseGroup.ISCHAEMIC_STROKE), cls(diagnosis_name="stroke", diagnosis_detailed="glioma", specialized_sequence="FLAIR"), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.KNOWLEDGE_GAP, "subtype_inconsistent"),
    # ---- reasoning
    ("abscess read as glioblastoma", abscess_case(), answer("glioblastoma", ABSCESS_OK, differential=["glioblastoma", "brain abscess"]), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.REASONING, "truth_in_differential"),
    ("infarct seen, MS concluded", stroke_case(), answer("multiple sclerosis", STROKE_OK), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.REASONING, "wrong_diagnosis"),
    ("GBM underspecified as glioma", gbm_case(), answer("glioma", GBM_OK), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.REASONING, "partial_diagnosis"),
    ("no findings, wrong diagnosis", meningioma_case(), answer("schwannoma"), TaskFamily.DIFFERENTIAL, ParseStatus.OK, C.REASONING, "wrong_diagnosis"),
    ("NeuroVLM tumour called stroke", flair_case("Glioblastoma", "C71.9", DiseaseGroup.TUMOUR), cls(diagnosis_name="stroke", diagnosis_detailed="ischemic", specialized_sequence="FLAIR"), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.REASONING, "wrong_diagnosis"),
    # ---- format failure
    ("no JSON", ms_case(), None, TaskFamily.DIFFERENTIAL, ParseStatus.FORMAT_FAILURE, C.FORMAT_FAILURE, None),
    ("call failed", stroke_case(), None, TaskFamily.LESION, ParseStatus.ERROR, C.FORMAT_FAILURE, "call_error"),
    ("NeuroVLM invalid JSON", flair_case("Multiple sclerosis", "G35", DiseaseGroup.DEMYELINATING), None, TaskFamily.CLASSIFICATION, ParseStatus.FORMAT_FAILURE, C.FORMAT_FAILURE, None),
    # ---- refusal
    ("refused", gbm_case(), None, TaskFamily.DIFFERENTIAL, ParseStatus.REFUSAL, C.REFUSAL, None),
    ("blocked on a lesion task", normal_case(), None, TaskFamily.LESION, ParseStatus.REFUSAL, C.REFUSAL, None),
    ("NeuroVLM abstained", flair_case("Multiple sclerosis", "G35", DiseaseGroup.DEMYELINATING), cls(diagnosis_name=None), TaskFamily.CLASSIFICATION, ParseStatus.OK, C.REFUSAL, "abstention"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("why", "c", "parsed", "family", "status", "category", "sub"),
    GOLDEN,
    ids=[g[0] for g in GOLDEN],
)
def test_golden_answers_get_the_right_category(
    why: str,
    c: Case,
    parsed: object,
    family: TaskFamily,
    status: ParseStatus,
    category: C,
    sub: str | None,
) -> None:
    lab = label(c, parsed, family, status)
    assert lab is not None, why
    assert lab.category is category, f"{why}: {lab.category} ({lab.evidence})"
    assert lab.assigned_by == "rule" and lab.evidence
    if sub:
        assert sub in lab.sub_labels, (why, lab.sub_labels)


def test_at_least_three_golden_answers_per_category() -> None:
    counts = {cat: sum(g[5] is cat for g in GOLDEN) for cat in C}
    assert min(counts.values()) >= 3, counts


@pytest.mark.parametrize(
    ("c", "parsed"),
    [
        (ms_case(), answer("multiple sclerosis", MS_ALL)),
        (stroke_case(), answer("Acute ischemic stroke, left MCA", STROKE_OK)),
        (normal_case(), answer("Normal study", [f("No acute intracranial abnormality")])),
        (
            abscess_case(),
            answer("pyogenic brain abscess", ABSCESS_OK, differential=[("brain abscess", "G06.0")]),
        ),
    ],
)
def test_fully_correct_answers_get_no_label(c: Case, parsed: object) -> None:
    assert label(c, parsed) is None


def test_evidence_names_the_missed_lesion() -> None:
    lab = label(ms_case(), answer("multiple sclerosis", MS_ALL[:1]))
    assert (
        lab is not None
        and "lesion L3 missed" in lab.evidence
        and "lesion L4 missed" in lab.evidence
    )


def _rubric(category: str) -> Score:
    import json

    from evaluation.scoring.rubric import verdict_nonce

    verdict = {d: 2 for d in DIMENSIONS} | {
        "comments": "c",
        "error_category": category,
        "verdict_nonce": verdict_nonce("answer"),
    }
    return rubric_from_outputs({"judge-model": json.dumps(verdict)}, "answer")


def test_grader_refines_only_where_the_rules_lack_lesion_evidence() -> None:
    # no findings reported: the rules cannot separate perception from reasoning
    refined = label(
        meningioma_case(),
        answer("schwannoma"),
        TaskFamily.DIFFERENTIAL,
        extra=[_rubric("perceptual")],
    )
    assert refined is not None and refined.category is C.PERCEPTUAL
    assert refined.assigned_by == "grader:judge-model"
    # with lesion evidence, the rule stands
    kept = label(
        abscess_case(),
        answer("glioblastoma", ABSCESS_OK),
        TaskFamily.DIFFERENTIAL,
        extra=[_rubric("perceptual")],
    )
    assert kept is not None and kept.category is C.REASONING and kept.assigned_by == "rule"


def test_clinician_override_wins_and_records_who_and_when() -> None:
    rule = label(abscess_case(), answer("glioblastoma", ABSCESS_OK))
    first = override_error(
        category=C.KNOWLEDGE_GAP,
        clinician="Dr A",
        evidence="x",
        at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    later = override_error(
        category=C.PERCEPTUAL,
        clinician="Dr B",
        evidence="missed DWI",
        at=datetime(2025, 2, 1, tzinfo=UTC),
    )
    chosen = effective_error([rule, later, first])
    assert chosen is later
    assert (
        chosen.assigned_by == "clinician:Dr B" and chosen.assigned_at == "2025-02-01T00:00:00+00:00"
    )
    with pytest.raises(ValueError, match="clinician"):
        override_error(category=C.REASONING, clinician=" ", evidence="")


def test_neurovlm_subtype_inconsistent_with_the_class_is_named_apart_from_icd10() -> None:
    stroke = flair_case("Acute ischaemic stroke", "I63.9", DiseaseGroup.ISCHAEMIC_STROKE)
    family, ok = TaskFamily.CLASSIFICATION, ParseStatus.OK

    def flags_and_label(**kw: object) -> tuple[list[str], ErrorLabel | None]:
        ans = cls(diagnosis_name="stroke", specialized_sequence="FLAIR", **kw)
        text = ans.model_dump_json()  # every field present: no missing_fields flag
        scores = score_sample(stroke, family, ok, ans, text, bertscore=False)
        raised = next(s for s in scores if s.scorer == "safety_flags").details_as(FlagsDetails)
        assert raised is not None
        return raised.flags, classify_error(stroke, family, ok, ans, scores)

    right, none = flags_and_label(diagnosis_detailed="ischemic", icd10_code="I63.9")
    assert right == [] and none is None
    glioma, lab = flags_and_label(diagnosis_detailed="glioma", icd10_code="I63.9")
    assert glioma == ["subtype_inconsistent:stroke/glioma"]
    assert lab is not None and lab.category is C.KNOWLEDGE_GAP
    assert "subtype_inconsistent" in lab.sub_labels and "icd10_contradiction" not in lab.sub_labels
    coded, lab = flags_and_label(diagnosis_detailed="ischemic", icd10_code="C71.9")
    assert coded == ["icd10_contradicts_class:C71.9/stroke"]
    assert lab is not None and lab.category is C.KNOWLEDGE_GAP
    assert "icd10_contradiction" in lab.sub_labels and "subtype_inconsistent" not in lab.sub_labels
    # The run summary counts the flag under its own name, and the sub-label too.
    samples = [
        make_scored_sample(stroke, family, "A", ok, a, a.model_dump_json(), bertscore=False)
        for a in (
            cls(diagnosis_name="stroke", diagnosis_detailed="glioma", specialized_sequence="FLAIR"),
            cls(
                diagnosis_name="stroke", diagnosis_detailed="ischemic", specialized_sequence="FLAIR"
            ),
        )
    ]
    summ = summarise(samples, n_boot=100)
    assert summ.neurovlm["A"].safety_flags == {"subtype_inconsistent": 1}
    subs = summ.errors["A"]["sub_labels"]
    assert subs["subtype_inconsistent"] == 1 and "icd10_contradiction" not in subs
    assert summ.errors["A"]["categories"] == {"knowledge_gap": 1}
