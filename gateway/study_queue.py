"""The gateway's received studies on the durable queue (``gateway.jobs``), for workers on any
host: used when ``NEUROSANDBOX_DATABASE_URL`` is set and the queue's tables are there.

Where the in-process gateway would start the evaluation (routed, identity checked, not
unchanged), the pipeline settles the study in the PACS (the worker reads it from there) and
hands the run over: the run's row (status queued, stage ``queued for a worker``) and its
``study_run`` job are committed in one transaction on the run log's connection. The job is
``neurosandbox runs evaluate-study RUN_ID``: the worker reads the run's record (its study key,
the PACS's study, its route) and runs the pipeline's own evaluation and write-back
(``StudyPipeline.run_queued``). The job's lock and queueing lock are the study key (UID and
patient): two evaluations of one study never run at once, and a run handed over while the
study's earlier job still waits for a worker is merged into it (finished as skipped,
``SkipKind.MERGED``): that job reads the study from the PACS when it starts, the later
instances with it. A merged run whose hand-over could not see its drain's outcome is finished
by the job's command (``finish_merged``). The worker's side (``runs evaluate-study``, in
``gateway.cli.worker``): a run an earlier attempt started is resumed (its stored answers
reused), or marked interrupted once its write-back had begun (never evaluated twice); one
stopped at the run deadline fails saying so.

Without the queue's tables (a run log migrated by ``evaluation.log.upgrade`` alone, not by
``neurosandbox db upgrade``) the gateway evaluates in its own process, as without a database
URL, and says so in its log at start: a gateway never waits for workers that cannot exist.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from gateway.runs import RunStatus, SkipKind, StudyRunStore
from gateway.settings import Settings
from gateway.study_key import StudyKey

log = logging.getLogger(__name__)

STAGE = "queued for a worker"
PENDING_WAIT_S = 5.0  # how long a hand-over waits for another process's drain of its job
COMMAND = ["runs", "evaluate-study"]


def study_argv(run_id: str, *, force: bool = False) -> list[str]:
    """The worker's command for a gateway run (after ``neurosandbox``)."""
    return [*COMMAND, run_id, *(["--force"] if force else [])]


@dataclass(frozen=True)
class StudyQueue:
    """The queue the gateway hands its studies to (the run log's PostgreSQL)."""

    url: str

    @classmethod
    def from_settings(cls, settings: Settings) -> StudyQueue | None:
        """The queue when a database URL is set and its tables are there; None (studies are
        evaluated in this process) otherwise, the reason logged."""
        url = settings.database_url
        if not url:
            return None
        from gateway.jobs import QueueError, schema_ready

        try:
            ready = schema_ready(url)
        except QueueError as exc:  # a SQLite URL: the run log there, no queue
            log.info("studies are evaluated in this process: %s", exc)
            return None
        if not ready:
            log.warning(
                "NEUROSANDBOX_DATABASE_URL is set but the queue's tables are not in it: received "
                "studies are evaluated in this process (`neurosandbox db upgrade` creates them; "
                "then `neurosandbox worker`s evaluate)"
            )
            return None
        log.info("received studies are queued for `neurosandbox worker` (the run log's queue)")
        return cls(url)

    def hand_over(
        self, runs: StudyRunStore, run_id: str, key: StudyKey, *, force: bool = False
    ) -> bool:
        """Commit the run's queued state and its job together, then move the job into the
        queue (any worker's drain would too). False when the study's earlier job still waits
        and this run was merged into it: the run is then finished as skipped, saying so."""
        from gateway.jobs import drain, enqueue, outbox_outcome, study_job

        spec = study_job(key.name, study_argv(run_id, force=force))
        written: list[int] = []
        runs.hand_over(run_id, STAGE, 0.35, lambda conn: written.append(enqueue(conn, spec)))
        try:
            drain(self.url)
            outcome = outbox_outcome(self.url, written[0])
            deadline = time.monotonic() + PENDING_WAIT_S
            while outcome == "pending" and time.monotonic() < deadline:
                time.sleep(0.1)  # a worker's drain holds the row: its transaction is short
                outcome = outbox_outcome(self.url, written[0])
        except Exception as exc:  # committed: a worker's periodic drain queues it
            log.warning("run %s: queued, not yet moved into the queue (%s)", run_id, exc)
            return True
        if outcome == "merged":
            runs.finish(run_id, RunStatus.SKIPPED, error=SkipKind.MERGED.value,
                        skip=SkipKind.MERGED)  # fmt: skip
            log.info("run %s merged into the study's waiting evaluation", run_id)
            return False
        log.info("run %s queued for a worker", run_id)
        return True


def finish_merged(runs: StudyRunStore, url: str, study_key: str) -> list[str]:
    """The study's runs merged into its job (their outbox rows drained into no job) that are
    still listed as queued, finished as merged: a hand-over that did not see its drain's
    outcome (another process's drain held the row) leaves its run to the job's worker.
    Returns their run ids."""
    import json

    from gateway.jobs import connect
    from gateway.runs import RunNotFoundError

    lock = f"study:{study_key}"
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT args FROM job_outbox WHERE task = 'study_run' AND queueing_lock = %s "
            "AND drained_at IS NOT NULL AND job_id IS NULL",
            (lock,),
        ).fetchall()
    done = []
    for (args,) in rows:
        try:
            argv = json.loads(args)["argv"]
            run_id = argv[len(COMMAND)] if argv[: len(COMMAND)] == COMMAND else None
            rec = runs.get(str(run_id)) if run_id else None
        except (ValueError, KeyError, TypeError, IndexError, RunNotFoundError):
            continue  # not a gateway run's job
        if rec is not None and rec.status is RunStatus.QUEUED and rec.study_key == study_key:
            runs.finish(rec.run_id, RunStatus.SKIPPED, error=SkipKind.MERGED.value,
                        skip=SkipKind.MERGED)  # fmt: skip
            done.append(rec.run_id)
    return done
