"""The built-in ``Evaluator``: one received study, run through the evaluation engine.

What it does, plainly:
1. The study's one index (the pipeline's, headers kept) picks the series of the routed classes.
   The engine's case lives in memory: the registered case of this StudyInstanceUID when the
   team registered one (``NEUROSANDBOX_CASES``, ``evaluation.registered_case``: its EHR, note,
   ground truth and scripted turns), else the study alone. No suite is written to disk.
2. ``evaluation.render_study`` renders the received study from that index (a labelled montage
   per series, one slice for classification) into the run folder; no header is read again.
   Every series it leaves out (not routed, localizer, unreadable, over the plan's limit...)
   is recorded with why on the case (``Provenance.series_not_shown``), so the run's record
   and the checklist say so; the SR cites the series shown.
3. ``evaluation.start_run`` asks every routed model every routed task (multi-turn only for a
   registered case with turns): the built-in reference models in process, litellm models (any
   other name, or a models-file entry) through the engine's PHI gate (de-identified unless their
   endpoint is trusted) with every outbound payload audited in the run store.
4. The engine records the run in its run store in the run folder (``run.sqlite``), the one
   record of the run; the pipeline reads it back as ``RunData``, the input of the report
   bundle (whose ``rundata.json`` ``neurosandbox report`` reads) and the review pages. A
   registered case's answers are scored against its truth; a clinical study alone has none,
   and nothing is scored.

The service runs it through ``ProcessEvaluator``: each evaluation in a spawned worker process
(its own process group), abandoned at a deadline (``NEUROSANDBOX_RUN_DEADLINE_S``: SIGTERM to
the group, SIGKILL after a grace period, the worker reaped), so one stuck model call, render or
replay never stops the queue. The worker's ``EvaluationResult`` (the study's facts beside the
run) comes back pickled, typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from dicom import IndexResult, index_path, one_patient
from evaluation import (
    STORE_FILE,
    Dataset,
    DatasetSpec,
    GenerateConfig,
    ImageRef,
    Provenance,
    RenderPlan,
    RunConfig,
    TaskFamily,
    dataset_hash,
    registered_case,
    render_study,
    run_from_store,
    start_run,
    warm_up,
)
from evaluation import Case as EvalCase
from gateway.results import EvaluationResult
from gateway.routing import Route
from gateway.settings import Settings

log = logging.getLogger(__name__)

# Clinical use: the most likely answer, as JSON, once per model and task.
GENERATE = GenerateConfig(temperature=0.0, max_tokens=2048, json_mode=True)
STOP_GRACE_S = 5.0  # after SIGTERM, how long a worker may take before SIGKILL


class DefaultEvaluator:
    name = "neurosandbox-gateway-engine-0.4"

    def __init__(self, settings: Settings, plan: RenderPlan | None = None) -> None:
        self.settings = settings
        self.plan = plan or RenderPlan()

    @staticmethod
    def warm() -> None:
        """Import what an evaluation loads on first use (a spare worker, while idle)."""
        warm_up()

    def _registered(self, study_uid: str, patient_id: str) -> tuple[EvalCase | None, list[str]]:
        """The registered case of this study of this patient (``NEUROSANDBOX_CASES``), if any."""
        if self.settings.cases is None:
            return None, []
        case, problems = registered_case(self.settings.cases, study_uid, patient_id)
        return case, [f"case registry: {p}" for p in problems]

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult | None = None
    ) -> EvaluationResult:
        index = index or index_path(study_dir, workers=1, keep_headers=True)
        if not index.series:
            raise ValueError("no DICOM series in the study folder")
        routed = [s for s in index.series if s.series_class.value in route.series_classes]
        if not routed:
            found = sorted({s.series_class.value for s in index.series})
            raise ValueError(
                f"no series of the routed classes {route.series_classes}; found {found}"
            )
        # the evaluated images' study (a non-image object is listed without one, sorted first)
        study_uid = routed[0].study_uid
        known, warnings = self._registered(study_uid, one_patient(index).patient_id)
        scripted = known is not None and bool(known.turns)
        tasks = [t for t in route.tasks if t is not TaskFamily.MULTITURN or scripted]
        if not tasks:
            raise ValueError(f"routing rule {route.rule!r} names no task a received study can run")
        # The engine's case, in memory: the registered one (record, note, truth, turns) when
        # the team registered this study, else the study alone. Its images are the study's
        # as received, rendered from the one index.
        if known is not None:
            case = known.model_copy(deep=True)
            case.images, case.tasks = [], list(route.tasks)
            case.provenance = case.provenance.model_copy(update={"source": "gateway"})
        else:
            case = EvalCase(
                case_id=f"study-{study_uid[-16:]}",
                tasks=list(route.tasks),
                provenance=Provenance(source="gateway", study_uids=[study_uid]),
            )
        case.root = str(work_dir)
        cache = work_dir / "render"
        plan = self.plan.model_copy(update={"series_classes": list(route.series_classes)})
        rendered = render_study(study_dir, case, cache, plan, self.settings.memory_cap, index)
        case.images = rendered.images
        if rendered.burned_in_series:  # the PHI gate drops these images for remote models
            case.provenance.burned_in_series = rendered.burned_in_series
        # every series the images leave out, and why: in the run's record and the checklist
        case.provenance.series_not_shown = rendered.series_not_shown
        if rendered.series_not_shown is not None and rendered.series_not_shown.total:
            warnings.append(f"series: {rendered.series_not_shown.counts_text()}")
        if rendered.identity is not None:  # the study as received, not only the routed series
            case.provenance.identity = rendered.identity.model_copy(
                update={
                    "n_series": len({s.series_uid for s in index.series}),
                    "modalities": sorted({s.modality for s in index.series if s.modality}),
                }
            )
        warnings += rendered.warnings
        if len(tasks) < len(route.tasks):
            warnings.append("multi-turn not run: it needs a scripted case (turns), not a study")
        # The dataset exists only in memory: the run store records the case, the report
        # bundle (rundata.json) the whole run.
        spec = DatasetSpec(path=str(study_dir.resolve()), kind="memory", render=plan)
        dataset = Dataset(
            name="PACS study", kind="memory", spec=spec, cases=[case], hash=dataset_hash([case])
        )
        config = RunConfig.from_settings(
            self.settings,
            spec,
            models=list(route.models),
            cache_dir=cache,
            run_id=work_dir.name,
            tasks=tasks,
            generate=GENERATE.model_copy(),
            bertscore=False,
        )
        # the run's record: the engine's run store in the run folder (the gateway's note in
        # it already), read back with the case as held here (a registered case's record and
        # note are not in the store)
        asyncio.run(start_run(config, work_dir, dataset=dataset))
        run = run_from_store(work_dir / STORE_FILE, dataset=dataset)
        run.title = f"PACS study, routing rule {route.rule}"
        return EvaluationResult(
            evaluator=self.name,
            study_uid=study_uid,
            images=_publish(case.images, work_dir / "images"),
            # what the model was shown, not every routed series (the SR cites these)
            evaluated_series_uids=sorted({i.series_uid for i in case.images if i.series_uid}),
            warnings=warnings,
            run=run,
        )


def _publish(refs: list[ImageRef], folder: Path) -> list[ImageRef]:
    """Copy the PNGs next to the run (the API serves them from there)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for ref in refs:
        name = Path(ref.path).name
        shutil.copyfile(ref.path, folder / name)
        out.append(ref.model_copy(update={"path": f"images/{name}"}))
    return out


# --------------------------------------------------------------------------- worker process


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
    is idle): spawning Python and importing the engine costs 1-2 s, longer while the PACS is
    still storing the study, and is then paid before the study arrives, not after. Each worker
    still evaluates one study and ends. ``cancel`` (the gateway stopping) stops the running
    worker and the spare, and refuses further evaluations."""

    def __init__(
        self,
        inner: StudyEvaluator,
        deadline_s: float,
        init: Callable[[], None] | None = None,
        warm: bool = False,
    ) -> None:
        self.inner, self.deadline_s, self.init, self.warm = inner, deadline_s, init, warm
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
