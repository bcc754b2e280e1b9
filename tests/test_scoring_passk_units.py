"""pass@k units are (model, case, question): two questions of one family are two units, the
question key travels with every scored sample (and rescoring fills it), and a unit left out of
sampled pass@k because a sample went unscored is counted and shown (issue 18)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from scoring_cases import answer, stroke_case

from evaluation.case import TaskFamily
from evaluation.scores import ParseStatus
from evaluation.scoring import ScoredSample, make_scored_sample, summarise

D = TaskFamily.DIFFERENTIAL
CASE = stroke_case()
RIGHT = answer("acute ischaemic stroke", differential=["acute ischaemic stroke"])
WRONG = answer("multiple sclerosis", differential=["multiple sclerosis"])


def _sample(
    task: str, i: int, right: bool | None, failed: ParseStatus = ParseStatus.ERROR
) -> ScoredSample:
    status = failed if right is None else ParseStatus.OK
    parsed = None if right is None else RIGHT if right else WRONG
    return make_scored_sample(
        CASE, D, "m", status, parsed, "", sample_index=i, bertscore=False, task=task
    )


def test_two_questions_of_one_family_are_two_units() -> None:
    samples = [_sample("differential#q1", i, False) for i in range(5)]
    samples += [_sample("differential#q2", i, True) for i in range(5)]
    assert {s.task for s in samples} == {"differential#q1", "differential#q2"}
    row = summarise(samples, ks=(1, 5), n_boot=50).leaderboard[0]
    assert row.sampled_pass_at["5"].value == pytest.approx(0.5)  # units 0 and 1, not 0.996
    assert row.sampled_pass_at["5"].n == 2
    assert row.sampled_pass_at["1"].value == pytest.approx(0.5)


def test_a_unit_with_an_unscored_sample_is_counted_when_left_out() -> None:
    samples = [
        _sample("differential", i, r) for i, r in enumerate([True, None, False, False, False])
    ]
    samples += [_sample("differential#q2", i, True) for i in range(5)]
    row = summarise(samples, ks=(1, 5), n_boot=50).leaderboard[0]
    assert row.sampled_pass_at["5"].n == 1  # only the fully scored unit
    assert row.sampled_pass_left_out == {"1": 0, "5": 1}
    from gateway.cli.console import pass_at_cell

    assert "1 unit left out" in pass_at_cell(row, 5)
    assert "left out" not in pass_at_cell(row, 1)


def test_rescore_fills_the_question_key_of_an_old_run(
    phantom_suite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from engine_helpers import run_phantoms
    from typer.testing import CliRunner

    from gateway.cli import app

    run = run_phantoms(phantom_suite, ("stroke",), ["reference/text-prior"], tmp_path, monkeypatch)
    db = sqlite3.connect(run / "run.sqlite")
    tasks = dict(db.execute("SELECT sample_id, task FROM samples").fetchall())
    stored = {
        sid: json.loads(j)
        for sid, j in db.execute("SELECT sample_id, scored_json FROM scored_samples")
    }
    assert stored and all(stored[sid]["task"] == tasks[sid] for sid in stored)
    for sid, data in stored.items():  # as an old run holds them: no question key
        data.pop("task")
        db.execute(
            "UPDATE scored_samples SET scored_json=? WHERE sample_id=?", (json.dumps(data), sid)
        )
    db.commit()
    out = CliRunner().invoke(app, ["runs", "rescore", str(run)])
    assert out.exit_code == 0, out.output
    after = dict(db.execute("SELECT sample_id, scored_json FROM scored_samples").fetchall())
    db.close()
    assert all(json.loads(after[sid])["task"] == tasks[sid] for sid in stored)


def test_a_unit_with_nothing_to_score_against_is_not_counted_as_left_out() -> None:
    """Found on the real corpus: head-CT slices with no class in image_mapping.csv were shown
    as "left out: unscored" although every answer parsed; only units with an answer that went
    unscored (a failed call; an unusable answer is a wrong sample) are counted."""
    from evaluation.answers import ClassificationAnswer
    from evaluation.case import Case, NeuroVLMLabels, Provenance

    unknown = Case(
        case_id="ct-1",
        provenance=Provenance(source="neurovlm-bench", neurovlm=NeuroVLMLabels(modality="CT")),
    )
    said = ClassificationAnswer(modality="CT", diagnosis_name="normal")
    samples = [
        make_scored_sample(
            unknown,
            TaskFamily.CLASSIFICATION,
            "m",
            ParseStatus.OK,
            said,
            "",
            bertscore=False,
            task="classification",
        )
    ]
    samples += [_sample("differential", 0, None)]  # a failed call: counted
    row = summarise(samples, ks=(1,), n_boot=20).leaderboard[0]
    assert row.sampled_pass_left_out == {"1": 1}
