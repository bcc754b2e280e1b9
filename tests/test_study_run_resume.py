"""A queued study's run whose worker was lost mid-evaluation is resumed by the job's retry:
the answers its first attempt stored are reused, only the calls it had not answered are made.

The first attempt runs the gateway's evaluator (``DefaultEvaluator``, what ``runs
evaluate-study`` runs on a worker host, its run log in PostgreSQL) in a process of its own, against the loopback
OpenAI-compatible server, which answers one call and then holds every further request; once
that answer is in the run's store the process gets SIGKILL. The second attempt evaluates the
same run folder again. On the old code it refused ("already holds a run") and the pipeline
marked the run interrupted, asking a person to evaluate the study again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from gateway_synth import make_study
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database

from evaluation.case import TaskFamily
from gateway.routing import CLINICAL, Route
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

TASKS = [TaskFamily.DIFFERENTIAL, TaskFamily.LESION, TaskFamily.RATIONALE]
RUN_ID = "1" * 32
ROUTE = Route(rule="ward", models=["ward-vlm"], tasks=TASKS, series_classes=list(CLINICAL))


def _settings(tmp: Path, url: str, database_url: str) -> Settings:
    models = tmp / "models.yaml"
    models.write_text(
        "models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 0\n"
        "    concurrency: 1\n"
    )
    return Settings(data_dir=tmp, models_file=models, api_base=url, phi_trusted_hosts=[],
                    database_url=database_url, call_lease_s=1.0)  # fmt: skip


def _first_attempt(tmp: str, url: str, database_url: str) -> None:
    t = Path(tmp)
    DefaultEvaluator(_settings(t, url, database_url)).evaluate(
        t / "study", ROUTE, t / "runs" / RUN_ID
    )


def _answers(database_url: str) -> int:
    """The responses the run's store holds (-1: no store yet)."""
    eng = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with eng.connect() as c:
            sql = sa.text("SELECT count(*) FROM responses WHERE run_id = :r")
            return int(c.execute(sql, {"r": RUN_ID}).scalar_one())
    except sa.exc.SQLAlchemyError:
        return -1
    finally:
        eng.dispose()


def test_a_run_whose_worker_died_is_resumed_reusing_what_it_answered(
    pg_url: str, tmp_path: Path
) -> None:
    # the run log of the queue's workers (PostgreSQL): the lost worker's claims on its held
    # calls lapse after the lease (1 s here), then the resumed run makes those calls
    database_url = fresh_pg_database(pg_url)
    make_study(tmp_path / "study", lesion="left")
    work = tmp_path / "runs" / RUN_ID
    with OpenAIServer(Script(hold_after=1)) as server:
        proc = multiprocessing.get_context("spawn").Process(
            target=_first_attempt, args=(str(tmp_path), server.url, database_url), daemon=True
        )
        proc.start()
        try:
            deadline = time.monotonic() + 90
            while not (server.stats.held >= 1 and _answers(database_url) == 1):
                if not proc.is_alive() or time.monotonic() > deadline:
                    s = server.stats
                    pytest.fail(
                        f"no kill point: {s.calls} calls, {s.delivered} answered, {s.held} held"
                    )
                time.sleep(0.05)
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)  # the worker host is lost
            proc.join(timeout=10)
        finally:
            if proc.is_alive():
                proc.kill()
        server.release_held(drop=True)  # its held calls are never answered
        assert server.stats.delivered == 1

        # the job's retry: the same run folder evaluated again
        result = DefaultEvaluator(_settings(tmp_path, server.url, database_url)).evaluate(
            tmp_path / "study", ROUTE, work
        )
        assert server.stats.delivered == len(TASKS)  # one answered call per task, in all
        assert len(set(server.stats.delivered_keys)) == len(TASKS)  # none answered twice
    done = {x.scored.family for x in result.run.samples if x.scored.status == "ok"}
    assert done == set(TASKS)
    assert any("resumed" in w and "1 of 3" in w for w in result.warnings), result.warnings
