"""``neurosandbox worker``: take jobs from the queue (PostgreSQL run log) and run them."""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.cli.console import ExitCode, fail, note


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

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    note(f"worker: taking jobs (concurrency {concurrency or settings.worker_concurrency})")
    try:
        run_worker(settings.database_url, timings,
                   concurrency=concurrency or settings.worker_concurrency, name=name,
                   stop_after_s=stop_after)  # fmt: skip
    except QueueError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
