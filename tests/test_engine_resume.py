"""``kill -9`` during a run, then resume: no response lost, no answered call made twice.

A real ``neurosandbox eval`` subprocess talks through litellm to the loopback server, which
counts every call. After N answers the server holds every further request (they are in flight
when the process dies). Once everything answered is on disk, the process gets SIGKILL; the held
requests are dropped unanswered. ``runs resume`` then finishes the run, and the server must have
answered exactly one call per distinct request: nothing answered was ever asked again.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from engine_helpers import cli_env, neurosandbox_bin, write_nmb
from openai_server import OpenAIServer, Script

N_CASES, SAMPLES, HOLD_AFTER = 8, 3, 10


def _count(db: Path, table: str) -> int:
    if not db.exists():
        return -1
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:
        return -1
    finally:
        con.close()


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_repeats_no_answered_call(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", N_CASES)
    run = tmp_path / "run"
    db = run / "run.sqlite"
    env = cli_env(tmp_path / "cache")
    with OpenAIServer(Script(latency_s=0.05, hold_after=HOLD_AFTER)) as server:
        args = [
            neurosandbox_bin(), "eval", "--suite", str(data), "--answers", str(answers),
            "--model", "openai/gpt-4o", "--api-base", server.url, "--samples", str(SAMPLES),
            "--seed", "7", "--concurrency", "4", "--no-bertscore", "--out", str(run),
        ]  # fmt: skip
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while True:
                s = server.stats
                settled = s.held >= 1 and s.in_flight == s.held
                if settled and _count(db, "responses") == s.delivered:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    _out, err = (
                        proc.communicate(timeout=5) if proc.poll() is not None else (b"", b"")
                    )
                    pytest.fail(f"run never reached the kill point: {s}\n{err.decode()[-2000:]}")
                time.sleep(0.05)
            answered_before_kill = server.stats.delivered
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # The calls the kill cut off: counted once the client is dead, because with four
            # calls in flight allowed one more can reach the server between the check and the kill.
            held = server.stats.held
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.release_held(drop=True)  # the client is dead: those calls are never answered
        assert proc.returncode == -signal.SIGKILL
        assert HOLD_AFTER <= answered_before_kill < N_CASES * SAMPLES
        assert _count(db, "responses") == answered_before_kill  # nothing answered was lost

        resumed = subprocess.run(
            [neurosandbox_bin(), "runs", "resume", str(run)],
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
        distinct = N_CASES * SAMPLES
        assert _count(db, "requests") == distinct and _count(db, "responses") == distinct
        assert server.stats.delivered == distinct  # one answered call per distinct request
        assert len(set(server.stats.delivered_keys)) == distinct  # no answered call made twice
        assert server.stats.calls == distinct + held  # only the calls cut off by the kill again
    con = sqlite3.connect(db)
    status = con.execute("SELECT status FROM run").fetchone()[0]
    n_ok = con.execute("SELECT COUNT(*) FROM samples WHERE status='ok'").fetchone()[0]
    con.close()
    assert status == "complete" and n_ok == distinct
