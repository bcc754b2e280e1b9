"""The durable queue on the run log's PostgreSQL (procrastinate), used only when a database URL
is set; the embedded default (SQLite, in-process worker) never imports this module.

Two tasks: ``study_run`` (a gateway study's evaluation; its procrastinate ``lock`` is the study,
so two jobs for one study never run at once, and its ``queueing_lock`` merges a second request
while the first still waits, as the gateway merges them today) and ``eval_shard`` (one share
``I/N`` of a suite's cases, ``eval --shard`` / ``runs resume --shard``). A job is a
``neurosandbox`` command the worker runs as a child process under the run deadline
(``NEUROSANDBOX_RUN_DEADLINE_S``): today's evaluator, its per-call timeout and its claims.

Enqueueing is transactional through an outbox (``job_outbox``, run-log migration 0005):
``enqueue`` writes the job on the caller's connection, in the transaction of its run row;
``drain`` moves pending rows into procrastinate on ONE connection, marking each row in the same
transaction as it inserts the job, so a process killed after the commit and before the drain
loses nothing (the next drain, by any worker, queues it) and a drain killed midway queues
nothing twice. A job merged into a queued duplicate (its queueing lock) is marked merged.

The traps: procrastinate retries a stalled job only when asked, so every worker schedules
``retry_stalled`` (and ``drain``) as periodic tasks every ``queue_check_s``; the heartbeat
proves the worker's event loop alive, not that the job progresses, so the run deadline and
the per-call timeout stay; a database outage stops procrastinate's worker (its heartbeat side
task fails), so ``run_worker`` starts it again on a new pool until it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field, field_validator

log = logging.getLogger(__name__)

QUEUE = "neurosandbox"
MAINTENANCE = "neurosandbox-maintenance"  # retry_stalled, drain_outbox: a slot of their own
# what a job may run: these neurosandbox commands only (a job row is data, not a shell)
_COMMANDS = {("eval",), ("runs", "resume"), ("runs", "evaluate-study")}
_MAX_ARGS, _MAX_ARG = 200, 4096
EXIT_FENCED = 75  # the worker found its job taken over (EX_TEMPFAIL): restart it
_RUN_MARKERS = ("run.db.json", "run.sqlite")  # a run folder (evaluation.log.store's names)


class QueueError(RuntimeError):
    """The queue cannot be used (no PostgreSQL URL, its schema missing, a job refused)."""


class JobSpec(BaseModel):
    """One job: the neurosandbox command a worker runs, and how duplicates are kept apart."""

    task: Literal["study_run", "eval_shard"]
    argv: list[str]  # after `neurosandbox`, e.g. ["runs", "resume", RUN, "--shard", "1/3"]
    queueing_lock: str = Field(min_length=1, max_length=512)  # merges a waiting duplicate
    lock: str | None = Field(None, max_length=512)  # never two running jobs with one lock
    priority: int = 0  # higher first: the shard that starts a run before those that join it

    @field_validator("argv")
    @classmethod
    def _known_command(cls, argv: list[str]) -> list[str]:
        if not argv or not (tuple(argv[:1]) in _COMMANDS or tuple(argv[:2]) in _COMMANDS):
            raise ValueError(
                f"a job runs `neurosandbox eval`, `runs resume` or `runs evaluate-study`, not "
                f"{argv[:2]!r}"
            )
        if len(argv) > _MAX_ARGS or any(len(a) > _MAX_ARG or "\x00" in a for a in argv):
            raise ValueError("a job's command is at most 200 arguments of 4096 characters")
        return argv


class QueueTimings(BaseModel):
    """The queue's clocks in seconds: the first four are settings (``NEUROSANDBOX_QUEUE_*``,
    ``NEUROSANDBOX_RUN_DEADLINE_S``; their defaults are there, short in the tests)."""

    heartbeat_s: float  # a worker's heartbeat (its event loop is alive, no more)
    stall_s: float  # a worker without a heartbeat this long is stalled: its jobs retried
    check_s: int  # how often retry_stalled and drain run (periodic tasks)
    deadline_s: float  # a job's command is stopped after this long (the run deadline)
    poll_s: float = 1.0  # a worker looks for jobs at least this often (besides LISTEN/NOTIFY)
    reconnect_s: float = 2.0  # after a database outage, the worker starts again after this


def study_job(study_key: str, argv: Sequence[str]) -> JobSpec:
    """A gateway study's run: locked and merged by the study (its UID and patient key)."""
    return JobSpec(task="study_run", argv=list(argv), queueing_lock=f"study:{study_key}",
                   lock=f"study:{study_key}")  # fmt: skip


def shard_jobs(eval_argv: Sequence[str], out: Path, shards: int) -> list[JobSpec]:
    """A suite's run in ``shards`` jobs: shard 0 starts the run (``eval ... --shard 0/N``),
    the others join it (``runs resume OUT --shard I/N``, retried until the run row exists)."""
    run = str(Path(out).absolute())
    jobs = [JobSpec(task="eval_shard", argv=[*eval_argv, "--shard", f"0/{shards}"],
                    queueing_lock=f"shard:{run}:0/{shards}", lock=f"shard:{run}:0/{shards}",
                    priority=1)]  # fmt: skip
    for i in range(1, shards):
        part = f"{i}/{shards}"
        jobs.append(JobSpec(task="eval_shard", argv=["runs", "resume", run, "--shard", part],
                            queueing_lock=f"shard:{run}:{part}", lock=f"shard:{run}:{part}"))  # fmt: skip
    return jobs


def conninfo(url: str) -> str:
    """The libpq connection string of the run log's SQLAlchemy URL."""
    try:
        u = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise QueueError("the database URL cannot be parsed") from exc
    if not u.drivername.startswith("postgresql"):
        raise QueueError("the queue needs the run log on PostgreSQL (NEUROSANDBOX_DATABASE_URL)")
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


def connect(url: str) -> Any:
    """A psycopg connection to the run log's database (10 s to connect)."""
    import psycopg

    return psycopg.connect(conninfo(url), connect_timeout=10)


@contextlib.contextmanager
def run_held(url: str, run_id: str) -> Iterator[bool]:
    """Whether this process holds the gateway run ``run_id`` while the block runs: a
    PostgreSQL session advisory lock keyed by the run id, held by a connection of its own. An
    earlier attempt of the run that is still alive (its worker stalled past the stall timeout
    and its job was retried to another) holds it until it ends; one whose process died lost
    it with its connection. A session outlives a client cut off from the network until the
    server notices (evaluation/log/claims.py: hours by the kernel's default keepalive), so
    this session asks the server to probe its client after 10 s idle: a host cut off
    releases the run within about 25 s."""
    import hashlib

    key = int.from_bytes(hashlib.sha256(f"neurosandbox-run:{run_id}".encode()).digest()[:8],
                         "big", signed=True)  # fmt: skip
    with connect(url) as c:
        c.autocommit = True
        for name, value in (("idle", 10), ("interval", 5), ("count", 3)):  # TCP only
            c.execute(f"SET tcp_keepalives_{name} = {value}")
        mine = bool(c.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0])
        try:
            yield mine
        finally:
            if mine:
                with contextlib.suppress(Exception):  # the connection's end releases it too
                    c.execute("SELECT pg_advisory_unlock(%s)", (key,))


# --- the outbox ----------------------------------------------------------------------------


def enqueue(conn: sa.Connection, spec: JobSpec) -> int:
    """Write ``spec`` to the outbox on ``conn``, in the caller's transaction (with its run
    row); the job reaches the queue at the next ``drain``. Returns the outbox id."""
    row = conn.execute(
        sa.text(
            "INSERT INTO job_outbox (task, queueing_lock, lock, args, created_at) "
            "VALUES (:task, :qlock, :lock, :args, :at) RETURNING id"
        ),
        {"task": spec.task, "qlock": spec.queueing_lock, "lock": spec.lock,
         "args": json.dumps({"argv": spec.argv, "priority": spec.priority}), "at": datetime.now(UTC).isoformat()},
    )  # fmt: skip
    return int(row.scalar_one())


class DrainResult(BaseModel):
    queued: list[int] = []  # procrastinate job ids
    merged: int = 0  # rows whose job was already waiting (same queueing lock)
    refused: int = 0  # rows that are not a job (logged, marked, never queued)


_MARK = "UPDATE job_outbox SET drained_at = %s, job_id = %s WHERE id = %s"


class _OneConnection:
    """A 'pool' of one connection for procrastinate's sync connector: its queries run in
    the drain's own transaction."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        yield self._conn

    def close(self) -> None:  # the drain closes its connection itself
        pass


def drain(url: str, *, limit: int = 500) -> DrainResult:
    """Move the outbox's pending jobs into procrastinate: each row is marked in the same
    transaction as its job is inserted (rows another drain holds are skipped)."""
    from procrastinate import SyncPsycopgConnector, exceptions

    result = DrainResult()
    with connect(url) as conn:
        connector = SyncPsycopgConnector()
        connector.open(pool=_OneConnection(conn))  # type: ignore[arg-type]
        app = _app(connector)
        with conn.transaction():
            rows = conn.execute(
                "SELECT id, task, queueing_lock, lock, args FROM job_outbox "
                "WHERE drained_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (limit,),
            ).fetchall()
            for oid, task, qlock, lock, args in rows:
                job_id: int | None = None
                try:  # a row is data: checked as a job before it is queued
                    payload = json.loads(args)
                    spec = JobSpec(task=task, argv=payload["argv"], queueing_lock=qlock,
                                   lock=lock, priority=int(payload.get("priority", 0)))  # fmt: skip
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("outbox row %s refused, not queued: %s", oid, str(exc)[:300])
                    result.refused += 1
                    conn.execute(_MARK, (datetime.now(UTC).isoformat(), None, oid))
                    continue
                try:
                    with conn.transaction():  # a savepoint: a merged duplicate aborts only it
                        job_id = (
                            app.tasks[f"neurosandbox.{spec.task}"]
                            .configure(queueing_lock=spec.queueing_lock, lock=spec.lock,
                                       priority=spec.priority)
                            .defer(argv=spec.argv, outbox_id=oid)
                        )  # fmt: skip
                except exceptions.AlreadyEnqueued:
                    result.merged += 1
                else:
                    result.queued.append(job_id)
                conn.execute(_MARK, (datetime.now(UTC).isoformat(), job_id, oid))
    return result


def outbox_outcome(url: str, outbox_id: int) -> Literal["pending", "queued", "merged"]:
    """What became of an outbox row: still to drain, queued as a job, or merged into a job of
    its queueing lock that was waiting (or refused: never a row ``enqueue`` wrote)."""

    with connect(url) as conn:
        row = conn.execute(
            "SELECT drained_at IS NOT NULL, job_id FROM job_outbox WHERE id = %s", (outbox_id,)
        ).fetchone()
    if row is None or not row[0]:
        return "pending"
    return "queued" if row[1] is not None else "merged"


# --- the schema ----------------------------------------------------------------------------


def apply_schema(url: str) -> bool:
    """procrastinate's tables and functions in the run log's database, once (``db upgrade``);
    True when they were created now."""
    from procrastinate import schema

    with connect(url) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(3600040)")  # two upgraders at once
        have = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()
        if have and have[0]:
            return False
        conn.execute(schema.SchemaManager.get_schema())
    return True


def schema_ready(url: str) -> bool:

    with connect(url) as conn:
        row = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()
    return bool(row and row[0])


# --- the tasks and the worker --------------------------------------------------------------


class JobNotReadyError(RuntimeError):
    """A shard ran before its run existed (shard 0 still starting): retried."""


class JobCommandError(RuntimeError):
    """A job's command failed or passed its deadline (the job is marked failed)."""


def _child_setup() -> None:  # pragma: no cover - runs in the child
    # the command dies with its worker (a killed worker leaves no orphan calling models)
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


async def _run_command(context: Any, argv: list[str], outbox_id: int) -> int:
    """Run ``neurosandbox ARGV`` in its own process group, stopped at the deadline."""
    spec = JobSpec(task="eval_shard", argv=argv, queueing_lock="x")  # validates the command
    deadline_s = context.additional_context["timings"].deadline_s
    job_id = _job_id(context)
    exe = Path(sys.executable).with_name("neurosandbox")
    cmd = [str(exe), *spec.argv] if exe.exists() else [sys.executable, "-m", "gateway.cli", *argv]
    log.info("job %s (outbox %s): neurosandbox %s", job_id, outbox_id, " ".join(argv[:6]))
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        preexec_fn=_child_setup,  # only prctl: safe beside threads
    )  # fmt: skip
    assert proc.stdout is not None
    relay = asyncio.create_task(_relay(proc.stdout, job_id))
    try:
        code = await _finished(proc, relay, deadline_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        with contextlib.suppress(TimeoutError):  # its last lines
            await asyncio.wait_for(asyncio.shield(relay), 2)
        raise JobCommandError(
            f"job {job_id}: stopped at the run deadline ({deadline_s:g} s)"
        ) from None
    except BaseException:  # the worker stops (cancelled): so does the command
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        relay.cancel()  # done by now, unless a grandchild still holds the pipe
    await asyncio.to_thread(_fence, context)
    return code


async def _finished(proc: Any, relay: asyncio.Task[None], deadline_s: float) -> int:
    """The command's exit code once it ended and its output was relayed (a grandchild still
    holding the pipe is not waited for past a few seconds)."""
    code = int(await asyncio.wait_for(proc.wait(), deadline_s))
    try:
        await asyncio.wait_for(asyncio.shield(relay), 5)
    except TimeoutError:
        relay.cancel()
    return code


_LINE_MAX = 4000  # characters of one relayed line; a longer one is cut there


async def _relay(stream: asyncio.StreamReader, job_id: int) -> None:
    """The command's output, line by line, as the worker's log lines ("job N: ..."): through
    the worker's logging, so the same filter hashes any UID in them (gateway/logs.py)."""
    buf = b""
    while chunk := await stream.read(1 << 16):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        if len(buf) > 1 << 16:  # no newline for this long: logged as it is
            lines, buf = [*lines, buf], b""
        for line in lines:
            _log_output(job_id, line)
    if buf:
        _log_output(job_id, buf)


def _log_output(job_id: int, line: bytes) -> None:
    text = line.decode("utf-8", "replace").rstrip("\r")
    text = text.rsplit("\r", 1)[-1]  # a progress bar redrawn in place: its last state
    if text.strip():
        log.info("job %s: %s", job_id, text[:_LINE_MAX])


def _fence(context: Any) -> None:
    """A worker that was stalled (hung, cut off) past the stall timeout had its job given to
    another. procrastinate would still record this worker's outcome over the other's (its
    finish query takes a job that is waiting or running anywhere), so such a worker stops
    here, before that: its supervisor starts it again; its other jobs are retried."""
    import psycopg

    job = context.job
    try:
        with connect(context.additional_context["url"]) as c:
            row = c.execute("SELECT status, worker_id FROM procrastinate_jobs WHERE id = %s",
                            (job.id,)).fetchone()  # fmt: skip
    except psycopg.Error:
        return  # the database is away: the outcome cannot be written either
    if row is None or row[0] != "doing" or row[1] != job.worker_id:
        log.error("job %s was given to another worker while this one was stalled; "
                  "stopping without recording its outcome", job.id)  # fmt: skip
        print(f"worker: job {job.id} was taken over while this worker was stalled; exiting",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(EXIT_FENCED)


def _cron(every_s: int) -> str:
    """procrastinate's cron (seconds as the sixth field) for every ``every_s`` seconds."""
    if every_s < 60:
        return f"* * * * * */{max(1, every_s)}"
    return f"*/{max(1, every_s // 60)} * * * *"


def _app(connector: Any, check_s: int = 10) -> Any:
    """A procrastinate App on ``connector`` with the tasks, its periodic ones every
    ``check_s`` (a task belongs to its App: each connector gets an App of its own)."""
    from procrastinate import App, RetryStrategy
    from procrastinate.job_context import JobContext

    app = App(connector=connector)
    # a shard waits for the run's first shard for up to an hour, one look every 2 s
    ready_retry = RetryStrategy(max_attempts=1800, wait=2, retry_exceptions={JobNotReadyError})

    @app.task(name="neurosandbox.study_run", queue=QUEUE, pass_context=True)
    async def study_run(context: JobContext, argv: list[str], outbox_id: int) -> None:
        code = await _run_command(context, argv, outbox_id)
        if code not in (0, 1):  # 1: some calls ended in an error; the run is recorded
            raise JobCommandError(f"neurosandbox {argv[0]} exited {code}")

    @app.task(name="neurosandbox.eval_shard", queue=QUEUE, pass_context=True, retry=ready_retry)
    async def eval_shard(context: JobContext, argv: list[str], outbox_id: int) -> None:
        url = context.additional_context["url"]
        argv = await asyncio.to_thread(_resume_if_started, argv, url)
        joins = argv[:2] == ["runs", "resume"] and len(argv) > 2
        if joins and not await asyncio.to_thread(run_recorded, url, Path(argv[2])):
            raise JobNotReadyError(f"{argv[2]}: the run is not there yet")  # no child started
        code = await _run_command(context, argv, outbox_id)
        if code not in (0, 1):
            raise JobCommandError(f"neurosandbox {' '.join(argv[:2])} exited {code}")

    @app.periodic(cron=_cron(check_s), periodic_id="retry_stalled")
    @app.task(name="neurosandbox.retry_stalled", queue=MAINTENANCE, queueing_lock="retry_stalled",
              pass_context=True)  # fmt: skip
    async def retry_stalled(context: JobContext, timestamp: int) -> int:
        stalled = await context.app.job_manager.get_stalled_jobs(
            seconds_since_heartbeat=context.additional_context["timings"].stall_s
        )
        n = 0
        for job in stalled:
            if (
                job.task_name.startswith("neurosandbox.")
                and job.task_name != "neurosandbox.retry_stalled"
            ):
                log.warning("job %s: its worker is stalled; queued again", job.id)
                await context.app.job_manager.retry_job(job)
                n += 1
        return n

    @app.periodic(cron=_cron(check_s), periodic_id="drain_outbox")
    @app.task(name="neurosandbox.drain_outbox", queue=MAINTENANCE, queueing_lock="drain_outbox",
              pass_context=True)  # fmt: skip
    async def drain_outbox(context: JobContext, timestamp: int) -> int:
        res = await asyncio.to_thread(drain, context.additional_context["url"])
        return len(res.queued)

    return app


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _resume_if_started(argv: list[str], url: str) -> list[str]:
    """The shard that starts a run, tried again (its worker died or hung after the run was
    made): it joins the run as the others do (``eval`` refuses a folder that holds a run)."""
    out, shard = _option(argv, "--out"), _option(argv, "--shard")
    if argv[:1] != ["eval"] or out is None or shard is None:
        return argv
    if run_recorded(url, Path(out)) or any((Path(out) / m).exists() for m in _RUN_MARKERS):
        return ["runs", "resume", out, "--shard", shard]
    return argv


def run_recorded(url: str, run_dir: Path) -> bool:
    """Whether the run of ``run_dir`` has its row in the run log (its marker names it; the
    marker is written before the row is committed)."""

    try:
        run_id = json.loads((run_dir / _RUN_MARKERS[0]).read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    with connect(url) as conn:
        row = conn.execute("SELECT 1 FROM run WHERE run_id = %s", (str(run_id)[:200],)).fetchone()
    return row is not None


def _job_id(context: Any) -> int:
    return int(context.job.id) if context.job and context.job.id is not None else -1


POOL_WAIT_S = 10.0  # the longest a worker waits for a connection of its pool


def run_worker(url: str, timings: QueueTimings, *, concurrency: int = 1,
               name: str | None = None, stop_after_s: float | None = None) -> None:  # fmt: skip
    """Take jobs until stopped (SIGINT/SIGTERM). A database outage stops procrastinate's worker;
    it is started again on a new connection pool after ``reconnect_s``."""
    from procrastinate import PsycopgConnector

    if not schema_ready(url):
        raise QueueError("the queue's tables are missing: run `neurosandbox db upgrade`")
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            drain(url)  # whatever a killed process left in the outbox
        # a connection waited for longer than POOL_WAIT_S: the database is away (restarted,
        # unreachable), and the worker starts again on a new pool rather than wait on the
        # old one's backing-off reconnections (30 s by default)
        connector = PsycopgConnector(conninfo=conninfo(url), kwargs={"connect_timeout": 5},
                                     timeout=POOL_WAIT_S)  # fmt: skip
        app = _app(connector, timings.check_s)
        remaining = None if stop_after_s is None else stop_after_s - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            return
        try:
            asyncio.run(_work(app, url, timings, concurrency, name, remaining))
            return  # stopped by a signal (or stop_after_s)
        except Exception as exc:  # the database went away: procrastinate's worker stopped
            log.warning("worker stopped (%s); starting again in %g s", exc, timings.reconnect_s)
            print(f"worker: database unreachable ({type(exc).__name__}); reconnecting",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(timings.reconnect_s)


async def _work(app: Any, url: str, t: QueueTimings, concurrency: int, name: str | None,
                stop_after_s: float | None) -> None:  # fmt: skip
    """Two procrastinate workers on one pool: the jobs (``concurrency`` at once) and the
    periodic maintenance (its own slot: a worker busy with long jobs still retries a stalled
    one and drains the outbox). Returns when stopped; raises when a worker failed."""
    common: dict[str, Any] = {
        "wait": True, "fetch_job_polling_interval": t.poll_s,
        "update_heartbeat_interval": t.heartbeat_s, "stalled_worker_timeout": t.stall_s,
        "additional_context": {"url": url, "timings": t}, "install_signal_handlers": False,
        "delete_jobs": "successful",
    }  # fmt: skip
    async with app.open_async():
        workers = [
            asyncio.create_task(app.run_worker_async(
                queues=[QUEUE], concurrency=concurrency, name=name, **common)),
            asyncio.create_task(app.run_worker_async(
                queues=[MAINTENANCE], concurrency=1, name=f"{name or 'worker'}-maintenance",
                **common)),
        ]  # fmt: skip
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                [*workers, stopper], timeout=stop_after_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            stopper.cancel()
            for w in workers:
                w.cancel()  # a graceful stop: running jobs finish first
            results = await asyncio.gather(*workers, return_exceptions=True)
        failed = [w for w in workers if w in done]
        if failed:
            err = next((r for r in results if isinstance(r, Exception)), None)
            raise err or QueueError("a procrastinate worker stopped by itself")
