"""One stuck evaluation never stops the queue: each runs in a worker process that is stopped at
the run deadline (NEUROSANDBOX_RUN_DEADLINE_S); the run fails saying so, in the API and in the
review queue, and the next study is evaluated.

Real peers: dcmtk storescu -> `neurosandbox serve` -> the session's Orthanc. Study A comes from
an AE the routing file sends to a model whose (loopback, OpenAI-compatible) server never
answers; study B, sent right after, goes to the reference model.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gateway_process import Gateway, running_gateway, send
from gateway_synth import make_study
from guard import procs
from openai_server import OpenAIServer, Script
from orthanc_fixture import OrthancServer

from dicom import IndexResult
from gateway.auth import Role, TokenStore
from gateway.pipeline import failure_text
from gateway.routing import Route
from gateway.runs.results import EvaluationResult
from gateway.workers import EvaluationAbandonedError, EvaluationWorkerError, ProcessEvaluator

QUIET = 1.5
DEADLINE = 45.0  # s: a worker imports ~6 s, litellm ~7 s more (busy 2 cores); B needs ~15 s
REASON = f"evaluation exceeded the {DEADLINE:g} s deadline: worker stopped"
ROUTING = """rules:
  - name: stuck-model
    match: {calling_aet: ["HANG_*"]}
    evaluate: {models: [stuck-vlm], tasks: [differential], series_classes: [FLAIR, T2]}
  - name: mr
    match: {modality: [MR]}
    evaluate: {models: [reference/image-rules], tasks: [differential], series_classes: [FLAIR, T2]}
"""


def _workers(parent: int) -> set[int]:
    """The evaluation worker processes of the gateway (spawned children)."""
    return {pid for pid, ppid, _, cmd in procs() if ppid == parent and "spawn_main" in cmd}


def _await_workers(parent: int, count: int, timeout_s: float = 60) -> set[int]:
    """The workers once ``count`` are seen. A spawned child shows the parent's command line
    between fork and exec, so a worker just started may not be recognisable yet."""
    until = time.monotonic() + timeout_s
    while len(seen := _workers(parent)) < count and time.monotonic() < until:
        time.sleep(0.05)
    return seen


def _runs_of(gw: Gateway, study_uid: str) -> list[dict[str, Any]]:
    return [r for r in gw.get("/runs", gw.reviewer).json() if r["study_uid"] == study_uid]


@pytest.mark.integration
def test_a_stuck_evaluation_is_stopped_at_the_deadline_and_the_next_study_goes_on(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    reviewer = tokens.create(Role.REVIEWER, "deadline-reviewer", "Reviewer^Deadline")[1]
    admin = tokens.create(Role.ADMIN, "deadline-admin")[1]
    routing = tmp_path / "routing.yaml"
    routing.write_text(ROUTING)
    a = make_study(tmp_path / "a", lesion="left", patient_id="NSBX-STUCK-A")
    b = make_study(tmp_path / "b", lesion="right", patient_id="NSBX-NEXT-B")
    with OpenAIServer(Script(hold_after=0)) as server:  # holds every request, never answers
        models = tmp_path / "models.yaml"
        models.write_text(
            f"models:\n  - name: stuck-vlm\n    model: openai/stuck\n"
            f"    api_base: {server.url}\n    max_retries: 0\n"
        )
        with running_gateway(
            orthanc_server, tmp_path / "serve.log", reviewer, admin,
            NEUROSANDBOX_STUDY_QUIET_S=str(QUIET), NEUROSANDBOX_ROUTING_FILE=str(routing),
            NEUROSANDBOX_MODELS_FILE=str(models), NEUROSANDBOX_RUN_DEADLINE_S=str(DEADLINE),
        ) as gw:  # fmt: skip
            t0 = time.monotonic()
            send(gw, a.files, "-aet", "HANG_SCANNER")  # the last -aet wins
            send(gw, b.files)
            # A's run, and the worker processes seen while it is not finished
            seen: set[int] = set()
            run_a: dict[str, Any] = {}
            until = t0 + QUIET + DEADLINE + 60
            while time.monotonic() < until:
                found = _runs_of(gw, a.study_uid)
                run_a = found[0] if found else {}
                if run_a.get("status") in ("done", "failed", "skipped"):
                    break
                seen |= _workers(gw.proc.pid)
                time.sleep(0.2)
            took_a = time.monotonic() - t0
            log = gw.log.read_text()[-3000:]
            assert run_a.get("status") == "failed", (run_a, log)
            assert run_a["error"] == REASON, (run_a, log)
            assert server.stats.calls >= 1  # it was stuck in the model call
            assert seen, "the evaluation did not run in a worker process"

            # The next study was evaluated after it, with the reference model.
            run_b = gw.wait_run(_runs_of(gw, b.study_uid)[0]["run_id"], timeout=DEADLINE + 60)
            took_b = time.monotonic() - t0
            assert run_b["status"] == "done", (run_b, gw.log.read_text()[-3000:])
            assert run_b["route"]["models"] == ["reference/image-rules"]
            assert run_b["started_at"] >= run_a["finished_at"]

            # No worker left but the idle gateway's one spare (NEUROSANDBOX_WARM_WORKER): A's
            # was stopped with its process group, B's ended.
            until = time.monotonic() + 15
            while len(_workers(gw.proc.pid)) > 1 and time.monotonic() < until:
                time.sleep(0.2)
            left = _workers(gw.proc.pid)
            assert len(left) <= 1 and not left & seen, (left, seen)
            alive = procs()
            assert not [p for p in alive if p[0] in seen or p[2] in seen], alive

            # The review queue lists A's run as failed, with the reason.
            page = gw.get("/review", gw.reviewer)
            assert page.status_code == 200
            row = re.search(rf'data-gateway-run="{run_a["run_id"]}".*?</tr>', page.text, flags=re.S)
            assert row and REASON in html.unescape(row.group(0)), page.text[-3000:]
    print(f"A failed after {took_a:.1f} s (deadline {DEADLINE:g} s), B done after {took_b:.1f} s")
    assert took_a < QUIET + DEADLINE + 30


# --------------------------------------------------------------------------- the worker alone

ROUTE = Route(rule="t", models=["reference/image-rules"], tasks=[], series_classes=["FLAIR"])


class Stuck:
    """Starts a grandchild (its pid in work_dir/child.pid), then never returns."""

    name = "stuck"

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        child = subprocess.Popen(["sleep", "600"])
        (work_dir / "child.pid").write_text(str(child.pid))
        time.sleep(600)
        raise AssertionError("not reached")


class Broken:
    name = "broken"

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        raise ValueError("no DICOM series in the study folder")


def _alive(pid: int) -> bool:
    return any(p[0] == pid for p in procs())


def test_the_worker_and_what_it_started_are_stopped_at_the_deadline(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(EvaluationAbandonedError) as err:
        ProcessEvaluator(Stuck(), deadline_s=8).evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
    took = time.monotonic() - t0
    assert failure_text(err.value) == "evaluation exceeded the 8 s deadline: worker stopped"
    assert 8 <= took < 8 + 10, took
    child = int((tmp_path / "child.pid").read_text())
    assert not _alive(child), "the worker's own child outlived it"
    assert not _workers(os.getpid())


def test_a_failure_in_the_worker_is_the_run_error_it_was(tmp_path: Path) -> None:
    with pytest.raises(EvaluationWorkerError) as err:
        ProcessEvaluator(Broken(), deadline_s=60).evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
    assert failure_text(err.value) == "ValueError: no DICOM series in the study folder"
    assert not _workers(os.getpid())


def test_cancel_stops_the_running_worker_and_refuses_new_ones(tmp_path: Path) -> None:
    worker = ProcessEvaluator(Stuck(), deadline_s=600)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    until = time.monotonic() + 30
    while not (tmp_path / "child.pid").exists() and time.monotonic() < until:
        time.sleep(0.1)
    worker.cancel()
    t.join(15)
    assert not t.is_alive() and len(errors) == 1, errors
    assert isinstance(errors[0], EvaluationAbandonedError) and "gateway stopped" in str(errors[0])
    assert not _workers(os.getpid())
    with pytest.raises(EvaluationAbandonedError):
        worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())


# --------------------------------------------------------------------------- the spare worker


class Warmed:
    """Records in which process and when it was warmed and when it evaluated."""

    name = "warmed"

    def __init__(self, log: Path) -> None:
        self.log = log

    def warm(self) -> None:
        with self.log.open("a") as fh:
            fh.write(f"warm {os.getpid()} {time.time()}\n")

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        with self.log.open("a") as fh:
            fh.write(f"evaluate {os.getpid()} {time.time()}\n")
        raise ValueError(f"evaluated in {os.getpid()}")


def _log(path: Path) -> list[tuple[str, int, float]]:
    if not path.exists():
        return []
    return [
        (w, int(p), float(t)) for w, p, t in (x.split() for x in path.read_text().split("\n") if x)
    ]


def test_a_spare_worker_is_started_ahead_and_evaluates_one_study(tmp_path: Path) -> None:
    log = tmp_path / "log"
    worker = ProcessEvaluator(Warmed(log), deadline_s=60, warm=True)
    try:
        worker.prepare()
        until = time.monotonic() + 60
        while not _log(log) and time.monotonic() < until:
            time.sleep(0.05)
        ((what, spare, warmed_at),) = _log(log)
        assert what == "warm" and spare in _workers(os.getpid())
        worker.prepare()  # one spare at most
        assert _workers(os.getpid()) == {spare}
        asked = time.time()
        with pytest.raises(EvaluationWorkerError, match=f"evaluated in {spare}"):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        # the study went to the spare, warmed before the study was asked for
        assert _log(log)[1][:2] == ("evaluate", spare) and warmed_at < asked
        assert not _workers(os.getpid()), "a worker evaluates one study and ends"
        # without a spare, a worker is started for the study (and warmed first)
        with pytest.raises(EvaluationWorkerError):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        events = _log(log)[2:]
        assert [e[0] for e in events] == ["warm", "evaluate"] and events[0][1] != spare
        # a spare that died is replaced, not handed the study
        worker.prepare()
        until = time.monotonic() + 60
        while len(_log(log)) < 5 and time.monotonic() < until:
            time.sleep(0.05)
        dead = _log(log)[4][1]
        os.kill(dead, 9)
        time.sleep(0.5)
        with pytest.raises(EvaluationWorkerError):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        assert _log(log)[-1][0] == "evaluate" and _log(log)[-1][1] != dead
        worker.prepare()
        assert _await_workers(os.getpid(), 1)
    finally:
        worker.cancel()  # the gateway stopping: the spare goes too
    assert not _workers(os.getpid())
    with pytest.raises(EvaluationAbandonedError):
        worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())


def test_a_spare_worker_is_stopped_at_the_deadline_like_any(tmp_path: Path) -> None:
    worker = ProcessEvaluator(Stuck(), deadline_s=6, warm=True)
    try:
        worker.prepare()
        (spare,) = _await_workers(os.getpid(), 1)
        with pytest.raises(EvaluationAbandonedError, match="6 s deadline"):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
    finally:
        worker.cancel()  # a failed check leaves no worker behind for the next test
    child = int((tmp_path / "child.pid").read_text())
    assert not _alive(child) and not _alive(spare)
    assert not _workers(os.getpid())


class SlowStart:
    """A worker that takes long to start (its warm-up hangs) before it reads its job."""

    name = "slow-start"

    def warm(self) -> None:
        time.sleep(40)

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        raise AssertionError("not reached within the deadline")


def test_the_deadline_counts_while_the_job_is_handed_to_a_stuck_worker(tmp_path: Path) -> None:
    """A job larger than a pipe holds (a real study's index with its kept headers) is sent
    while the worker is stuck before reading it: the deadline still stops it."""
    big = tmp_path / ("x" * 300_000)  # pickles to more than the 64 KiB a pipe buffers
    t0 = time.monotonic()
    with pytest.raises(EvaluationAbandonedError, match="5 s deadline"):
        ProcessEvaluator(SlowStart(), deadline_s=5).evaluate(big, ROUTE, tmp_path, IndexResult())
    took = time.monotonic() - t0
    assert took < 5 + 10, took
    assert not _workers(os.getpid())
