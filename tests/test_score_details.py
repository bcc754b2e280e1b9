"""Score details are typed records (issue 36): readers use named fields, stored dicts of any
version read back typed, and nothing a store holds is lost."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from evaluation.scores import (
    CalibrationDetails,
    DiagnosisDetails,
    FieldDetails,
    LesionDetails,
    NoDetails,
    OtherDetails,
    RankDetails,
    RubricDetails,
    Score,
    SequenceDetails,
)
from evaluation.scoring import grader_calibration

# Rows' details_json exactly as the run store holds them today (written by json.dumps of the
# old dicts), with a key no version of ours wrote.
OLD_CALIBRATION = {
    "n": 12,
    "source": "rubric grader",
    "p_value": 0.004,
    "bar": 0.5,
    "ci95": [0.31, 0.91],
    "meets_paper_bar": True,
    "written_by_a_later_version": {"a": 1},
}
OLD_RUBRIC = {
    "prompt_version": "rubric-v4",
    "jury": "median",
    "graders": {
        "g1": {
            "canary": {"mean": 1.2, "passed": True, "max": 2.0},
            "scored": True,
            "counted": True,
            "scores": {"conclusion": 4, "findings": 3},
            "comments": "",
            "error_category": "reasoning",
            "mean": 3.5,
            "grader_latency_s": 1.5,  # unknown, nested
        },
        "g2": {"canary": None, "scored": False, "counted": False, "reply": "", "why": "failed"},
    },
    "raw": {"g1": "{...}", "g2": None},
    "canary_raw": {},
    "n_scored": 1,
    "canary_failed": [],
    "per_dimension": {"conclusion": 4.0, "findings": 3.0},
    "jury_mean": 3.5,
    "alpha": None,
    "error_category": "reasoning",
}


def kept(old: object, new: object) -> bool:
    """Every value of ``old`` is in ``new`` (which may add keys: the kind, absent fields as None)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and kept(v, new[k]) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(old) == len(new) and all(map(kept, old, new))
    return old == new


def stored(scorer: str, details: dict) -> Score:
    """A score as the run store reads a row back (json text -> Score)."""
    return Score(scorer=scorer, value=0.7, explanation="", details=json.loads(json.dumps(details)))


def test_old_calibration_row_reads_back_typed_with_its_ci() -> None:
    s = stored("grader_calibration", OLD_CALIBRATION)
    cal = s.detail_as(CalibrationDetails)
    assert cal is not None
    assert cal.ci95 == (0.31, 0.91) and cal.meets_paper_bar is True and cal.n == 12
    assert s.detail_as(RubricDetails) is None  # another kind's reader gets nothing
    # the unknown key is kept (in extra) and written back where it was
    assert cal.extra == {"written_by_a_later_version": {"a": 1}}
    again = json.loads(json.dumps(s.details))
    assert {k: again[k] for k in OLD_CALIBRATION} == OLD_CALIBRATION
    assert again["kind"] == "calibration" and "extra" not in again
    # and a second round trip (the store's json text -> Score) is stable
    assert stored("grader_calibration", again).detail == s.detail


def test_a_mistyped_key_is_caught_not_read_as_missing() -> None:
    """The old reader's ``details.get("cii95")`` was None: a CI silently never shown."""
    cal = stored("grader_calibration", OLD_CALIBRATION).detail_as(CalibrationDetails)
    assert cal is not None
    with pytest.raises(AttributeError):
        _ = cal.cii95  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="cii95"):  # a writer's typo too
        CalibrationDetails(n=5, source="x", cii95=(0.1, 0.2))  # type: ignore[call-arg]
    with pytest.raises(ValidationError):  # and a value of the wrong type
        CalibrationDetails(n=5, source="x", ci95=("low", "high"))  # type: ignore[arg-type]


def test_calibration_written_now_reads_back_the_same() -> None:
    pairs = [(g, g + (0.3 if i % 2 else -0.2)) for i, g in enumerate([1, 2, 2, 3, 4, 4, 5, 3])]
    s = grader_calibration(pairs)
    cal = s.detail_as(CalibrationDetails)
    assert cal is not None and cal.ci95 is not None and cal.ci95[0] < s.value < cal.ci95[1]  # type: ignore[operator]
    back = Score.model_validate_json(s.model_dump_json())
    assert back == s and json.loads(s.model_dump_json())["details"]["ci95"] == list(cal.ci95)


def test_old_rubric_row_keeps_nested_unknown_keys() -> None:
    s = stored("rubric", OLD_RUBRIC)
    jury = s.detail_as(RubricDetails)
    assert jury is not None and jury.graders["g1"].canary is not None
    assert jury.graders["g1"].canary.passed is True and jury.graders["g1"].scores["findings"] == 3
    assert jury.graders["g1"].extra == {"grader_latency_s": 1.5}
    assert jury.graders["g2"].counted is False and jury.per_dimension == {
        "conclusion": 4.0,
        "findings": 3.0,
    }
    assert kept(OLD_RUBRIC, s.details)


@pytest.mark.parametrize(
    ("scorer", "old", "kind"),
    [
        ("diagnosis_match", {"abstained": True, "truth": "glioblastoma", "confidence": 0.4}, DiagnosisDetails),
        ("differential_rank", {"rank": 2, "length": 3, "ranked": ["a", "b", "c"], "levels": ["none", "exact"], "judge_used": False}, RankDetails),
        ("classification_correct", {"stated": "tumor", "truth": "tumor", "abstained": False, "confidence": 0.9}, FieldDetails),
        ("sequence_recognition", {"stated": "t1", "truth": "t2", "abstained": False}, FieldDetails),
        ("sequence_recognition", {"mode": "set", "misidentified": [{"stated": "DWI"}], "not_named": ["T2"]}, SequenceDetails),
        ("lesion_precision", {}, NoDetails),
        ("a_scorer_from_elsewhere", {"whatever": [1, 2]}, OtherDetails),
    ],
)  # fmt: skip
def test_every_old_shape_reads_as_its_kind(scorer: str, old: dict, kind: type) -> None:
    s = stored(scorer, old)
    assert type(s.detail) is kind
    assert kept(old, s.details)  # nothing lost, nothing changed


def test_old_lesion_row_reads_the_match_typed() -> None:
    match = {
        "findings": [
            {"index": 0, "status": "matched", "read": {"side": "left", "regions": ["frontal"]},
             "lesions": ["L1"]},
        ],
        "lesions": [{"lesion_id": "L1", "status": "detected", "finding": 0}],
        "normal_control": False, "n_positive": 1, "n_matched": 1, "n_hallucinated": 0,
        "n_detected": 1, "n_near": 0, "n_missed": 0, "precision": 1.0, "recall": 1.0, "f1": 1.0,
        "recall_location": 1.0, "hallucination_rate": 0.0, "missed_rate": 0.0,
        "normal_false_positive": None,
    }  # fmt: skip
    s = stored("lesion_f1", {"match": match})
    d = s.detail_as(LesionDetails)
    assert d is not None and d.match.findings[0].read.regions == ["frontal"]
    assert d.match.lesions[0].status == "detected" and d.match.n_redundant == 0
    assert kept({"match": match}, s.details)


def test_a_stored_value_of_another_type_is_kept_untyped_not_refused() -> None:
    old = {"n": "twelve", "source": "rubric grader"}
    s = stored("grader_calibration", old)
    assert isinstance(s.detail, OtherDetails) and s.details == {"kind": "other", **old}
