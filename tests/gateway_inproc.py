"""A gateway in this process on the session Orthanc (the same code ``neurosandbox serve`` runs,
the evaluator in process: fast), and waiting for its runs: shared by the gateway tests. For the
gateway on the queue (a PostgreSQL run log and its queue's tables): the gateway whose evaluator
must not run (``queue_gateway``), a ``neurosandbox worker`` process on another "host"
(``start_worker``), and what a hospital checks in Orthanc afterwards."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pydicom
import pytest
import yaml
from engine_helpers import cli_env, neurosandbox_bin
from orthanc_fixture import OrthancServer
from pg_server import fresh_pg_database

from evaluation.log import upgrade as upgrade_run_log
from gateway.jobs import apply_schema, conninfo
from gateway.orthanc import OrthancClient
from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway, build_gateway
from gateway.study_key import StudyKey
from gateway.study_run import DefaultEvaluator

SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"


def rules_file(
    path: Path, tasks: list[str], name: str | None = None, models: list[str] | None = None
) -> Path:
    """A routing file with one rule for every study: these task families (and these models;
    None: the rule's default)."""
    evaluate = {"tasks": tasks} if models is None else {"tasks": tasks, "models": models}
    rule = {"name": name or f"rule-{'-'.join(tasks)}", "evaluate": evaluate}
    path.write_text(yaml.safe_dump({"rules": [rule]}))
    return path


def start_gateway(
    orthanc_server: OrthancServer, data: Path, routing: Path, quiet_s: float, **extra: Any
) -> Gateway:
    """Build and start a gateway on ``data`` (settings: the session Orthanc's, plus ``extra``)."""
    ep = orthanc_server.endpoints
    settings = orthanc_server.settings.model_copy(
        update={
            "data_dir": data,
            "study_quiet_s": quiet_s,
            "routing_file": routing,
            "orthanc_url": ep.orthanc_url,
            "orthanc_password_file": Path(ep.password_file or ""),
            **extra,
        }
    )
    gw = build_gateway(settings)
    gw.pipeline.evaluator = DefaultEvaluator(settings)
    gw.start()
    return gw


def finished_runs(
    gw: Gateway, n: int, study_uid: str | None = None, timeout_s: float = 90
) -> list[RunRecord]:
    """The runs (of ``study_uid`` only, when given) once ``n`` have finished and the pipeline
    is idle, newest first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = gw.ctx.runs.list(study_uid=study_uid)
        done = [r for r in runs if r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)]
        if len(done) >= n and gw.pipeline.wait_idle(1):
            return done
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} finished runs: {gw.ctx.runs.list(study_uid=study_uid)}")


# --------------------------------------------------------------------------- the gateway on the queue


class NotHere:
    """The gateway's evaluator: a study evaluated in the gateway's process fails the test."""

    name = "must-not-run"

    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        raise AssertionError("the gateway evaluated a study in its own process")


@dataclass
class QueueGateway:
    gw: Gateway
    here: NotHere  # the gateway's evaluator (``here.calls`` must stay 0)
    url: str  # the run log's and the queue's PostgreSQL database
    shared: Path  # NEUROSANDBOX_SHARED_DIR, mounted at this path on the gateway and every worker
    env: dict[str, str]  # a worker host's settings (its own DATA_DIR)


def queue_gateway(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path, routing: Path
) -> QueueGateway:
    """A fresh PostgreSQL database upgraded as `neurosandbox db upgrade` does (the run log's
    schema and the queue's tables), and a gateway on it that hands its studies to the queue."""
    url = fresh_pg_database(pg_url)
    upgrade_run_log(url)
    apply_schema(url)
    shared = tmp_path / "shared"
    ep = orthanc_server.endpoints
    env = {
        "NEUROSANDBOX_DATA_DIR": str(tmp_path / "worker-data"),  # the worker host's own
        "NEUROSANDBOX_SHARED_DIR": str(shared),
        "NEUROSANDBOX_DATABASE_URL": url,
        "NEUROSANDBOX_ORTHANC_URL": ep.orthanc_url,
        "NEUROSANDBOX_ORTHANC_PASSWORD_FILE": str(ep.password_file),
        "NEUROSANDBOX_QUEUE_HEARTBEAT_S": "0.5",
        "NEUROSANDBOX_QUEUE_CHECK_S": "1",
        "NEUROSANDBOX_RUN_DEADLINE_S": "60",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    gw = start_gateway(
        orthanc_server, tmp_path / "gateway-data", routing, 1.0, database_url=url, shared_dir=shared
    )
    here = NotHere()
    gw.pipeline.evaluator = here  # type: ignore[assignment]
    return QueueGateway(gw, here, url, shared, env)


def start_worker(
    q: QueueGateway, tmp_path: Path, log: Path, stop_after_s: float = 60
) -> subprocess.Popen[bytes]:
    """`neurosandbox worker --stop-after` on another "host" (its own DATA_DIR), output in ``log``."""
    return subprocess.Popen(
        [neurosandbox_bin(), "worker", "--stop-after", str(stop_after_s)],
        env={**cli_env(tmp_path), **q.env}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the worker if it still runs (SIGKILL after 15 s)."""
    if worker is not None and worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(conninfo(url), connect_timeout=5) as c:
        return list(c.execute(sql.encode()).fetchall())


def until(what: str, ok: Callable[[], bool], logs: list[Path], timeout_s: float = 30) -> None:
    """Wait for ``ok``; fail with the tail of ``logs`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            text = "\n".join(f"{p.name}: {p.read_text()[-2500:]}" for p in logs if p.exists())
            pytest.fail(f"{what}: not within {timeout_s} s\n{text}")
        time.sleep(0.1)


def pacs_client(server: OrthancServer) -> OrthancClient:
    """A client of the session Orthanc, as the gateway reaches it."""
    return OrthancClient.from_settings(server.settings.model_copy(update={
        "orthanc_url": server.endpoints.orthanc_url,
        "orthanc_password_file": Path(server.endpoints.password_file or "")}))  # fmt: skip


def study_classes(server: OrthancServer, key: StudyKey) -> list[str]:
    """The SOP classes of the patient's study in Orthanc (found by its UID and patient)."""
    client = pacs_client(server)
    sid = client.find_study_of(key.study_uid, key.patient_id)
    if sid is None:
        return []
    return [client.instance_metadata(i["ID"]).get("SopClassUid", "")
            for i in client.study_instances(sid)]  # fmt: skip


def instance_of(server: OrthancServer, sop_uid: str) -> pydicom.Dataset:
    """The instance ``sop_uid`` as Orthanc stores it."""
    client = pacs_client(server)
    iid = client.find_instance(sop_uid)
    assert iid is not None
    raw = client.api.get(f"{client.url}/instances/{iid}/file").content
    return pydicom.dcmread(io.BytesIO(raw))
