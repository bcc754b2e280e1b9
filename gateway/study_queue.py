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
instances with it.

Without the queue's tables (a run log migrated by ``evaluation.log.upgrade`` alone, not by
``neurosandbox db upgrade``) the gateway evaluates in its own process, as without a database
URL, and says so in its log at start: a gateway never waits for workers that cannot exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.runs import RunStatus, SkipKind, StudyRunStore
from gateway.settings import Settings
from gateway.study_key import StudyKey

log = logging.getLogger(__name__)

STAGE = "queued for a worker"
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
