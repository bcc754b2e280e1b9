"""Run summaries and paired comparison on a small hand-built run, checked by hand."""

from __future__ import annotations

import pytest
from scoring_cases import (
    abscess_case,
    answer,
    case,
    f,
    gbm_case,
    ich_case,
    ms_case,
    normal_case,
    stroke_case,
)

from evaluation.answers import ClassificationAnswer
from evaluation.case import DiseaseGroup, TaskFamily
from evaluation.modelio import ModelOutput
from evaluation.scores import ParseStatus
from evaluation.scoring import ScoredSample, compare, make_scored_sample, summarise
from evaluation.scoring.lesions import match_lesions
from evaluation.scoring.stats import wilson

D = TaskFamily.DIFFERENTIAL
RIGHT = {
    "ms-1": answer("multiple sclerosis", differential=["multiple sclerosis", "ADEM"]),
    "stroke-1": answer("acute ischaemic stroke", differential=["acute ischaemic stroke"]),
    "gbm-1": answer("glioblastoma", differential=["glioblastoma", "brain abscess"]),
    "abscess-1": answer("brain abscess", differential=["brain abscess", "glioblastoma"]),
}
WRONG = {
    "ms-1": answer("ADEM", differential=["ADEM", "multiple sclerosis"]),
    "stroke-1": answer("multiple sclerosis", differential=["multiple sclerosis"]),
    "gbm-1": answer("glioma", differential=["glioma", "glioblastoma"]),
    "abscess-1": answer("glioblastoma", differential=["glioblastoma", "brain abscess"]),
}
CASES = {c.case_id: c for c in (ms_case(), stroke_case(), gbm_case(), abscess_case())}


def sample(model: str, cid: str, i: int, right: bool | None) -> ScoredSample:
    status = ParseStatus.FORMAT_FAILURE if right is None else ParseStatus.OK
    parsed = None if right is None else (RIGHT if right else WRONG)[cid]
    out = ModelOutput(prompt_tokens=100, completion_tokens=50 + i, cost_usd=0.01, latency_s=1.0 + i)
    return make_scored_sample(
        CASES[cid], D, model, status, parsed, "", sample_index=i, output=out, bertscore=False
    )


@pytest.fixture(scope="module")
def run() -> list[ScoredSample]:
    plan = {
        "A": {
            "ms-1": [1] * 5,
            "stroke-1": [0, 0, 0, 0, 1],
            "gbm-1": [0] * 5,
            "abscess-1": [None, 0, 0, 0, 0],
        },
        "B": {"ms-1": [1] * 5, "stroke-1": [1] * 5, "gbm-1": [1] * 5, "abscess-1": [0] * 5},
    }
    return [
        sample(m, cid, i, None if r is None else bool(r))
        for m, cases in plan.items()
        for cid, rs in cases.items()
        for i, r in enumerate(rs)
    ]


def test_leaderboard_pass_at_k_both_kinds(run: list[ScoredSample]) -> None:
    s = summarise(run, n_boot=500)
    a = next(r for r in s.leaderboard if r.model == "A")
    # sampled: per unit c/n -> 1, 0.2, 0, 0 (abscess: 0 of 4 scored) -> 0.3
    assert a.sampled_pass_at["1"].value == pytest.approx(0.3)
    # pass@5: ms 1, stroke 1, gbm 0, abscess 0 (its format failure is a wrong sample) -> 1/2
    assert a.sampled_pass_at["5"].value == pytest.approx(1 / 2)
    assert a.sampled_pass_at["5"].n == 4
    # ranked: truth first in 6 of 20 answers (ms x5, stroke x1); in the top 5 in all but the
    # stroke answers that say only "multiple sclerosis" (4) and the format failure
    assert a.ranked_pass_at["1"].value == pytest.approx(6 / 20)
    assert a.ranked_pass_at["5"].value == pytest.approx(15 / 20)
    assert (a.n_samples, a.n_scored, a.format_failures) == (20, 19, 1)
    assert a.accuracy.value == pytest.approx(6 / 19)
    assert a.strict_accuracy.value == pytest.approx(6 / 20)
    assert a.accuracy.low is not None and a.accuracy.low <= a.accuracy.value <= a.accuracy.high  # type: ignore[operator]
    assert a.cost.cost_total_usd == pytest.approx(0.2) and a.cost.latency_median_s == 3.0
    assert s.format_failures["A"]["format_failure"] == 1


def test_breakdowns_and_error_distribution(run: list[ScoredSample]) -> None:
    s = summarise(run, n_boot=200)
    b_tumour = next(
        r
        for r in s.breakdowns
        if r.model == "B" and r.dimension == "disease_group" and r.key == "tumour"
    )
    assert b_tumour.accuracy.value == 1.0 and b_tumour.n_samples == 5
    assert {r.dimension for r in s.breakdowns} == {
        "family",
        "disease_group",
        "difficulty",
        "modality",
    }
    errors = s.errors["A"]["categories"]
    assert errors["format_failure"] == 1
    assert errors["reasoning"] == 4 + 5 + 4  # stroke wrong x4, gbm partial x5, abscess x4
    assert s.errors["A"]["sub_labels"]["partial_diagnosis"] == 5


def test_compare_two_models_on_the_same_cases(run: list[ScoredSample]) -> None:
    cmp = compare(run, "A", "B", n_boot=500)
    # first scored samples: ms both right; stroke, gbm B only; abscess both wrong
    assert (cmp.both_right, cmp.a_only, cmp.b_only, cmp.both_wrong) == (1, 0, 2, 1)
    assert cmp.mcnemar.exact and cmp.mcnemar.p_value == pytest.approx(0.5)
    assert cmp.accuracy_a == pytest.approx((1 + 0.2 + 0 + 0) / 4)
    assert cmp.bootstrap.difference.value == pytest.approx(0.3 - 0.75)
    with pytest.raises(ValueError, match="share no"):
        compare(run, "A", "nobody")


def test_neurovlm_metrics_by_hand() -> None:
    cases = [
        case(
            "c1",
            "Acute ischaemic stroke",
            "I63.9",
            DiseaseGroup.ISCHAEMIC_STROKE,
            [],
            series=("FLAIR",),
        ),
        case(
            "c2",
            "Acute ischaemic stroke",
            "I63.9",
            DiseaseGroup.ISCHAEMIC_STROKE,
            [],
            series=("FLAIR",),
        ),
        case("c3", "Glioblastoma", "C71.9", DiseaseGroup.TUMOUR, [], series=("FLAIR",)),
        case("c4", "Normal study", "Z03.3", DiseaseGroup.NORMAL, [], series=("FLAIR",)),
        case("c5", "Normal study", "Z03.3", DiseaseGroup.NORMAL, [], series=("FLAIR",)),
    ]
    preds = [("stroke", 0.9), ("normal", 0.6), ("tumor", 0.8), (None, None)]
    samples = [
        make_scored_sample(
            c, TaskFamily.CLASSIFICATION, "A", ParseStatus.OK,
            ClassificationAnswer(diagnosis_name=p, diagnosis_confidence=conf, icd10_code="I63.9" if i == 3 else None),  # type: ignore[arg-type]
            "{}",
        )
        for i, (c, (p, conf)) in enumerate(zip(cases, preds, strict=False))
    ]  # fmt: skip
    samples.append(
        make_scored_sample(
            cases[4], TaskFamily.CLASSIFICATION, "A", ParseStatus.FORMAT_FAILURE, None, "oops"
        )
    )
    m = summarise(samples, n_boot=200).neurovlm["A"]
    assert m.n == 4
    assert m.accuracy.value == pytest.approx(0.5)  # the abstention counts as wrong
    assert m.accuracy_answered == pytest.approx(2 / 3) and m.abstention_rate == 0.25
    assert m.per_class["stroke"].recall == 0.5 and m.per_class["normal"].precision == 0.0
    assert m.macro_f1.value == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert m.balanced_accuracy.value == pytest.approx(0.5)
    assert m.ece == pytest.approx(0.3)  # (|1-.9| + |0-.6| + |1-.8|) / 3
    assert m.brier == pytest.approx((0.01 + 0.36 + 0.04) / 3)
    assert m.json_validity is not None and m.json_validity.value == pytest.approx(4 / 5)
    assert m.safety_flags["icd10_on_normal_image"] == 1
    assert m.safety_flags["missing_fields"] == 4


def test_scored_sample_round_trips_as_json(run: list[ScoredSample]) -> None:
    s = run[0]
    assert ScoredSample.model_validate_json(s.model_dump_json()) == s
    assert s.ranked_differential == ["multiple sclerosis", "ADEM"]
    assert s.patient_id == "p-ms-1" and s.modality == "MRI"


def test_unscored_sample_scores_are_none_never_zero() -> None:
    s = sample("A", "ms-1", 0, None)
    assert s.scores and all(sc.value is None for sc in s.scores)
    assert s.error is not None and s.error.category.value == "format_failure"


def test_run_level_lesion_rates_pool_findings_and_lesions_over_samples() -> None:
    normal_2 = normal_case().model_copy(update={"case_id": "normal-2", "patient_id": "p-n2"})
    plan = [
        # 1 positive finding, matched; 4 lesions, 1 detected, 3 missed
        (ms_case(), [f("left periventricular white matter lesion", sequence="FLAIR", signal="hyperintense")]),
        # 3 positive: the haematoma and 2 bleeds that are not there; 1 lesion, detected
        (ich_case(), [f("right basal ganglia hyperdense haematoma", sequence="CT"), f("left cerebellar hyperdense focus", sequence="CT"), f("left frontal hyperdense focus", sequence="CT")]),
        # a normal control with 2 positive findings, both hallucinated: a false positive
        (normal_case(), [f("small left frontal FLAIR hyperintensity"), f("mass effect")]),
        # a normal control called clean: not a false positive, no positive finding
        (normal_2, [f("No acute intracranial abnormality.")]),
        # the infarct on the wrong side: a near match, neither detected, missed nor hallucinated
        (stroke_case(), [f("restricted diffusion", hemisphere="right", region="insula", sequence="DWI", signal="hyperintense")]),
    ]  # fmt: skip
    per = [match_lesions(c, fs) for c, fs in plan]
    counts = [
        (r.n_positive, r.n_matched, r.n_hallucinated, len(r.lesions), r.n_detected, r.n_missed)
        for r in per
        if r is not None
    ]
    assert counts == [(1, 1, 0, 4, 1, 3), (3, 1, 2, 1, 1, 0), (2, 0, 2, 0, 0, 0),
                      (0, 0, 0, 0, 0, 0), (1, 0, 0, 1, 0, 0)]  # fmt: skip
    samples = [
        make_scored_sample(c, TaskFamily.LESION, "A", ParseStatus.OK, answer("x", fs), "",
                           bertscore=False)
        for c, fs in plan
    ]  # fmt: skip
    # A differential answer hallucinating on the clean control: not a lesion-task sample, so
    # it must not enter the lesion rates.
    samples.append(
        make_scored_sample(normal_2, D, "A", ParseStatus.OK,
                           answer("multiple sclerosis", [f("left frontal FLAIR hyperintense lesion")]),
                           "", bertscore=False)
    )  # fmt: skip
    lesions = summarise(samples, n_boot=200).leaderboard[0].lesions
    assert lesions is not None and lesions.n_samples == 5
    # pooled: 7 positive findings, 2 matched, 4 hallucinated; 6 lesions, 2 detected, 3 missed
    assert lesions.precision == pytest.approx(2 / 7)
    assert lesions.recall == pytest.approx(2 / 6)
    assert lesions.hallucinated_finding_rate == pytest.approx(4 / 7)
    assert lesions.missed_lesion_rate == pytest.approx(3 / 6)
    nfp = lesions.normal_control_false_positive
    assert nfp is not None and (nfp.value, nfp.n) == (0.5, 2)  # 1 of 2 normal controls
    assert (nfp.low, nfp.high) == (wilson(1, 2).low, wilson(1, 2).high)
