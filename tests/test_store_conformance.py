"""The run log's guarantees, the same on both engines (SQLite per run, PostgreSQL per install):
the request is stored before the call and the response committed before anything parses it,
``kill -9`` loses at most the calls in flight, resume never repeats a stored call, rescore never
calls a model, rows read back typed; plus schema upgrades (a legacy run.sqlite, an empty or an
older PostgreSQL database), the gateway's run record and erasure."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from engine_helpers import cli_env, write_nmb
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database
from store_legacy import make_legacy

from evaluation.engine import rescore, resume_run
from evaluation.log import (
    GatewayRun,
    RouteRecord,
    RunStatus,
    SchemaOutOfDateError,
    open_store,
    schema_status,
    upgrade,
)
from evaluation.log.schema import HEAD
from evaluation.modelio import ModelOutput

N_CASES, SAMPLES, HOLD_AFTER = 6, 2, 5
RUN = """
import asyncio, sys
from pathlib import Path
from evaluation import DatasetSpec, RunConfig
from evaluation.engine import start_run
from gateway.settings import get_settings
suite, answers, url, run, db = sys.argv[1:6]
cfg = RunConfig.from_settings(
    get_settings(), DatasetSpec(path=suite, answers=answers), models=["openai/gpt-4o"],
    api_base=url, concurrency=3, samples=SAMPLES_N, seed=7, bertscore=False, run_id="conf-run",
)
asyncio.run(start_run(cfg, Path(run), database_url=db or None))
""".replace("SAMPLES_N", str(SAMPLES))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    return fresh_pg_database(request.getfixturevalue("pg_url"))


def _counts(run: Path, url: str | None) -> tuple[int, int]:
    """(requests, responses) stored so far; (-1, -1) before the store exists."""
    try:
        with open_store(run, database_url=url, read_only=url is None) as store:
            c = store.counts()
    except Exception:  # not created yet
        return -1, -1
    return c.requests, c.responses


def test_kill_9_resume_rescore_on_each_engine(tmp_path: Path, database_url: str | None) -> None:
    data, answers = write_nmb(tmp_path / "data", N_CASES)
    run = tmp_path / "run"
    env = cli_env(tmp_path / "cache")
    distinct = N_CASES * SAMPLES
    with OpenAIServer(Script(latency_s=0.05, hold_after=HOLD_AFTER)) as server:
        argv = [sys.executable, "-c", RUN, str(data), str(answers), server.url, str(run)]
        proc = subprocess.Popen([*argv, database_url or ""], env=env, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                s = server.stats
                if s.held >= 1 and s.in_flight == s.held:
                    requests, responses = _counts(run, database_url)
                    if responses == s.delivered:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.communicate(timeout=5)[1] if proc.poll() is not None else b""
                    pytest.fail(f"never reached the kill point: {s}\n{err.decode()[-2000:]}")
                time.sleep(0.05)
            # every call the server holds had its request stored before it was sent
            assert requests >= responses + s.held
            answered = server.stats.delivered
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.release_held(drop=True)
        assert _counts(run, database_url)[1] == answered  # nothing answered was lost
        calls_before = server.stats.calls
        asyncio.run(resume_run(run, cache_dir=tmp_path / "cache", database_url=database_url))
        assert server.stats.delivered == distinct  # no answered call made twice
        assert len(set(server.stats.delivered_keys)) == distinct
        assert server.stats.calls - calls_before == distinct - answered
        calls = server.stats.calls
        counts = rescore(run, cache_dir=tmp_path / "cache", database_url=database_url)
        assert server.stats.calls == calls  # rescoring never calls a model
        assert counts is not None
    with open_store(run, database_url=database_url) as store:
        row = store.run_log()
        samples = store.samples()
        responses = store.responses()
        assert row.run_id == "conf-run" and row.status == "complete"
        assert len(samples) == distinct and {s.status for s in samples} == {"ok"}
        assert all(isinstance(o, ModelOutput) for o in responses.values())
        assert len(responses) == distinct and store.counts().requests == distinct
        assert sum(len(v) for v in store.scores().values()) > 0


def test_gateway_run_stage_and_erasure_on_each_engine(
    tmp_path: Path, database_url: str | None
) -> None:
    run_id = "f" * 32
    with open_store(tmp_path / run_id, database_url=database_url, create=True) as store:
        assert store.gateway_run() is None
        store.put_gateway_run(
            GatewayRun(run_id=run_id, trigger="dicom", route=RouteRecord(rule="neuro"))
        )
        store.set_gateway_stage("rendering", 0.3, status=RunStatus.RUNNING, timings_s={"a": 1})
        rec = store.gateway_run()
        assert rec is not None and (rec.stage, rec.progress) == ("rendering", 0.3)
        assert rec.status is RunStatus.RUNNING and rec.route == RouteRecord(rule="neuro")
        with pytest.raises(Exception, match="cannot set"):
            store.set_gateway_stage("x", 0.1, route="nope")
        for case in ("c1", "c2"):
            store.commit(
                [
                    (
                        "request",
                        {
                            "cache_key": f"k-{case}", "case_id": case, "task": "t",
                            "family": "differential", "model": "m", "sample": 0, "turn": 0,
                            "image_hashes": "[]", "prompt_hash": "p", "request_json": "{}",
                            "created_at": "t",
                        },
                    ),
                    (
                        "response",
                        {"cache_key": f"k-{case}", "model": "m", "text": "x",
                         "output_json": "{}", "created_at": "t"},
                    ),
                ]
            )  # fmt: skip
        assert store.erase_cases(["c1"]) == 2
        assert set(store.responses()) == {"k-c2"}
    if database_url is not None:  # another run of the same database is apart
        with open_store(tmp_path / "other", database_url=database_url, create=True) as other:
            assert other.gateway_run() is None and other.responses() == {}


def test_a_legacy_run_sqlite_upgrades_when_opened_and_reads_as_it_is_read_only(
    tmp_path: Path,
) -> None:
    run = tmp_path / "legacy-run"
    with open_store(run, create=True) as store:
        store.init_run(
            "old", {}, dataset_name="d", dataset_kind="k", dataset_hash="h",
            prompt_version="p", code_version="c", packages={},
        )  # fmt: skip
        store.set_note("gateway", '{"run_id": "old", "trigger": "api", "sr_sop_uids": ["1.2"]}')
    make_legacy(run / "run.sqlite", drop=("skipped_cases",), no_scoring_version=True)
    url = f"sqlite:///{run / 'run.sqlite'}"
    assert schema_status(url).current is None
    with open_store(run, read_only=True) as store:  # read as it is: nothing written
        assert store.run_log().run_id == "old" and store.coverage().recorded is False
    assert schema_status(url).current is None
    with open_store(run) as store:  # opened: upgraded
        assert store.run_log().run_id == "old"
        gw = store.gateway_run()
        assert gw is not None and gw.trigger == "api" and gw.sr_sop_uids == {"#1": "1.2"}
    assert schema_status(url).up_to_date


def test_postgres_schema_is_made_by_upgrade_and_an_older_one_refused(pg_url: str) -> None:
    url = fresh_pg_database(pg_url)
    assert schema_status(url).current is None
    assert upgrade(url).current == HEAD
    eng = sa.create_engine(url)
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num='0002_run_keys'")
    finally:
        eng.dispose()
    with pytest.raises(SchemaOutOfDateError, match="neurosandbox db upgrade"):
        open_store(Path("/nonexistent/run"), database_url=url, create=True)
