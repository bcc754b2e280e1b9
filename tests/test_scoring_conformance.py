"""Conformance of the error labels: hand-written answers on phantom-like cases, each with exactly
one known injected error (or none), checked for category, sub-labels and the lesion outcome.

The answers are written as a reviewer would write them: the truth of each case is stated in
``scoring_cases``, the injected error is named in the row. A row fails when the rules give
another category, miss the expected sub-label, or add one the answer does not deserve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from scoring_cases import (
    H,
    answer,
    case,
    f,
    gbm_case,
    ich_case,
    lesion,
    meningioma_case,
    ms_case,
    normal_case,
    stroke_case,
)

from evaluation.answers import Answer
from evaluation.case import Case, DiseaseGroup, Enhancement, TaskFamily
from evaluation.scores import ErrorCategory, LesionDetails, ParseStatus
from evaluation.scoring import make_scored_sample

C = ErrorCategory
VISUAL = {C.PERCEPTUAL, C.GROUNDING, C.VISUAL_HALLUCINATION}


def two_mets_one_lobe() -> Case:
    """Two metastases in the left frontal lobe: one ring-enhancing, one nodular."""
    return case(
        "mets-2",
        "Brain metastases",
        "C79.3",
        DiseaseGroup.TUMOUR,
        [
            lesion("L1", "enhancing metastasis", "left", "frontal", "frontal", Enhancement.RING, T1C=H, FLAIR=H),
            lesion("L2", "enhancing metastasis", "left", "frontal", "frontal", Enhancement.NODULAR, T1C=H, FLAIR=H),
        ],
    )  # fmt: skip


def dementia_case() -> Case:
    """A named disease with no visible lesion: not a normal control."""
    return case("todd-1", "Postictal Todd paresis", "G83.8", DiseaseGroup.OTHER, [])


STROKE_DWI = f("left insula restricted diffusion", sequence="DWI", signal="hyperintense")
GBM_RING = f("right temporal ring-enhancing mass", sequence="T1C", signal="hyperintense", enhancement="ring")  # fmt: skip
ICH_CT = f("right basal ganglia hyperdense haematoma", sequence="CT")
MEN_OK = f("right frontal extra-axial dural-based mass", enhancement="homogeneous", sequence="T1C", signal="hyperintense")  # fmt: skip
MS_FULL = [
    f("bilateral periventricular ovoid FLAIR hyperintense plaques", region="periventricular", hemisphere="bilateral", sequence="FLAIR", signal="hyperintense"),
    f("left frontal juxtacortical T2 hyperintense lesion", sequence="T2", signal="hyperintense"),
    f("right pontine T2 hyperintense lesion", sequence="T2", signal="hyperintense"),
]  # fmt: skip
METS_OK = [
    f("left frontal ring-enhancing lesion", sequence="T1C", signal="hyperintense", enhancement="ring"),
    f("second left frontal lesion with nodular enhancement", sequence="T1C", signal="hyperintense", enhancement="nodular"),
]  # fmt: skip


@dataclass
class Row:
    why: str
    case: Case
    answer: Answer
    category: C | None  # None: fully correct, no label
    subs: set[str] = field(default_factory=set)  # sub-labels that must be present
    absent: set[str] = field(default_factory=set)  # sub-labels that must not be present
    family: TaskFamily = TaskFamily.LESION
    images_shown: int | None = None  # None: every image of the case (full input)
    detected: int | None = None  # lesions that must count as detected
    hallucinated: int | None = None  # findings that must count as hallucinated


ROWS: list[Row] = [
    # ---- no error
    Row("correct stroke", stroke_case(), answer("acute ischaemic stroke", [STROKE_DWI]), None, detected=1, hallucinated=0),
    Row("correct MS, one finding covers both periventricular plaques", ms_case(), answer("multiple sclerosis", MS_FULL), None, detected=4, hallucinated=0),
    Row("correct GBM described on three sequences (restatements)", gbm_case(), answer("glioblastoma", [GBM_RING, f("right temporal FLAIR hyperintense mass", sequence="FLAIR", signal="hyperintense"), f("right temporal lesion, T1 hypointense", sequence="T1", signal="hypointense")]), None, detected=1, hallucinated=0),
    Row("two lesions in one lobe, different enhancement, correctly described", two_mets_one_lobe(), answer("brain metastases", METS_OK), None, detected=2, hallucinated=0),
    Row("two lesions in one lobe, described in the other order", two_mets_one_lobe(), answer("brain metastases", METS_OK[::-1]), None, detected=2, hallucinated=0),
    Row("correct normal control", normal_case(), answer("normal study", [f("No acute intracranial abnormality")]), None, hallucinated=0),
    # ---- wrong diagnosis from another group (findings right)
    Row("stroke findings, MS concluded", stroke_case(), answer("multiple sclerosis", [STROKE_DWI]), C.REASONING, {"wrong_diagnosis"}, {"missed_lesion", "hallucinated_finding"}, TaskFamily.DIFFERENTIAL),
    Row("GBM findings, abscess concluded", gbm_case(), answer("brain abscess", [GBM_RING]), C.REASONING, {"wrong_diagnosis"}, {"missed_lesion"}, TaskFamily.DIFFERENTIAL),
    # ---- lesions omitted
    Row("MS with the pontine plaque omitted", ms_case(), answer("multiple sclerosis", MS_FULL[:2]), C.PERCEPTUAL, {"missed_lesion"}, {"hallucinated_finding"}, detected=3),
    Row("second metastasis omitted", two_mets_one_lobe(), answer("brain metastases", METS_OK[:1]), C.PERCEPTUAL, {"missed_lesion"}, {"inaccurate_description", "hallucinated_finding"}, detected=1),
    # ---- an extra finding on a normal control
    Row("plaque on a normal control", normal_case(), answer("normal study", [f("small left frontal FLAIR hyperintense focus", sequence="FLAIR", signal="hyperintense")]), C.VISUAL_HALLUCINATION, {"hallucinated_finding"}, {"missed_lesion"}, hallucinated=1),
    # ---- an extra finding beside a detected lesion
    Row("infarct mirrored to the other insula as a second lesion", stroke_case(), answer("acute ischaemic stroke", [STROKE_DWI, f("right insula restricted diffusion", sequence="DWI", signal="hyperintense")]), C.VISUAL_HALLUCINATION, {"hallucinated_finding"}, {"localisation_error", "missed_lesion"}, detected=1, hallucinated=1),
    Row("haematoma mirrored to the other basal ganglia", ich_case(), answer("intracerebral haemorrhage", [ICH_CT, f("left basal ganglia hyperdense focus", sequence="CT")]), C.VISUAL_HALLUCINATION, {"hallucinated_finding"}, {"localisation_error"}, detected=1, hallucinated=1),
    Row("second mass in the neighbouring lobe", gbm_case(), answer("glioblastoma", [GBM_RING, f("right parietal ring-enhancing mass", sequence="T1C", signal="hyperintense", enhancement="ring")]), C.VISUAL_HALLUCINATION, {"hallucinated_finding"}, {"localisation_error"}, detected=1, hallucinated=1),
    # ---- hemisphere swapped
    Row("infarct on the wrong side", stroke_case(), answer("acute ischaemic stroke", [f("right insula restricted diffusion", sequence="DWI", signal="hyperintense")]), C.GROUNDING, {"localisation_error"}, {"hallucinated_finding", "missed_lesion"}, detected=0, hallucinated=0),
    Row("meningioma on the wrong side", meningioma_case(), answer("meningioma", [f("left frontal extra-axial dural-based mass", enhancement="homogeneous")]), C.GROUNDING, {"localisation_error"}, {"hallucinated_finding"}, hallucinated=0),
    # ---- contradicting ICD-10
    Row("GBM coded as an infarct", gbm_case(), answer("glioblastoma", [GBM_RING], differential=[("glioblastoma", "I63.9")]), C.KNOWLEDGE_GAP, {"icd10_contradiction"}, {"wrong_diagnosis"}, TaskFamily.DIFFERENTIAL),
    Row("stroke coded as epilepsy", stroke_case(), answer("acute ischaemic stroke", [STROKE_DWI], differential=[("acute ischaemic stroke", "G40.9")]), C.KNOWLEDGE_GAP, {"icd10_contradiction"}, set(), TaskFamily.DIFFERENTIAL),
    # ---- text only: nothing visual can be blamed
    Row("text only: lesions missed, one invented", stroke_case(), answer("acute ischaemic stroke", [f("right occipital FLAIR hyperintense lesion", sequence="FLAIR", signal="hyperintense")]), C.REASONING, {"fabricated_without_images"}, {"missed_lesion", "hallucinated_finding", "localisation_error"}, images_shown=0),
    Row("text only: MS plaques missed, invented mass", ms_case(), answer("multiple sclerosis", [f("left temporal ring-enhancing mass", enhancement="ring")]), C.REASONING, {"fabricated_without_images"}, {"missed_lesion", "hallucinated_finding"}, images_shown=0),
    Row("text only: no findings, right diagnosis", ms_case(), answer("multiple sclerosis", []), None, images_shown=0),
    Row("text only: normal control with an invented plaque", normal_case(), answer("multiple sclerosis", [f("left frontal FLAIR hyperintense plaque")]), C.REASONING, {"fabricated_without_images"}, {"hallucinated_finding"}, images_shown=0),
]  # fmt: skip


def scored(row: Row):  # type: ignore[no-untyped-def]
    return make_scored_sample(
        row.case,
        row.family,
        "hand-written",
        ParseStatus.OK,
        row.answer,
        row.answer.model_dump_json(),
        bertscore=False,
        images_shown=row.images_shown,
    )


@pytest.mark.parametrize("row", ROWS, ids=[r.why for r in ROWS])
def test_one_injected_error_gets_its_label(row: Row) -> None:
    s = scored(row)
    lab = s.error
    if row.category is None:
        assert lab is None, f"{row.why}: {lab.category} {lab.sub_labels} ({lab.evidence})"  # type: ignore[union-attr]
    else:
        assert lab is not None, row.why
        assert lab.category is row.category, f"{row.why}: {lab.category} ({lab.evidence})"
        assert row.subs <= set(lab.sub_labels), (row.why, lab.sub_labels)
        assert not (row.absent & set(lab.sub_labels)), (row.why, lab.sub_labels)
    if row.images_shown == 0 and lab is not None:
        assert lab.category not in VISUAL, row.why
    sc = s.score("lesion_f1")
    if row.detected is not None or row.hallucinated is not None:
        d = sc.details_as(LesionDetails) if sc is not None else None
        assert d is not None, row.why
        res = d.match
        if row.detected is not None:
            assert res.n_detected == row.detected, (row.why, res.lesions)
        if row.hallucinated is not None:
            assert res.n_hallucinated == row.hallucinated, (row.why, res.findings)
            rate = s.value("hallucinated_finding_rate")
            assert (rate or 0) > 0 if row.hallucinated else not rate, (row.why, rate)


def test_every_kind_of_injected_error_is_covered() -> None:
    kinds = {r.category for r in ROWS}
    assert {
        None,
        C.REASONING,
        C.PERCEPTUAL,
        C.VISUAL_HALLUCINATION,
        C.GROUNDING,
        C.KNOWLEDGE_GAP,
    } <= kinds
    assert sum(r.images_shown == 0 for r in ROWS) >= 3


def test_text_only_missed_lesions_do_not_count_against_the_answer() -> None:
    row = Row("x", ms_case(), answer("multiple sclerosis", []), None, images_shown=0)
    s = scored(row)
    for name in ("lesion_recall", "missed_lesion_rate", "lesion_f1"):
        v = s.score(name)
        assert v is not None and v.value is None, (name, v)
        assert "no image" in v.explanation


def test_the_same_answer_with_images_is_perceptual() -> None:
    """The text-only rows are not lenient by accident: shown the images, the same answers
    are visual errors."""
    for row in ROWS:
        if row.images_shown == 0 and row.category is not None:
            lab = scored(Row(row.why, row.case, row.answer, None)).error
            assert lab is not None and lab.category in VISUAL, (row.why, lab)


def test_named_disease_without_lesions_is_not_a_normal_control() -> None:
    from evaluation.scoring.truth import is_normal_control

    assert not is_normal_control(dementia_case().ground_truth)  # type: ignore[arg-type]
    assert is_normal_control(normal_case().ground_truth)  # type: ignore[arg-type]


def test_normal_truth_without_a_group_is_a_normal_control() -> None:
    """A dataset that names the truth "normal" but gives no disease group: calling it normal
    is right, not a missed lesion."""
    c = case("norm-2", "Normal", "Z03.3", DiseaseGroup.NORMAL, [])
    c.ground_truth.final_diagnosis.group = None  # type: ignore[union-attr]
    from evaluation.scoring.truth import is_normal_control

    assert is_normal_control(c.ground_truth)  # type: ignore[arg-type]
    s = make_scored_sample(
        c, TaskFamily.DIFFERENTIAL, "m", ParseStatus.OK, answer("normal study"), "", bertscore=False
    )
    assert s.error is None, s.error


def test_a_text_only_run_labels_invented_findings_as_reasoning_end_to_end(
    phantom_suite,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """Through the engine, a loopback provider and the store: the request's recorded image
    count (none, with ``--ablation text``) decides; the same answer with images is visual; a
    rescore from the store keeps both."""
    import asyncio
    import json
    import os

    from engine_helpers import phantom_subset, server_spec
    from openai_server import OpenAIServer, Script

    from evaluation.datasets import DatasetSpec
    from evaluation.engine import rescore, start_run
    from evaluation.modelio import GenerateConfig
    from evaluation.reports.loader import load_run
    from evaluation.runconfig import RunConfig
    from evaluation.tasks import Ablation

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    data = phantom_subset(phantom_suite, ("stroke",), tmp_path / "data")
    reply = json.dumps(
        {
            "findings": [{"description": "right occipital FLAIR hyperintense lesion", "sequence": "FLAIR", "signal": "hyperintense"}],
            "differential": [{"diagnosis": "acute ischaemic stroke", "likelihood": 0.8}],
            "final_diagnosis": "acute ischaemic stroke",
            "rationale": "sudden deficit",
            "confidence": 0.6,
        }
    )  # fmt: skip
    labels = {}
    with OpenAIServer(Script(default_reply=reply)) as server:
        for ablation in (Ablation.TEXT, Ablation.BOTH):
            run = tmp_path / f"run-{ablation.value}"
            config = RunConfig(
                dataset=DatasetSpec(path=str(data)),
                models=[server_spec(server.url)],
                tasks=[TaskFamily.LESION],
                ablation=ablation,
                generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10),
                bertscore=False,
                cache_dir=str(tmp_path / "cache"),
            )
            asyncio.run(start_run(config, run))
            for attempt in ("run", "rescore"):
                if attempt == "rescore":
                    rescore(run, cache_dir=tmp_path / "cache")
                [s] = [x.scored for x in load_run(run).samples]
                assert s.error is not None
                labels[ablation, attempt] = (
                    s.images_shown,
                    s.error.category,
                    set(s.error.sub_labels),
                )
    for attempt in ("run", "rescore"):
        shown, cat, subs = labels[Ablation.TEXT, attempt]
        assert shown == 0 and cat is C.REASONING, labels
        assert "fabricated_without_images" in subs and "missed_lesion" not in subs, subs
        shown, cat, subs = labels[Ablation.BOTH, attempt]
        assert shown and shown > 0 and cat in VISUAL, labels
        assert {"missed_lesion", "hallucinated_finding"} <= subs, subs
