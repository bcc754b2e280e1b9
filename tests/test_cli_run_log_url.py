"""Every command that reads or writes a run opens the run log the settings name: with
``NEUROSANDBOX_DATABASE_URL`` set, ``eval`` puts the run's rows in that PostgreSQL database (the
run folder keeps its marker and exports, no ``run.sqlite``) and ``runs show|list|rescore|
export|resume`` and ``report`` read them there, through the real CLI (issue 36)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from engine_helpers import write_nmb
from pg_server import fresh_pg_database
from typer.testing import CliRunner

from evaluation.log import PG_MARKER, STORE_FILE
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_eval_then_runs_show_rescore_export_report_on_postgresql(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fresh_pg_database(pg_url)
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "data_dir"))
    monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", url)
    data, answers = write_nmb(tmp_path / "data", 2)
    runs = tmp_path / "runs"
    run = runs / "r1"
    cli = CliRunner()
    args = ["eval", "--suite", str(data), "--answers", str(answers), "--model",
            "reference/text-prior", "--samples", "2", "--no-bertscore", "--out", str(run)]  # fmt: skip
    res = cli.invoke(app, args)
    assert res.exit_code == 0, res.output
    # the rows are in PostgreSQL; the folder holds the marker naming the run, no run.sqlite
    assert (run / PG_MARKER).is_file() and not (run / STORE_FILE).exists()
    run_id = json.loads((run / PG_MARKER).read_text())["run_id"]
    engine = sa.create_engine(url)
    try:
        with engine.connect() as con:
            n = con.execute(
                sa.text("SELECT count(*) FROM samples WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
            assert n == 4
            # rescore changes what is read back: make one sample's score stale in the database
            con.execute(sa.text("UPDATE scores SET value = -1 WHERE run_id = :r"), {"r": run_id})
            con.commit()
        res = cli.invoke(app, ["runs", "show", str(run), "--json"])
        assert res.exit_code == 0, res.output
        shown = json.loads(res.stdout)
        assert shown["run"]["run_id"] == run_id and shown["counts"]["samples_ok"] == 4
        assert shown["run"]["status"] == "complete"
        listed = cli.invoke(app, ["runs", "list", str(runs)])
        assert listed.exit_code == 0 and run_id in listed.output, listed.output
        res = cli.invoke(app, ["runs", "rescore", str(run), "--no-bertscore"])
        assert res.exit_code == 0, res.output
        assert "rescored 4" in res.output
        with engine.connect() as con:
            stale = con.execute(
                sa.text("SELECT count(*) FROM scores WHERE run_id = :r AND value = -1"),
                {"r": run_id},
            ).scalar_one()
        assert stale == 0
        out = tmp_path / "x.jsonl"
        res = cli.invoke(app, ["runs", "export", str(run), "--out", str(out)])
        assert res.exit_code == 0, res.output
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 4 and {r["run_id"] for r in rows} == {run_id}
        res = cli.invoke(app, ["runs", "resume", str(run)])
        assert res.exit_code == 0, res.output  # nothing left to call: every sample is stored
        report = tmp_path / "report"
        res = cli.invoke(app, ["report", str(run), "--out", str(report), "--no-pdf"])
        assert res.exit_code == 0, res.output
        assert (report / "index.html").is_file() or list(report.glob("*.html"))
        assert not (run / STORE_FILE).exists()  # nothing fell back to a file of its own
    finally:
        engine.dispose()


def test_a_run_log_that_is_not_reachable_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / PG_MARKER).write_text(json.dumps({"run_id": "r", "engine": "postgresql"}))
    # a loopback port nothing listens on
    monkeypatch.setenv(
        "NEUROSANDBOX_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:9/neurosandbox"
    )
    res = CliRunner().invoke(app, ["runs", "show", str(run)])
    assert res.exit_code == 1, res.output
    assert "not reachable" in " ".join(res.output.split())
