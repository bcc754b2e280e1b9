"""A queued study's run whose worker was lost mid-evaluation is resumed by the job's retry:
the answers its first attempt stored are reused, only the calls it had not answered are made.

The first attempt runs the gateway's evaluator (``DefaultEvaluator``, what ``runs
evaluate-study`` runs on a worker host) in a process of its own, against the loopback
OpenAI-compatible server, which answers one call and then holds every further request; once
that answer is in the run's store the process gets SIGKILL. The second attempt evaluates the
same run folder again. On the old code it refused ("already holds a run") and the pipeline
marked the run interrupted, asking a person to evaluate the study again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from gateway_synth import make_study
from openai_server import OpenAIServer, Script

from evaluation.case import TaskFamily
from gateway.routing import CLINICAL, Route
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

TASKS = [TaskFamily.DIFFERENTIAL, TaskFamily.LESION, TaskFamily.RATIONALE]
ROUTE = Route(rule="ward", models=["ward-vlm"], tasks=TASKS, series_classes=list(CLINICAL))


def _settings(tmp: Path, url: str) -> Settings:
    models = tmp / "models.yaml"
    models.write_text(
        "models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 0\n"
        "    concurrency: 1\n"
    )
    return Settings(data_dir=tmp, models_file=models, api_base=url, phi_trusted_hosts=[])


def _first_attempt(tmp: str, url: str) -> None:
    t = Path(tmp)
    DefaultEvaluator(_settings(t, url)).evaluate(t / "study", ROUTE, t / "runs" / ("1" * 32))


def _answers(db: Path) -> int:
    if not db.exists():
        return -1
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(con.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
    except sqlite3.OperationalError:
        return -1
    finally:
        con.close()


def test_a_run_whose_worker_died_is_resumed_reusing_what_it_answered(tmp_path: Path) -> None:
    make_study(tmp_path / "study", lesion="left")
    work = tmp_path / "runs" / ("1" * 32)
    with OpenAIServer(Script(hold_after=1)) as server:
        proc = multiprocessing.get_context("spawn").Process(
            target=_first_attempt, args=(str(tmp_path), server.url), daemon=True
        )
        proc.start()
        try:
            deadline = time.monotonic() + 90
            while not (server.stats.held >= 1 and _answers(work / "run.sqlite") == 1):
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
        result = DefaultEvaluator(_settings(tmp_path, server.url)).evaluate(
            tmp_path / "study", ROUTE, work
        )
        assert server.stats.delivered == len(TASKS)  # one answered call per task, in all
        assert len(set(server.stats.delivered_keys)) == len(TASKS)  # none answered twice
    done = {x.scored.family for x in result.run.samples if x.scored.status == "ok"}
    assert done == set(TASKS)
    assert any("resumed" in w and "1 of 3" in w for w in result.warnings), result.warnings
