"""The durable queue (gateway/jobs.py, procrastinate on the run log's PostgreSQL): real
``neurosandbox worker`` processes take jobs that real ``neurosandbox eval`` / ``runs resume``
commands run, against the loopback OpenAI-compatible server (or the reference model).

- A job committed with its run row survives its process being killed before the drain (a
  worker drains it); a second request for a waiting study merges into it; a request while the
  study runs waits for it (the study's lock), though the worker has a free slot.
- ``eval --queue 3`` runs as three shards on three workers; one worker (and its command) hung
  with SIGSTOP past the stall timeout, another killed with SIGKILL: the periodic
  ``retry_stalled`` task gives their jobs to the live worker, and the run completes with one
  response per call key; the hung worker, woken, finds its job given to another and exits
  before procrastinate would record its outcome over the other's.
- PostgreSQL restarted (``pg_ctl stop -m fast``, then ``-m immediate``) under an idle worker:
  the same worker process reconnects each time and runs the next job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import yaml
from engine_helpers import cli_env, neurosandbox_bin, write_nmb
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database, postgres_bindir

from evaluation.log import upgrade_run_log
from gateway.jobs import apply_schema, conninfo, drain, enqueue, study_job
from gateway.pg_local import LocalPostgres

pytestmark = pytest.mark.integration
JOBS = "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = 'neurosandbox'"
QUEUE_ENV = {
    "NEUROSANDBOX_QUEUE_HEARTBEAT_S": "0.3",
    "NEUROSANDBOX_QUEUE_STALL_S": "2.5",
    "NEUROSANDBOX_QUEUE_CHECK_S": "1",
    "NEUROSANDBOX_CALL_LEASE_S": "2.0",
    "NEUROSANDBOX_RUN_DEADLINE_S": "60",
}


def _env(tmp: Path, url: str, server_url: str | None = None, calls: int = 2) -> dict[str, str]:
    env = {**cli_env(tmp / "cache"), "NEUROSANDBOX_DATABASE_URL": url, **QUEUE_ENV,
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # fmt: skip
    if server_url:
        models = tmp / "models.yaml"
        models.write_text(yaml.safe_dump({"models": [{
            "name": "gpt", "model": "openai/gpt-4o", "api_base": server_url, "concurrency": calls,
            "max_retries": 0,
        }]}))  # fmt: skip
        env["NEUROSANDBOX_MODELS_FILE"] = str(models)
    return env


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([neurosandbox_bin(), *args], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def _sql(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(conninfo(url), connect_timeout=5) as c:
        return list(c.execute(sql.encode()).fetchall())


def _one(url: str, sql: str) -> int:
    try:
        return int(_sql(url, sql)[0][0] or 0)
    except psycopg.errors.UndefinedTable:
        return 0


@contextmanager
def _workers(n: int, env: dict[str, str], tmp: Path, *, concurrency: int = 1
             ) -> Iterator[list[subprocess.Popen[bytes]]]:  # fmt: skip
    procs = [subprocess.Popen([neurosandbox_bin(), "worker", "--stop-after", "90",
                               "--concurrency", str(concurrency)], env=env,
                              stdout=(tmp / f"worker{i}.log").open("wb"),
                              stderr=subprocess.STDOUT) for i in range(n)]  # fmt: skip
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _until(what: str, ok: Callable[[], bool], tmp: Path, timeout_s: float = 40) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in tmp.glob("worker*.log"))
            pytest.fail(f"{what}: not within {timeout_s} s\n{logs}")
        time.sleep(0.1)


def _upgraded(env: dict[str, str], *, cli: bool = False) -> str:
    """The run log's schema and the queue's tables (``neurosandbox db upgrade``)."""
    url = env["NEUROSANDBOX_DATABASE_URL"]
    if cli:
        up = _cli(["db", "upgrade"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "queue's tables (procrastinate): created" in up.stdout
    else:
        upgrade_run_log(url)
        assert apply_schema(url)
    return url


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


_KILLED_ENQUEUER = """
import os, signal, sys
import sqlalchemy as sa
from evaluation.log.schema import gateway_runs
from gateway.jobs import enqueue, study_job
url, argv, rollback = sys.argv[1], sys.argv[3:], sys.argv[2] == "rollback"
eng = sa.create_engine(url)
with eng.connect() as conn:
    tx = conn.begin()
    conn.execute(gateway_runs.insert().values(
        run_id="gw-" + sys.argv[2], status="queued", stage="received", progress=0.0,
        study_uid="1.2.3.4", patient_id="P1", timings_json="{}", record_json="{}",
        updated_at="2026-01-01T00:00:00+00:00"))
    enqueue(conn, study_job("1.2.3.4|P1", argv))
    tx.rollback() if rollback else tx.commit()
os.kill(os.getpid(), signal.SIGKILL)  # after the commit, before any drain
"""


def test_a_job_committed_with_its_run_row_survives_a_kill_before_the_drain(
    pg_url: str, tmp_path: Path
) -> None:
    url = fresh_pg_database(pg_url)
    env = _env(tmp_path, url)
    _upgraded(env, cli=True)
    suite, answers = write_nmb(tmp_path / "data", 2)
    runs = [tmp_path / f"run{i}" for i in range(4)]

    def argv(run: Path) -> list[str]:
        return ["eval", "--suite", str(suite), "--answers", str(answers), "--model",
                "reference/text-prior", "--no-bertscore", "--out", str(run)]  # fmt: skip

    for tag, run in (("committed", runs[0]), ("rollback", runs[1]), ("again", runs[2])):
        p = subprocess.run([sys.executable, "-c", _KILLED_ENQUEUER, url, tag, *argv(run)],
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert p.returncode == -signal.SIGKILL, p.stderr
    # the committed ones are there, with their run rows; the rolled-back one left nothing
    assert _one(url, "SELECT count(*) FROM gateway_runs") == 2
    assert _one(url, "SELECT count(*) FROM job_outbox WHERE drained_at IS NULL") == 2
    # a row that is not a job (written by hand, or by a hostile peer) is refused, never run
    planted = tmp_path / "planted"
    with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO job_outbox (task, queueing_lock, args, created_at) VALUES "
            "('study_run', 'x', :args, 'now')"), {"args": json.dumps(
                {"argv": ["sh", "-c", f"touch {planted}"]})})  # fmt: skip
    assert _one(url, JOBS) == 0
    with _workers(1, env, tmp_path, concurrency=2):
        # a worker drains what the killed processes left: the second request for the
        # waiting study merged into the first
        _until("the job runs", lambda: _one(url, JOBS + " AND status = 'doing'") == 1, tmp_path)
        assert _sql(url, "SELECT job_id IS NOT NULL FROM job_outbox ORDER BY id") == [
            (True,), (False,), (False,)]  # fmt: skip
        assert _one(url, "SELECT count(*) FROM job_outbox WHERE drained_at IS NULL") == 0
        # a request while the study runs is queued, and held by the study's lock although
        # the worker has a free slot
        with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as conn:
            enqueue(conn, study_job("1.2.3.4|P1", argv(runs[3])))
        drain(url)  # queued here, or by the worker's own periodic drain if it came first
        _until("the request is queued", lambda: _one(
            url, "SELECT count(*) FROM job_outbox WHERE job_id IS NOT NULL") == 2, tmp_path)  # fmt: skip
        _until("both ran", lambda: _one(
            url, "SELECT count(*) FROM run WHERE status = 'complete'") == 2, tmp_path)  # fmt: skip
    assert not runs[1].exists() and not runs[2].exists()  # rolled back; merged
    assert not planted.exists()
    spans = _sql(url, "SELECT created_at, updated_at FROM run ORDER BY created_at")
    assert spans[1][0] >= spans[0][1], spans  # the second started after the first finished


def test_shards_of_a_queued_run_survive_a_hung_and_a_killed_worker(
    pg_url: str, tmp_path: Path
) -> None:
    url = fresh_pg_database(pg_url)
    n_cases, samples = 6, 2
    with OpenAIServer(Script(latency_s=0.5)) as server:
        env = _env(tmp_path, url, server.url, calls=1)
        _upgraded(env)
        suite, answers = write_nmb(tmp_path / "data", n_cases)
        run = tmp_path / "run"
        with _workers(3, env, tmp_path, concurrency=2) as workers:
            q = _cli(["eval", "--suite", str(suite), "--answers", str(answers), "--model", "gpt",
                      "--samples", str(samples), "--seed", "3", "--no-bertscore", "--out",
                      str(run), "--queue", "3"], env)  # fmt: skip
            assert q.returncode == 0 and "queued 3 shard job(s)" in q.stderr, q.stdout + q.stderr

            def busy() -> list[subprocess.Popen[bytes]]:
                return [w for w in workers if w.poll() is None and _children(w.pid)]

            def starts_the_run(w: subprocess.Popen[bytes]) -> bool:
                return any(b"eval" in Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")[:3]
                           for c in _children(w.pid))  # fmt: skip

            # the worker that started the run hangs once the run exists (its job, retried,
            # must join the run: `eval` refuses a folder that holds one); then another dies
            _until("the first shard made the run", lambda: _one(url, "SELECT count(*) FROM run")
                   == 1 and any(starts_the_run(w) for w in busy()), tmp_path)  # fmt: skip
            hung = next(w for w in busy() if starts_the_run(w))
            for pid in [hung.pid, *_children(hung.pid)]:  # the host hangs: worker and command
                os.kill(pid, signal.SIGSTOP)
            _until("another worker runs a shard", lambda: any(w is not hung for w in busy()),
                   tmp_path)  # fmt: skip
            killed = next(w for w in busy() if w is not hung)
            killed.kill()  # the command dies with it (its parent-death signal)
            # past the stall timeout the live worker takes both jobs over
            _until("the run completes", lambda: _one(
                url, "SELECT count(*) FROM run WHERE status = 'complete'") == 1, tmp_path,
                timeout_s=90)  # fmt: skip
            # the hung host wakes up: its command's answers are refused by the claims, and
            # the worker, finding its job given to another, stops before procrastinate would
            # record its outcome over the other's
            for pid in [*_children(hung.pid), hung.pid]:
                os.kill(pid, signal.SIGCONT)
            try:
                hung.wait(timeout=60)
            except subprocess.TimeoutExpired:
                logs = "".join(p.read_text() for p in tmp_path.glob("worker*.log"))
                pytest.fail(f"the woken worker went on: {logs[-3000:]}")
            assert hung.returncode == 75  # EXIT_FENCED: its supervisor starts it again
        stats = server.stats
    distinct = n_cases * samples
    assert _one(url, "SELECT count(*) FROM responses") == distinct
    takeovers = _one(url, "SELECT count(*) FROM call_attempts WHERE kind = 'takeover'")
    assert stats.calls - distinct <= takeovers  # only calls in flight on the lost workers again
    # the live worker's periodic task gave the lost workers' jobs back to the queue
    logs = "".join(p.read_text() for p in tmp_path.glob("worker*.log"))
    assert logs.count("its worker is stalled; queued again") >= 2, logs[-3000:]


def test_a_worker_reconnects_after_postgresql_restarts(tmp_path: Path) -> None:
    server = LocalPostgres(bindir=postgres_bindir())
    server.start()
    try:
        env = _env(tmp_path, server.url)
        url = _upgraded(env)
        suite, answers = write_nmb(tmp_path / "data", 2)
        log = tmp_path / "worker0.log"
        with _workers(1, env, tmp_path) as (worker,):
            for n, mode in enumerate(("fast", "immediate"), start=1):
                _until("the worker is registered", lambda: _one(
                    url, "SELECT count(*) FROM procrastinate_workers") >= 1, tmp_path)  # fmt: skip
                server.restart(mode)
                # the outage stopped procrastinate's worker (its heartbeat failed); it is
                # started again on a new pool by the same process
                # within its pool's wait for a connection (jobs.POOL_WAIT_S), even when loaded
                _until(f"the worker noticed the {mode} restart",
                       lambda n=n: log.read_text().count("reconnecting") >= n, tmp_path,
                       timeout_s=60)  # fmt: skip
            with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as conn:
                enqueue(conn, study_job("5.6.7|P2", [
                    "eval", "--suite", str(suite), "--answers", str(answers), "--model",
                    "reference/text-prior", "--no-bertscore", "--out", str(tmp_path / "run")]))  # fmt: skip
            _until("the job after the restarts ran", lambda: _one(
                url, "SELECT count(*) FROM run WHERE status = 'complete'") == 1, tmp_path)  # fmt: skip
            assert worker.poll() is None  # the same worker process carried on
    finally:
        server.stop()
