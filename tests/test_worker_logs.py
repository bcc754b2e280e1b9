"""A worker host's log lines carry no DICOM UID, as the gateway's do (gateway/logs.py): every
process that writes log lines sets logging up through ``gateway.logs.configure_logging``. A
job's command (its folders named by a study's UID) is logged by the worker as it starts
the job; the line names the command and hashes the UID."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest
from engine_helpers import cli_env, neurosandbox_bin
from pg_server import fresh_pg_database

from evaluation.log import upgrade as upgrade_run_log
from gateway.jobs import apply_schema, conninfo

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
UID = "1.2.826.0.1.3680043.8.498.99887766554433221100"


def test_a_worker_s_log_lines_hash_the_uids_they_would_name(pg_url: str, tmp_path: Path) -> None:
    url = fresh_pg_database(pg_url)
    upgrade_run_log(url)
    apply_schema(url)
    # a shard job whose suite and run folders are named by a study's UID (an operator's names)
    argv = ["eval", "--suite", str(tmp_path / "suites" / UID), "--out",
            str(tmp_path / "runs" / UID), "--shard", "0/1"]  # fmt: skip
    with psycopg.connect(conninfo(url)) as conn:
        conn.execute(
            "INSERT INTO job_outbox (task, queueing_lock, lock, args, created_at) "
            "VALUES ('eval_shard', 'shard-0', NULL, %s, '2026-11-28T00:00:00+00:00')",
            (json.dumps({"argv": argv}),),
        )
    env = {**cli_env(tmp_path), "NEUROSANDBOX_DATABASE_URL": url,
           "NEUROSANDBOX_QUEUE_CHECK_S": "1", "NEUROSANDBOX_QUEUE_HEARTBEAT_S": "0.5"}  # fmt: skip
    out = subprocess.run([neurosandbox_bin(), "worker", "--stop-after", "8"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    text = out.stdout + out.stderr
    assert "neurosandbox eval --suite" in text, text[-3000:]  # the line was written
    assert UID not in text, text[-3000:]
    assert "uid:" in text  # hashed in its place


def test_no_process_sets_logging_up_but_through_the_redacting_filter() -> None:
    """One place for the rule: ``logging.basicConfig`` only in gateway/logs.py."""
    offenders = [
        str(p.relative_to(ROOT))
        for top in ("gateway", "evaluation", "dicom")
        for p in (ROOT / top).rglob("*.py")
        if "basicConfig(" in p.read_text() and p != ROOT / "gateway" / "logs.py"
    ]
    assert offenders == []
