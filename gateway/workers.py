"""Evaluations in worker processes: ``ProcessEvaluator`` runs each evaluation of a study (a
``StudyEvaluator``, the built-in one being ``gateway.study_run.DefaultEvaluator``) in a spawned
worker process (its own process group), abandoned at a deadline (``NEUROSANDBOX_RUN_DEADLINE_S``:
SIGTERM to the group, SIGKILL after a grace period, the worker reaped), so one stuck model call,
render or replay never stops the queue. The worker's ``EvaluationResult`` (the study's facts
beside the run) comes back pickled, typed. A spare worker imports what the evaluation needs
ahead: started while the gateway is idle, and while a study runs as soon as another waits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from dicom import IndexResult
from gateway.routing import Route
from gateway.runs.results import EvaluationResult

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0  # after SIGTERM, how long a worker may take before SIGKILL


class StudyEvaluator(Protocol):
    """What ``ProcessEvaluator`` runs in its worker (``gateway.pipeline.Evaluator``)."""

    name: str

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult: ...


class WorkerFailure(BaseModel):
    """How an evaluation failed in its worker process: the exception's class name and text."""

    kind: str
    message: str


class EvaluationAbandonedError(RuntimeError):
    """The evaluation's worker was stopped (its deadline passed, the gateway stopped); the
    message is the reason the run records."""


class EvaluationWorkerError(RuntimeError):
    """The evaluation raised in its worker; ``kind`` is the exception's class name there."""

    def __init__(self, failure: WorkerFailure) -> None:
        super().__init__(failure.message)
        self.kind = failure.kind


def _worker_main(
    evaluator: StudyEvaluator,
    jobs: Connection,
    conn: Connection,
    init: Callable[[], None] | None,
    parent: int,
) -> None:
    """The worker process: its own process group (stopped as one, with any process it
    starts), killed with the gateway (Linux PR_SET_PDEATHSIG). It imports what the evaluation
    needs (``warm``), waits for one job, evaluates it and sends the result or failure back.
    A spare worker does the first part while the gateway is idle; no job (the pipe closed)
    ends it."""
    os.setpgrp()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the gateway ended before the line above
        os._exit(1)
    if init is not None:
        init()
    warm = getattr(evaluator, "warm", None)
    if callable(warm):
        try:
            warm()
        except Exception:  # the evaluation imports again and says what is wrong
            log.exception("warming the evaluation worker failed")
    try:
        job = jobs.recv()
    except (EOFError, OSError):  # a spare never used: the gateway stopped or replaced it
        os._exit(0)
    finally:
        jobs.close()
    study_dir, route, work_dir, index = job
    outcome: EvaluationResult | WorkerFailure
    try:
        outcome = evaluator.evaluate(study_dir, route, work_dir, index)
    except Exception as exc:
        log.exception("evaluation failed in its worker process")
        outcome = WorkerFailure(kind=type(exc).__name__, message=str(exc))
    try:
        conn.send(outcome)
    except Exception as exc:  # an unpicklable result: say so rather than end silently
        conn.send(WorkerFailure(kind=type(exc).__name__, message=f"result not sent back: {exc}"))
    finally:
        conn.close()
    _exit_now()


def _exit_now() -> None:
    """End the worker once its outcome is sent: the exit handlers run (temporary folders,
    logging's flush), the interpreter's teardown of the engine's modules does not (1.2-2 s of
    CPU on this machine, which the gateway waited for before its write-back)."""
    import atexit

    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        os._exit(0)


def _send_job(worker: _Worker, job: tuple[Path, Route, Path, IndexResult]) -> None:
    """Hand the job to the worker, then close the pipe (a worker that already ended, or was
    stopped meanwhile: its outcome says how)."""
    with contextlib.suppress(OSError, ValueError):
        worker.jobs.send(job)
    with contextlib.suppress(OSError):
        worker.jobs.close()


@dataclass
class _Worker:
    """A started worker process: the pipe its job goes down, the one its outcome comes up."""

    proc: BaseProcess
    jobs: Connection
    results: Connection

    def discard(self) -> None:
        """Close both ends: an idle worker ends by itself (no job), a busy one is stopped by
        the caller."""
        for c in (self.jobs, self.results):
            with contextlib.suppress(OSError):
                c.close()


def _signal(proc: BaseProcess, sig: signal.Signals) -> None:
    """``sig`` to the worker's process group (the worker and what it started), else to the
    worker alone (it may not have made its group yet)."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def _terminate(proc: BaseProcess) -> None:
    """SIGTERM to the worker's group; SIGKILL when it has not ended after the grace time."""
    _signal(proc, signal.SIGTERM)
    if not _exited(proc, STOP_GRACE_S):
        _signal(proc, signal.SIGKILL)


def _exited(proc: BaseProcess, timeout_s: float) -> bool:
    """Whether the worker ended within ``timeout_s`` (without reaping it)."""
    return bool(wait([proc.sentinel], timeout_s))


class ProcessEvaluator:
    """Runs ``inner`` in a spawned worker process per evaluation, abandoned at ``deadline_s``.

    ``init`` runs first in the worker (the service's logging, which hashes UIDs). With ``warm``
    the evaluator keeps one spare worker started ahead (``prepare``, called when the pipeline
    is idle; ``prepare_soon`` when a study is queued behind a running one, and by ``evaluate``
    when it has taken the spare while ``waiting()`` says another study waits): spawning Python
    and importing the engine costs 1-2 s (6-19 s on a busy machine), and is then paid before
    the study arrives, not after, also for a study queued behind one that runs to its
    deadline. A lone study's evaluation does not share the machine with the next spare's
    imports (they start once the pipeline is idle again). Each worker still evaluates one study
    and ends. ``cancel`` (the gateway stopping) stops the running
    worker and the spare, and refuses further evaluations."""

    def __init__(
        self,
        inner: StudyEvaluator,
        deadline_s: float,
        init: Callable[[], None] | None = None,
        warm: bool = False,
        waiting: Callable[[], bool] | None = None,
    ) -> None:
        self.inner, self.deadline_s, self.init, self.warm = inner, deadline_s, init, warm
        # whether another study waits (the pipeline's queue): only then does a study that
        # takes the spare start the next one at once; a lone study keeps both cores
        self.waiting = waiting
        self.name = inner.name
        self._lock = threading.Lock()
        self._proc: BaseProcess | None = None
        self._spare: _Worker | None = None
        self._stopping: str | None = None

    def _spawn(self) -> _Worker:
        ctx = mp.get_context("spawn")  # never fork: the gateway has threads
        job_reader, job_writer = ctx.Pipe(duplex=False)
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_worker_main,
            args=(self.inner, job_reader, writer, self.init, os.getpid()),
            name="evaluation-worker",
        )
        proc.start()
        job_reader.close()  # the worker holds the only read end of the job pipe
        writer.close()  # and the only write end of the result pipe: its exit is an EOF here
        return _Worker(proc, job_writer, reader)

    def prepare_soon(self) -> None:
        """``prepare`` in a thread of its own (the caller is a study's evaluation or a sender)."""
        if self.warm:
            threading.Thread(target=self.prepare, name="evaluation-spare", daemon=True).start()

    def prepare(self) -> None:
        """Start the spare worker (``warm`` only; nothing when one is ready or alive)."""
        if not self.warm:
            return
        with self._lock:
            if self._stopping:
                return
            spare = self._live_spare()
            if spare is not None:
                self._spare = spare
                return
        worker = self._spawn()
        with self._lock:
            if self._stopping or self._spare is not None:
                extra: _Worker | None = worker
            else:
                self._spare, extra = worker, None
        if extra is not None:
            self._end(extra, STOP_GRACE_S)

    def _live_spare(self) -> _Worker | None:
        """The spare, taken, when it is alive; a dead one is reaped (under the lock)."""
        spare, self._spare = self._spare, None
        if spare is not None and not spare.proc.is_alive():
            self._end(spare, 0.0)
            return None
        return spare

    def _take(self) -> _Worker:
        """The spare when one is alive, else a new worker (under the lock)."""
        return self._live_spare() or self._spawn()

    def _end(self, worker: _Worker, wait_s: float) -> None:
        """Close the worker's pipes (an idle one then ends by itself), then stop and reap it."""
        worker.discard()
        self._stop(worker.proc, wait_s)

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        with self._lock:
            if self._stopping:
                raise EvaluationAbandonedError(self._stopping)
            worker = self._take()
            self._proc = worker.proc
        if self.warm and self.waiting is not None and self.waiting():
            self.prepare_soon()  # the waiting study's worker imports while this one evaluates
        outcome: object = None
        # The job (the index with its kept headers: more than a pipe holds) is sent from a
        # thread: a worker stuck before it reads its job (its start, its warm-up) blocks the
        # send, and the deadline below counts from now all the same.
        sender = threading.Thread(target=_send_job, args=(worker, (study_dir, route, work_dir, index)),
                                  name="evaluation-job", daemon=True)  # fmt: skip
        sender.start()
        try:
            outcome = self._outcome(worker.proc, worker.results)
        finally:
            with self._lock:
                self._proc = None
            # a worker that answered ends by itself; one that did not is stopped now
            self._stop(worker.proc, STOP_GRACE_S if outcome is not None else 0.0)
            sender.join(STOP_GRACE_S)  # the worker's end of the pipe is gone: the send ended
            worker.discard()
        if isinstance(outcome, WorkerFailure):
            raise EvaluationWorkerError(outcome)
        if not isinstance(outcome, EvaluationResult):
            raise TypeError(f"the evaluation worker sent {type(outcome).__name__}")
        return outcome

    def _outcome(self, proc: BaseProcess, reader: Connection) -> object:
        if not reader.poll(self.deadline_s):
            raise EvaluationAbandonedError(
                f"evaluation exceeded the {self.deadline_s:g} s deadline: worker stopped"
            )
        try:
            return reader.recv()
        except (EOFError, OSError):
            _exited(proc, STOP_GRACE_S)
            if self._stopping:
                raise EvaluationAbandonedError(self._stopping) from None
            raise EvaluationAbandonedError(
                f"the evaluation worker ended without a result (exit code {proc.exitcode})"
            ) from None

    @staticmethod
    def _stop(proc: BaseProcess, wait_s: float) -> None:
        """After ``wait_s`` for the worker to end by itself, terminate, then kill, its
        process group; reap the worker."""
        if not _exited(proc, wait_s):
            _terminate(proc)
        else:  # ended by itself; anything it left in its group goes too
            _signal(proc, signal.SIGKILL)
        proc.join(STOP_GRACE_S)
        if proc.is_alive():  # cannot happen after SIGKILL but for an unkillable (D) state
            log.error("evaluation worker %s did not end after SIGKILL", proc.pid)

    def cancel(
        self, reason: str = "the gateway stopped during the evaluation: worker stopped"
    ) -> None:
        """Stop the running worker (its evaluation fails with ``reason``) and the spare, and
        refuse new ones. The running one is only signalled: the evaluating thread reaps it."""
        with self._lock:
            self._stopping = reason
            proc, spare, self._spare = self._proc, self._spare, None
        if spare is not None:
            self._end(spare, 1.0)  # no job: it ends by itself, else it is stopped
        if proc is not None and not _exited(proc, 0):
            _terminate(proc)
