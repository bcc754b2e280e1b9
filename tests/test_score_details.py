"""Score details are typed records (issue 36): readers use named fields, stored dicts of any
version read back typed, and nothing a store holds is lost."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

from evaluation.log import open_store, store_file
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


def as_json(s: Score) -> dict:
    """The details' JSON, as the run store writes them (the record's own dump)."""
    out = json.loads(s.details.model_dump_json())
    assert out == s.model_dump(mode="json")["details"]
    return out


def test_old_calibration_row_reads_back_typed_with_its_ci() -> None:
    s = stored("grader_calibration", OLD_CALIBRATION)
    cal = s.details_as(CalibrationDetails)
    assert cal is not None
    assert cal.ci95 == (0.31, 0.91) and cal.meets_paper_bar is True and cal.n == 12
    assert s.details_as(RubricDetails) is None  # another kind's reader gets nothing
    # the unknown key is kept (in extra) and written back where it was
    assert cal.extra == {"written_by_a_later_version": {"a": 1}}
    again = as_json(s)
    assert {k: again[k] for k in OLD_CALIBRATION} == OLD_CALIBRATION
    assert again["kind"] == "calibration" and "extra" not in again
    # and a second round trip (the store's json text -> Score) is stable
    assert stored("grader_calibration", again).details == s.details


def test_a_mistyped_key_is_caught_not_read_as_missing() -> None:
    """The old reader's ``details.get("cii95")`` was None: a CI silently never shown."""
    cal = stored("grader_calibration", OLD_CALIBRATION).details_as(CalibrationDetails)
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
    cal = s.details_as(CalibrationDetails)
    assert cal is not None and cal.ci95 is not None and cal.ci95[0] < s.value < cal.ci95[1]  # type: ignore[operator]
    back = Score.model_validate_json(s.model_dump_json())
    assert back == s and json.loads(s.model_dump_json())["details"]["ci95"] == list(cal.ci95)


def test_old_rubric_row_keeps_nested_unknown_keys() -> None:
    s = stored("rubric", OLD_RUBRIC)
    jury = s.details_as(RubricDetails)
    assert jury is not None and jury.graders["g1"].canary is not None
    assert jury.graders["g1"].canary.passed is True and jury.graders["g1"].scores["findings"] == 3
    assert jury.graders["g1"].extra == {"grader_latency_s": 1.5}
    assert jury.graders["g2"].counted is False and jury.per_dimension == {
        "conclusion": 4.0,
        "findings": 3.0,
    }
    assert kept(OLD_RUBRIC, as_json(s))


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
    assert type(s.details) is kind
    assert kept(old, as_json(s))  # nothing lost, nothing changed


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
    d = s.details_as(LesionDetails)
    assert d is not None and d.match.findings[0].read.regions == ["frontal"]
    assert d.match.lesions[0].status == "detected" and d.match.n_redundant == 0
    assert kept({"match": match}, as_json(s))


def test_a_stored_value_of_another_type_is_kept_untyped_not_refused() -> None:
    old = {"n": "twelve", "source": "rubric grader"}
    s = stored("grader_calibration", old)
    assert isinstance(s.details, OtherDetails) and as_json(s) == {"kind": "other", **old}


def test_the_score_has_one_details_name_and_it_is_the_record() -> None:
    """No dict view beside the record: ``details`` is the typed record (the JSON key too)."""
    s = stored("grader_calibration", OLD_CALIBRATION)
    assert isinstance(s.details, CalibrationDetails)
    assert not hasattr(s, "detail") and not hasattr(s, "detail_as")
    with pytest.raises(TypeError):
        _ = s.details["ci95"]  # type: ignore[index]


def _details_json(run: Path) -> dict[str, str]:
    with sqlite3.connect(store_file(run)) as db:
        return dict(db.execute("SELECT scorer, details_json FROM scores").fetchall())


def test_the_store_writes_the_record_and_reads_old_rows_typed(tmp_path: Path) -> None:
    """The run store writes each score's details from its record (``kind`` and all), reads
    them back equal; a row an older version wrote (no kind, an unknown key) reads typed and
    is written back, when the sample is scored again, in the new shape with nothing lost."""
    run = tmp_path / "run"
    pairs = [(g, g + (0.3 if i % 2 else -0.2)) for i, g in enumerate([1, 2, 2, 3, 4, 4, 5, 3])]
    new = [grader_calibration(pairs), stored("rubric", OLD_RUBRIC)]
    with open_store(run, create=True) as store:
        store.init_run(
            "r1", {}, dataset_name="d", dataset_kind="manifest", dataset_hash="0" * 64,
            prompt_version="1", code_version="test", packages={},
        )  # fmt: skip
        sid = store.record_sample(
            case_id="c1", task="differential", family="differential", model="m", sample=0,
            status="ok", turns=[], parsed=None, parse_error=None, image_hashes=[],
        )  # fmt: skip
        store.record_scores(sid, new, None)
        assert store.scores()[sid] == sorted(new, key=lambda s: s.scorer)
    raw = {k: json.loads(v) for k, v in _details_json(run).items()}
    assert raw["grader_calibration"] == as_json(new[0]) and raw["rubric"]["kind"] == "rubric"

    with sqlite3.connect(store_file(run)) as db:  # as a version before the records wrote it
        db.execute(
            "UPDATE scores SET details_json = ? WHERE scorer = 'grader_calibration'",
            (json.dumps(OLD_CALIBRATION),),
        )
    with open_store(run) as store:
        [old] = [s for s in store.scores()[sid] if s.scorer == "grader_calibration"]
        cal = old.details_as(CalibrationDetails)
        assert cal is not None and cal.ci95 == (0.31, 0.91) and cal.meets_paper_bar is True
        store.record_scores(sid, store.scores()[sid], None)  # scored again (rescore)
        again = {s.scorer: s for s in store.scores()[sid]}
    rewritten = json.loads(_details_json(run)["grader_calibration"])
    assert rewritten["kind"] == "calibration" and kept(OLD_CALIBRATION, rewritten)
    assert again["grader_calibration"].details == cal
