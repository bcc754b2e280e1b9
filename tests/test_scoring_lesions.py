"""Lesion matching on phantom-like cases, and sequence/modality/plane recognition."""

from __future__ import annotations

import pytest
from scoring_cases import (
    answer,
    f,
    gbm_case,
    ich_case,
    meningioma_case,
    ms_case,
    normal_case,
    stroke_case,
)

from evaluation.scores import SequenceDetails
from evaluation.scoring.lesions import match_lesions
from evaluation.scoring.recognition import recognition_scores


def test_ms_all_lesions_found_with_region_synonyms() -> None:
    res = match_lesions(
        ms_case(),
        [
            f("Bilateral periventricular FLAIR hyperintense ovoid lesions", hemisphere="bilateral", region="PVWM", sequence="FLAIR", signal="hyperintense"),
            f("juxtacortical lesion", hemisphere="left", region="left frontal lobe", sequence="T2", signal="bright"),
            f("Hyperintense focus in the pons on T2-FLAIR"),
        ],
    )  # fmt: skip
    assert res is not None
    assert {o.lesion_id: o.status for o in res.lesions} == dict.fromkeys(
        ("L1", "L2", "L3", "L4"), "detected"
    )
    assert res.findings[0].lesions == ["L1", "L2"]  # one finding covers both sides
    assert (res.precision, res.recall, res.f1) == (1.0, 1.0, 1.0)
    assert res.hallucination_rate == 0.0 and res.missed_rate == 0.0


def test_partial_detection_gives_recall_and_missed_rate() -> None:
    res = match_lesions(
        ms_case(),
        [f("left periventricular white matter lesion", sequence="FLAIR", signal="hyperintense")],
    )
    assert res is not None
    assert res.recall == 0.25 and res.precision == 1.0
    assert res.f1 == pytest.approx(0.4)
    assert res.n_missed == 3 and res.missed_rate == 0.75


def test_wrong_side_is_a_near_match_not_a_hallucination() -> None:
    res = match_lesions(
        stroke_case(),
        [
            f(
                "restricted diffusion",
                hemisphere="right",
                region="insula",
                sequence="DWI",
                signal="hyperintense",
            )
        ],
    )
    assert res is not None
    assert res.findings[0].status == "near"
    assert res.lesions[0].status == "near" and res.lesions[0].near_kinds == ["wrong_side"]
    assert res.recall == 0.0 and res.n_missed == 0 and res.n_hallucinated == 0


def test_adjacent_region_same_side_is_a_near_match() -> None:
    res = match_lesions(
        stroke_case(),
        [
            f(
                "DWI bright lesion in the left lentiform nucleus",
                sequence="DWI",
                signal="hyperintense",
            )
        ],
    )
    assert res is not None
    assert res.lesions[0].near_kinds == ["adjacent_region"]


def test_adjacent_region_with_contradicting_attributes_is_hallucinated() -> None:
    res = match_lesions(
        ms_case(),
        [f("ring-enhancing mass", hemisphere="right", region="occipital lobe", enhancement="ring")],
    )
    assert res is not None
    assert res.findings[0].status == "hallucinated" and res.hallucination_rate == 1.0


def test_claimed_on_a_sequence_where_the_lesion_is_invisible() -> None:
    # the hyperacute infarct is isointense on FLAIR
    res = match_lesions(
        stroke_case(), [f("left insular cortex", sequence="FLAIR", signal="hyperintense")]
    )
    assert res is not None
    assert res.lesions[0].near_kinds == ["wrong_sequence"]
    assert res.recall == 0.0 and res.recall_location == 1.0


def test_claimed_on_a_sequence_the_case_does_not_have() -> None:
    res = match_lesions(
        ich_case(), [f("right basal ganglia blooming", sequence="SWI", signal="hypointense")]
    )
    assert res is not None
    assert res.lesions[0].near_kinds == ["wrong_sequence"]


def test_wrong_signal_on_a_visible_sequence() -> None:
    res = match_lesions(stroke_case(), [f("left insula", sequence="ADC", signal="hyperintense")])
    assert res is not None
    assert res.lesions[0].near_kinds == ["wrong_signal"]
    restricted = match_lesions(
        stroke_case(), [f("left insula restricted diffusion", sequence="ADC")]
    )
    assert restricted is not None and restricted.lesions[0].status == "detected"


def test_ct_density_matches_by_side_and_region() -> None:
    res = match_lesions(ich_case(), [f("Right putaminal hyperdense haematoma", sequence="CT")])
    assert res is not None and res.recall == 1.0 and res.precision == 1.0


def test_enhancement_pattern_is_a_description_error_on_a_matched_lesion() -> None:
    res = match_lesions(
        meningioma_case(),
        [f("right frontal convexity dural-based mass", enhancement="ring enhancement")],
    )
    assert res is not None
    assert res.lesions[0].status == "detected"
    assert res.lesions[0].description_errors == ["enhancement stated ring, truth homogeneous"]


def test_unlocalised_findings() -> None:
    res = match_lesions(
        gbm_case(), [f("ring-enhancing lesion with central necrosis"), f("mass effect")]
    )
    assert res is not None
    assert res.lesions[0].near_kinds == ["unlocalised"]
    assert [m.status for m in res.findings] == ["near", "unlocalised"]
    assert res.n_hallucinated == 0 and res.precision == 0.0


def test_normal_control_false_positive_and_negative_statements() -> None:
    clean = match_lesions(
        normal_case(), [f("No acute intracranial abnormality."), f("normal ventricles")]
    )
    assert clean is not None
    assert clean.normal_false_positive is False and clean.n_positive == 0
    fp = match_lesions(
        normal_case(), [f("small left frontal FLAIR hyperintensity"), f("mass effect")]
    )
    assert fp is not None
    assert fp.normal_false_positive is True and fp.n_hallucinated == 2 and fp.precision == 0.0


def test_no_lesion_truth_is_unscored() -> None:
    c = ms_case()
    assert c.ground_truth is not None
    c.ground_truth.lesions = []  # an abnormal case without a lesion list (Neural-MedBench)
    assert match_lesions(c, [f("left frontal lesion")]) is None


def test_sequence_recognition_per_image_and_by_set() -> None:
    c = ms_case()  # images: T1, T1C, T2, FLAIR, DWI, ADC, SWI (1-based numbers)
    per_image = answer(
        "MS",
        sequences=[("Image 1", "T1-weighted axial"), ("2", "T1 post-gadolinium"), ("3", "FLAIR")],
    )
    scores = {s.scorer: s for s in recognition_scores(c, per_image)}
    assert scores["sequence_recognition"].value == pytest.approx(2 / 3)
    seqs = scores["sequence_recognition"].details_as(SequenceDetails)
    assert seqs is not None and seqs.mode == "per_image" and seqs.misidentified[0].header == "T2"
    assert scores["modality_accuracy"].value == 1.0
    assert scores["plane_accuracy"].value == 1.0
    by_label = answer("MS", sequences=[("FLAIR axial, z=+30 mm", "T2 FLAIR")])
    assert {s.scorer: s for s in recognition_scores(c, by_label)}[
        "sequence_recognition"
    ].value == 1.0
    as_set = answer(
        "MS", sequences=[(None, s) for s in ("T1", "T1C", "T2", "FLAIR", "DWI", "ADC", "CT")]
    )  # type: ignore[misc]
    s = {x.scorer: x for x in recognition_scores(c, as_set)}
    seqs = s["sequence_recognition"].details_as(SequenceDetails)
    assert seqs is not None and seqs.mode == "set"
    assert s["sequence_recognition"].value == pytest.approx(6 / 8)  # CT named, SWI not
    assert s["modality_accuracy"].value == 0.0
    none = {x.scorer: x for x in recognition_scores(c, answer("MS"))}
    assert none["sequence_recognition"].value is None


def test_a_finding_at_one_lesions_place_is_never_the_misplaced_report_of_another() -> None:
    """Left insula infarct described exactly, plus a lobe-level restatement; a second infarct on
    the right is not reported: it is missed, not 'found on the wrong side' through the finding
    that describes the left one."""
    from scoring_cases import H, L, case, lesion

    from evaluation.case import DiseaseGroup

    c = case(
        "stroke-2",
        "Acute ischaemic stroke",
        "I63.5",
        DiseaseGroup.ISCHAEMIC_STROKE,
        [
            lesion("L1", "acute infarct", "left", "insula", "temporal", DWI=H, ADC=L),
            lesion("L2", "acute infarct", "right", "insula", "temporal", DWI=H, ADC=L),
        ],
    )
    res = match_lesions(
        c,
        [
            f("left insula restricted diffusion", sequence="DWI", signal="hyperintense"),
            f("left temporal lobe DWI bright area", sequence="DWI", signal="hyperintense"),
        ],
    )
    assert res is not None
    status = {o.lesion_id: o.status for o in res.lesions}
    assert status == {"L1": "detected", "L2": "missed"}, res.lesions
    assert [m.status for m in res.findings] == ["matched", "redundant"]


def test_the_best_finding_is_the_one_with_the_right_signal_not_the_right_size() -> None:
    """A 30 mm haematoma reported twice at its place: hyperdense but said to be 6 mm, and
    hypodense (the oedema) at 25 mm. The hyperdense finding is the lesion (its size is the
    description error); the hypodense one is a contradicting restatement."""
    from scoring_cases import ich_case

    c = ich_case()
    c.ground_truth.lesions[0].size_mm = 30.0  # type: ignore[union-attr]
    res = match_lesions(
        c,
        [
            f("right basal ganglia hypodense area", sequence="CT", size_mm=25),
            f("right basal ganglia hyperdense focus", sequence="CT", size_mm=6),
        ],
    )
    assert res is not None
    [o] = res.lesions
    assert o.status == "detected" and o.finding == 1, o
    assert any(e.startswith("size stated 6 mm") for e in o.description_errors), o
    assert [m.status for m in res.findings] == ["redundant", "matched"]
