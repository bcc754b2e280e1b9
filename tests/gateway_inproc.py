"""A gateway in this process on the session Orthanc (the same code ``neurosandbox serve`` runs,
the evaluator in process: fast), and waiting for its runs: shared by the gateway tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from orthanc_fixture import OrthancServer

from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway, build_gateway
from gateway.study_run import DefaultEvaluator


def rules_file(path: Path, tasks: list[str], name: str | None = None) -> Path:
    """A routing file with one rule for every study: these task families."""
    rule = {"name": name or f"rule-{'-'.join(tasks)}", "evaluate": {"tasks": tasks}}
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
