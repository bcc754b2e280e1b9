"""The evaluation worker process alone (gateway.workers.ProcessEvaluator): stopped with what it
started at the deadline, its failure the run's error, cancelled when the gateway stops, and the
spare worker started ahead. The gateway end to end: tests/test_run_deadline.py (a separate
module, so that the two halves can run on both test workers).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from guard import await_spawned_workers, procs, spawned_workers
from worker_jobs import Broken, SlowStart, Stuck, Warmed

from dicom import IndexResult
from gateway.audit import AuditLog
from gateway.cache import InstanceCache
from gateway.orthanc import OrthancClient
from gateway.pipeline import StudyPipeline, failure_text
from gateway.routing import Route, Router
from gateway.runs import StudyRunStore
from gateway.workers import EvaluationAbandonedError, EvaluationWorkerError, ProcessEvaluator

ROUTE = Route(rule="t", models=["reference/image-rules"], tasks=[], series_classes=["FLAIR"])


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
    assert not spawned_workers(os.getpid())


def test_a_failure_in_the_worker_is_the_run_error_it_was(tmp_path: Path) -> None:
    with pytest.raises(EvaluationWorkerError) as err:
        ProcessEvaluator(Broken(), deadline_s=60).evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
    assert failure_text(err.value) == "ValueError: no DICOM series in the study folder"
    assert not spawned_workers(os.getpid())


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
    assert not spawned_workers(os.getpid())
    with pytest.raises(EvaluationAbandonedError):
        worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())


# --------------------------------------------------------------------------- the spare worker


def _log(path: Path) -> list[tuple[str, int, float]]:
    if not path.exists():
        return []
    return [
        (w, int(p), float(t)) for w, p, t in (x.split() for x in path.read_text().split("\n") if x)
    ]


def _await_log(path: Path, entry: tuple[str, int]) -> list[tuple[str, int, float]]:
    until = time.monotonic() + 60
    while entry not in [e[:2] for e in _log(path)] and time.monotonic() < until:
        time.sleep(0.05)
    return _log(path)


def test_a_spare_worker_is_started_ahead_and_evaluates_one_study(tmp_path: Path) -> None:
    log = tmp_path / "log"
    waiting = [False]  # the pipeline's queue: whether another study waits
    worker = ProcessEvaluator(Warmed(log), deadline_s=60, warm=True, waiting=lambda: waiting[0])
    try:
        worker.prepare()
        until = time.monotonic() + 60
        while not _log(log) and time.monotonic() < until:
            time.sleep(0.05)
        ((what, spare, warmed_at),) = _log(log)
        assert what == "warm" and spare in spawned_workers(os.getpid())
        worker.prepare()  # one spare at most
        assert spawned_workers(os.getpid()) == {spare}
        asked = time.time()
        with pytest.raises(EvaluationWorkerError, match=f"evaluated in {spare}"):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        # the study went to the spare, warmed before the study was asked for
        assert _log(log)[1][:2] == ("evaluate", spare) and warmed_at < asked
        # it evaluated one study and ended; with no study waiting, no spare was started
        # during it (a lone study keeps the machine; the pipeline prepares when idle)
        assert not spawned_workers(os.getpid()), "a worker evaluates one study and ends"
        worker.prepare()  # the pipeline idle again
        (following,) = await_spawned_workers(os.getpid(), 1)
        assert following != spare
        worker.prepare()  # one spare at most
        assert spawned_workers(os.getpid()) == {following}
        _await_log(log, ("warm", following))
        waiting[0] = True  # a study waits behind the next one: its worker starts at once
        with pytest.raises(EvaluationWorkerError, match=f"evaluated in {following}"):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        # a spare that died is replaced, not handed the study: a worker is started for the
        # study (and warmed first)
        (dead,) = await_spawned_workers(os.getpid(), 1)
        assert dead != following
        _await_log(log, ("warm", dead))
        os.kill(dead, 9)
        time.sleep(0.5)
        waiting[0] = False
        with pytest.raises(EvaluationWorkerError):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
        events = [e[:2] for e in _log(log)]
        what, evaluated = events[-1]
        assert what == "evaluate" and evaluated not in (dead, spare, following)
        assert events.index(("warm", evaluated)) < len(events) - 1
        worker.prepare()
        assert await_spawned_workers(os.getpid(), 1)
    finally:
        worker.cancel()  # the gateway stopping: the spare goes too
    assert not spawned_workers(os.getpid())
    with pytest.raises(EvaluationAbandonedError):
        worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())


def test_a_spare_worker_is_stopped_at_the_deadline_like_any(tmp_path: Path) -> None:
    worker = ProcessEvaluator(Stuck(), deadline_s=6, warm=True)
    try:
        worker.prepare()
        (spare,) = await_spawned_workers(os.getpid(), 1)
        with pytest.raises(EvaluationAbandonedError, match="6 s deadline"):
            worker.evaluate(tmp_path, ROUTE, tmp_path, IndexResult())
    finally:
        worker.cancel()  # a failed check leaves no worker behind for the next test
    child = int((tmp_path / "child.pid").read_text())
    assert not _alive(child) and not _alive(spare)
    assert not spawned_workers(os.getpid())


def test_the_deadline_counts_while_the_job_is_handed_to_a_stuck_worker(tmp_path: Path) -> None:
    """A job larger than a pipe holds (a real study's index with its kept headers) is sent
    while the worker is stuck before reading it: the deadline still stops it."""
    big = tmp_path / ("x" * 300_000)  # pickles to more than the 64 KiB a pipe buffers
    t0 = time.monotonic()
    with pytest.raises(EvaluationAbandonedError, match="5 s deadline"):
        ProcessEvaluator(SlowStart(), deadline_s=5).evaluate(big, ROUTE, tmp_path, IndexResult())
    took = time.monotonic() - t0
    assert took < 5 + 10, took
    assert not spawned_workers(os.getpid())


class _Spares:
    """An evaluator that only counts the pipeline's requests for a spare worker."""

    name = "spares"

    def __init__(self) -> None:
        self.asked = 0

    def prepare_soon(self) -> None:
        self.asked += 1

    def evaluate(self, *args: object) -> None:  # pragma: no cover - the pipeline never runs
        raise AssertionError("not started")


def test_a_study_queued_behind_a_running_one_starts_its_worker_ahead(tmp_path: Path) -> None:
    """The pipeline asks for the spare as soon as a study waits behind another (its worker then
    imports while the one ahead runs, also to its deadline), never for a lone study."""
    spares = _Spares()
    pipeline = StudyPipeline(
        OrthancClient("http://127.0.0.1:9", "u", "p"),
        spares,
        Router(),  # never called
        StudyRunStore(tmp_path),
        AuditLog(tmp_path / "audit.jsonl"),
        InstanceCache(tmp_path / "c"),
    )  # fmt: skip  (never started: the first job stands for the study being evaluated)
    pipeline.on_stable("study-a")
    assert spares.asked == 0
    pipeline.on_stable("study-a")  # merged into the queued run: nothing more waits
    assert spares.asked == 0
    pipeline.on_stable("study-b")
    assert spares.asked == 1
