"""``neurosandbox worker``: take jobs from the queue (PostgreSQL run log) and run them."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli.console import ExitCode, fail, note

if TYPE_CHECKING:
    from gateway.pipeline import Evaluator, StudyPipeline
    from gateway.settings import Settings


def worker_command(
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, max=64, help="jobs run at once (default: settings)"),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="the worker's name in the queue")
    ] = None,
    stop_after: Annotated[
        float | None,
        typer.Option("--stop-after", min=0.0, help="stop after this many seconds (tests)"),
    ] = None,
) -> None:
    """Run queued jobs (gateway study runs, shards of `eval --queue`) until stopped.

    Start one on every host that should evaluate, under a supervisor that restarts it
    (systemd: Restart=always); a database outage is waited out (it reconnects). Each job runs
    under the run deadline (NEUROSANDBOX_RUN_DEADLINE_S); a worker silent past
    NEUROSANDBOX_QUEUE_STALL_S has its jobs queued again for the others."""
    from gateway.jobs import QueueError, QueueTimings, run_worker
    from gateway.settings import get_settings

    settings = get_settings()
    if settings.database_url is None:
        raise fail("the queue needs the PostgreSQL run log (NEUROSANDBOX_DATABASE_URL)",
                   ExitCode.USAGE)  # fmt: skip
    timings = QueueTimings(
        heartbeat_s=settings.queue_heartbeat_s,
        stall_s=settings.queue_stall_s,
        check_s=settings.queue_check_s,
        deadline_s=settings.run_deadline_s,
    )
    import logging

    from gateway.logs import configure_logging

    configure_logging()  # UIDs hashed in every line, the jobs' commands' output included
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    note(f"worker: taking jobs (concurrency {concurrency or settings.worker_concurrency})")
    try:
        run_worker(settings.database_url, timings,
                   concurrency=concurrency or settings.worker_concurrency, name=name,
                   stop_after_s=stop_after)  # fmt: skip
    except QueueError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None


def evaluate_study_command(
    run_id: Annotated[str, typer.Argument(help="the gateway run (its id) to evaluate")],
    force: Annotated[
        bool, typer.Option("--force", help="evaluate even if nothing changed since the last run")
    ] = False,
) -> None:
    """Evaluate a study the gateway queued (the job a worker runs; any host).

    The run's record in the run log names its study: found in the PACS by its UID and its
    patient together, fetched, evaluated with the routing rule the gateway chose, and written
    back (UNVERIFIED SR per model and the checklist PDF) as the gateway's own runs are. The
    run's folder and report bundle go to NEUROSANDBOX_SHARED_DIR (else DATA_DIR), which the
    gateway's review pages read. Exit 0: done (or skipped, held, finished before); 1: failed."""
    from gateway.logs import configure_logging
    from gateway.runs import RunNotFoundError, RunStatus
    from gateway.settings import get_settings
    from gateway.study_queue import finish_merged

    settings = get_settings()
    if settings.database_url is None:
        raise fail("a queued run is in the PostgreSQL run log (NEUROSANDBOX_DATABASE_URL)",
                   ExitCode.USAGE)  # fmt: skip
    configure_logging()
    pipeline = worker_pipeline(settings)
    try:
        rec = pipeline.runs.get(run_id)
        if rec.study_key:  # later runs of the study merged into this job: covered by it
            finish_merged(pipeline.runs, settings.database_url, rec.study_key)
        with stopped_by_sigterm(settings.run_deadline_s):
            rec = pipeline.run_queued(run_id, force=force)
    except RunNotFoundError:
        raise fail(f"no gateway run {run_id} in the run log", ExitCode.USAGE) from None
    finally:
        if pipeline.printer is not None:
            pipeline.printer.close()
    note(f"run {run_id}: {rec.status.value}" + (f" ({rec.error[:300]})" if rec.error else ""))
    if rec.status in (RunStatus.FAILED, RunStatus.INTERRUPTED):
        raise typer.Exit(1)


def worker_pipeline(settings: Settings, evaluator: Evaluator | None = None) -> StudyPipeline:
    """The pipeline a worker host runs a queued gateway run with (``StudyPipeline.run_queued``,
    ``neurosandbox runs evaluate-study``): the gateway's, reading the study from the PACS, the
    evaluator in this process (the job is already a process of its own, under the run
    deadline), the runs in SHARED_DIR and the run log. Nothing of the HTTP API is imported:
    every queued study pays this process's start."""
    from evaluation.reports import Printer
    from gateway.audit import AuditLog
    from gateway.cache import InstanceCache
    from gateway.orthanc import OrthancClient
    from gateway.pipeline import StudyPipeline
    from gateway.routing import Router
    from gateway.runs import StudyRunStore
    from gateway.startup import check_run_log, configure_libraries, writeback_client
    from gateway.study_run import DefaultEvaluator

    check_run_log(settings)
    configure_libraries(settings)
    data = settings.data_dir  # this host's: its instance cache and audit log
    pipeline = StudyPipeline(
        orthanc=OrthancClient.from_settings(settings),
        evaluator=evaluator or DefaultEvaluator(settings),
        router=Router.from_file(settings.routing_file),
        runs=StudyRunStore.from_settings(settings),
        audit=AuditLog.from_settings(settings),
        cache=InstanceCache(data / "cache"),
        printer=Printer(idle_s=60),
        cases=settings.cases,
    )
    pipeline.writeback = writeback_client(settings)
    return pipeline


@contextlib.contextmanager
def stopped_by_sigterm(deadline_s: float) -> Iterator[None]:
    """SIGTERM (the worker stopping the job at the run deadline, or the host shutting down)
    ends the evaluation with ``EvaluationAbandonedError``, which the pipeline records as the
    run's failure, as the gateway's own deadline does; a second SIGTERM ends the process (the
    worker kills the command 5 s after the first anyway)."""
    from gateway.workers import EvaluationAbandonedError

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise EvaluationAbandonedError(
            f"evaluation stopped by its worker: the {deadline_s:g} s run deadline passed "
            "(NEUROSANDBOX_RUN_DEADLINE_S), or the worker's host is shutting down"
        )

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
