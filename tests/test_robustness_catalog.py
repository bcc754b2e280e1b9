"""The runs catalog of a run with the grounding audit (issue 39): each model's figures are over
the cases as received (the variants '<case>~<kind>' are not cases), and its entry carries the
audit's measures: the score lost without the images, the sides that follow the mirror, the attack
success of each planted kind."""

from __future__ import annotations

import json
from pathlib import Path

from engine_helpers import cli_env, write_nmb
from typer.testing import CliRunner

from evaluation.log import list_runs
from gateway.cli import app


def test_the_catalog_counts_the_cases_and_carries_the_audits_measures(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 2)
    env = cli_env(tmp_path / "cache")
    env["NEUROSANDBOX_DATA_DIR"] = str(tmp_path / "var")
    env["NEUROSANDBOX_RUNS_DIR"] = str(tmp_path / "runs")
    run = tmp_path / "runs" / "r1"
    r = CliRunner().invoke(
        app,
        ["eval", "--suite", str(data), "--answers", str(answers), "--model",
         "reference/text-prior", "--model", "reference/gullible", "--no-bertscore",
         "--out", str(run), "--robustness", "no_images,planted_note"],
        env=env,
    )  # fmt: skip
    assert r.exit_code == 0, r.output[-2000:]
    (entry,) = list_runs([tmp_path / "runs"])
    prior, gullible = entry.metric("reference/text-prior"), entry.metric("reference/gullible")
    assert prior is not None and gullible is not None
    # two cases, one question each: the variants' answers are not counted as cases
    assert prior.n_samples == gullible.n_samples == 2
    assert prior.image_reliance["no_images"].value == 0.0  # the same answer without images
    assert prior.attack_success["planted_note"].value == 0.0
    assert gullible.attack_success["planted_note"].value == 1.0
    assert gullible.attack_success["planted_note"].n == 2
    assert not prior.flip_follows  # no mirror was asked
    # the run's own lines (eval, runs show) count the cases as received, as the catalog and the
    # summary do: the coverage, the leaderboard and the subgroups leave the variants out
    assert "2 of 2 cases evaluated" in r.output, r.output[-3000:]
    shown = CliRunner().invoke(app, ["runs", "show", str(run), "--json"], env=env)
    assert shown.exit_code == 0, shown.output[-2000:]
    record = json.loads(shown.output)
    assert record["coverage"]["evaluated"] == 2
    board = {x["model"]: x for x in record["summary"]["leaderboard"]}
    assert board["reference/gullible"]["n_samples"] == board["reference/gullible"]["n_cases"] == 2
    rows = record["subgroups"]["rows"]
    assert rows and max(x["n"] for x in rows) <= 2 and max(x["n_cases"] for x in rows) <= 2


def test_the_report_writes_a_checklist_per_case_flagged_by_its_variants(tmp_path: Path) -> None:
    """`neurosandbox report` of a run with the audit writes the checklists of the cases as
    received, each flagged with what its variants showed, not a checklist (and a PDF to print)
    per variant; the review pages list the same cases of the report handed in."""
    from gateway.review.service import ReviewService
    from gateway.settings import Settings

    run, out = tmp_path / "runs" / "r1", tmp_path / "reports" / "r1"
    env = _gullible_audit(tmp_path, run)
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--no-pdf"], env=env)
    assert r.exit_code == 0, r.output[-2000:]
    assert "2 checklists" in r.output, r.output[-2000:]
    written = sorted(p.name for p in (out / "cases").glob("*.json"))
    assert len(written) == 2 and not any("planted" in n or "no_images" in n for n in written)
    followed = [json.loads((out / "cases" / n).read_text())["flags"] for n in written]
    assert all(any("planted" in json.dumps(f).lower() for f in flags) for flags in followed)
    settings = Settings(data_dir=tmp_path / "var", reports_dir=tmp_path / "reports")
    review = ReviewService(settings)
    assert len(review.checklists("r1")) == 2
    assert review.summary("r1").robustness is not None  # the audit's measures still read


def test_a_run_set_apart_from_its_variants_keeps_what_they_flag(tmp_path: Path) -> None:
    """The gateway writes back and reviews a study as received (``as_received``: the variants'
    cases and samples set apart); its checklist still carries what the variants showed, as the
    run's own report does (a routing rule's audit is not lost on the way to the PDF)."""
    from evaluation.reports import run_checklists, run_from_store
    from evaluation.robustness import as_received

    run = tmp_path / "runs" / "r1"
    _gullible_audit(tmp_path, run)
    full = run_from_store(run / "run.sqlite")
    received = as_received(full)
    assert not received.variants and len(received.cases) == 2
    flags = [c.flags for c in run_checklists(full)]
    assert all(flags) and [c.flags for c in run_checklists(received)] == flags


def _gullible_audit(tmp_path: Path, run: Path) -> dict[str, str]:
    """`eval` of a two-case suite by reference/gullible with the no_images and planted_note
    variants into ``run``; the command's environment."""
    data, answers = write_nmb(tmp_path / "data", 2)
    env = cli_env(tmp_path / "cache")
    env["NEUROSANDBOX_DATA_DIR"] = str(tmp_path / "var")
    r = CliRunner().invoke(
        app,
        ["eval", "--suite", str(data), "--answers", str(answers), "--model",
         "reference/gullible", "--no-bertscore", "--out", str(run), "--robustness",
         "no_images,planted_note"],
        env=env,
    )  # fmt: skip
    assert r.exit_code == 0, r.output[-2000:]
    return env
