"""Scoring over whole runs, through the engine, the store and `neurosandbox runs`: grader
calibration against clinician ratings, and the paired comparison of two models."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import server_spec, write_nmb
from grader_helpers import grader_responder
from openai_server import OpenAIServer, Script
from scipy import stats as st
from typer.testing import CliRunner

from evaluation.datasets import DatasetSpec
from evaluation.engine import start_run
from evaluation.log.store import RunStore
from evaluation.modelio import GenerateConfig
from evaluation.reports.checklist import answer_key
from evaluation.reports.loader import load_run
from evaluation.review.agreement import review_stats
from evaluation.review.review_log import Action, ReviewEvent, ReviewStore
from evaluation.runconfig import RunConfig
from evaluation.scores import CalibrationDetails
from evaluation.scoring.rubric import PAPER_BAR
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
GEN = GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10)


def _answer(diagnosis: str, rationale: str = "periventricular FLAIR lesions") -> str:
    return json.dumps(
        {
            "findings": [],
            "differential": [{"diagnosis": diagnosis, "likelihood": 0.7}],
            "final_diagnosis": diagnosis,
            "rationale": rationale,
            "confidence": 0.7,
        }
    )


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))  # no stray review log
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner()


GRADES = [1, 2, 3, 4, 5]  # the grader's score of case i's answer, on every dimension
RATINGS = [1.5, 2.0, 3.5, 4.0, 4.5]  # a clinician's rating of the same answers


def test_grader_calibration_correlates_the_rubric_with_clinician_ratings(
    tmp_path: Path, cli: CliRunner
) -> None:
    n = len(GRADES)
    data, answers = write_nmb(tmp_path / "data", n, marker={i: f"CASEMARK{i}" for i in range(n)})
    # Every answer names the right diagnosis, so diagnosis credit is 1.0 everywhere and cannot
    # correlate with anything: an r can only come from the rubric grader.
    grades = {f"RTOKEN{i}": g for i, g in enumerate(GRADES)}  # grader prompts
    replies = [
        (f"CASEMARK{i}", _answer("multiple sclerosis", f"RTOKEN{i} lesions")) for i in range(n)
    ]
    run = tmp_path / "run"
    with OpenAIServer(Script(replies=replies, responder=grader_responder(grades))) as server:
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=[server_spec(server.url)],
            graders=[server_spec(server.url, name="judge")],
            generate=GEN,
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
        )
        asyncio.run(start_run(config, run))
    store = RunStore(run)
    run_id = store.run_log().run_id
    rubric = {
        sid: s.value for sid, ss in store.scores().items() for s in ss if s.scorer == "rubric"
    }
    credit = {
        s.value for ss in store.scores().values() for s in ss if s.scorer == "diagnosis_credit"
    }
    store.close()
    assert sorted(rubric.values()) == [float(g) for g in GRADES] and credit == {1.0}

    # One clinician rates every answer and signs each case off.
    rundata = load_run(run)
    reviews = ReviewStore(tmp_path / "reviews.sqlite")
    pairs = []
    for case, rating in zip(sorted(rundata.cases, key=lambda c: c.case_id), RATINGS, strict=True):
        [sample] = rundata.samples_of(case.case_id)
        for action, value in ((Action.RATING, rating), (Action.SIGNOFF, None)):
            reviews.append(
                ReviewEvent(reviewer="Dr A", run_id=run_id, case_id=case.case_id,
                            answer_key=answer_key(sample), action=action, rating=value)
            )  # fmt: skip
        pairs.append((sample.scored.value("rubric"), rating))
    grader = [g for g, _ in pairs]
    assert grader == [float(g) for g in GRADES]  # case i was graded GRADES[i]
    expected = float(st.pearsonr(grader, RATINGS).statistic)
    assert expected == pytest.approx(float(np.corrcoef(grader, RATINGS)[0, 1]))

    stats = review_stats(rundata, reviews.reviews(run_id))
    g = stats.grader_vs_clinician
    assert stats.grader_source == "rubric" and stats.grader_label.startswith("rubric grader vs")
    cal = g.details_as(CalibrationDetails) if g is not None else None
    assert g is not None and g.value == pytest.approx(expected) and cal is not None and cal.n == n
    assert cal.meets_paper_bar is (expected > PAPER_BAR) is True

    # Without rubric scores the same reviews fall back to diagnosis credit, and say so.
    stripped = rundata.model_copy(deep=True)
    for s in stripped.samples:
        s.scored.scores = [x for x in s.scored.scores if x.scorer != "rubric"]
    fallback = review_stats(stripped, reviews.reviews(run_id))
    f = fallback.grader_vs_clinician
    assert fallback.grader_source == "diagnosis_credit"
    assert fallback.grader_label.startswith("diagnosis credit (not a grader")
    assert f is not None and f.value is None  # constant credit: no r, and no bar claimed
    assert f.explanation.startswith("diagnosis credit") and "paper's bar" not in f.explanation

    # `runs show` prints the figure against the paper's bar; --json carries the review stats.
    res = cli.invoke(app, ["runs", "show", str(run), "--reviews", str(tmp_path / "reviews.sqlite")])
    assert res.exit_code == 0, res.output
    out = _flat(res.output)
    assert "clinician reviews: 5 of 5 cases signed off (Dr A)" in out
    assert (
        f"rubric grader vs clinician ratings: Pearson r = {expected:.3f} over 5 answers "
        f"(paper's bar: r > {PAPER_BAR})" in out
    )
    assert "meets the bar" in out
    res = cli.invoke(
        app, ["runs", "show", str(run), "--json", "--reviews", str(tmp_path / "reviews.sqlite")]
    )
    shown = json.loads(res.stdout)
    assert shown["reviews"]["grader_vs_clinician"]["value"] == pytest.approx(expected)
    # No review log: nothing about clinicians is printed; a log given but absent is an error.
    plain = cli.invoke(app, ["runs", "show", str(run)])
    assert plain.exit_code == 0 and "clinician" not in plain.output
    absent = cli.invoke(app, ["runs", "show", str(run), "--reviews", str(tmp_path / "no.sqlite")])
    assert absent.exit_code == 1 and "no review log at" in _flat(absent.output)


def test_runs_compare_two_models_on_the_cases_both_answered(tmp_path: Path, cli: CliRunner) -> None:
    # Model A is wrong on case 0 only, model B on cases 1-3; both right on cases 4 and 5.
    marker = {0: "WRONGA", 1: "WRONGB", 2: "WRONGB", 3: "WRONGB"}
    data, answers = write_nmb(tmp_path / "data", 6, marker=marker)
    run = tmp_path / "run"
    with (
        OpenAIServer(Script(replies=[("WRONGA", _answer("glioblastoma"))])) as a,
        OpenAIServer(Script(replies=[("WRONGB", _answer("acute ischaemic stroke"))])) as b,
    ):
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=[server_spec(a.url, name="A"), server_spec(b.url, name="B")],
            generate=GEN,
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
        )
        asyncio.run(start_run(config, run))
    res = cli.invoke(app, ["runs", "compare", str(run), "--a", "A", "--b", "B", "--json",
                           "--n-boot", "500"])  # fmt: skip
    assert res.exit_code == 0, res.output
    c = json.loads(res.stdout)
    assert (c["n_units"], c["both_right"], c["a_only"], c["b_only"], c["both_wrong"]) == (
        6, 2, 3, 1, 0
    )  # fmt: skip
    assert c["accuracy_a"] == pytest.approx(5 / 6) and c["accuracy_b"] == pytest.approx(3 / 6)
    # McNemar on the discordant pairs (3 vs 1): exact, two-sided binomial
    assert c["mcnemar"]["exact"] is True
    assert c["mcnemar"]["p_value"] == pytest.approx(st.binomtest(1, 4, 0.5).pvalue)
    assert c["bootstrap"]["difference"]["value"] == pytest.approx(5 / 6 - 3 / 6)
    # The table: the two models are found without --a/--b, since the run has exactly two.
    res = cli.invoke(app, ["runs", "compare", str(run), "--task", "differential"])
    assert res.exit_code == 0, res.output
    out = _flat(res.output)
    assert "A vs B: 6 shared case/task units (differential tasks)" in out
    assert f"McNemar p (exact binomial) │ {st.binomtest(1, 4, 0.5).pvalue:.4f}" in out
    assert "A right only │ 3" in out and "B right only │ 1" in out
    # No shared scored unit for a family the run did not ask; an unknown model or family.
    res = cli.invoke(app, ["runs", "compare", str(run), "--task", "lesion"])
    assert res.exit_code == 1 and "share no scored case/task" in _flat(res.output)
    res = cli.invoke(app, ["runs", "compare", str(run), "--a", "A", "--b", "C"])
    assert res.exit_code == 1 and "'C' is not in this run" in _flat(res.output)
    res = cli.invoke(app, ["runs", "compare", str(run), "--task", "lesions"])
    assert res.exit_code == 1 and "unknown task family 'lesions'" in _flat(res.output)
