"""Erasure: every place the sandbox keeps a patient's or a study's data, emptied of it.

``neurosandbox purge --patient ID [--issuer I] | --study UID | --older-than DAYS`` and the
gateway's retention (``NEUROSANDBOX_RETENTION_DAYS``) come here. A patient is found as the
sandbox keys it (``StudyKey``: PatientID with its issuer, hashed into the spool folder and
study state names; ``PatientKey`` in a DICOM header; a case's ``patient_id``), never by a name.
The places, under DATA_DIR unless set elsewhere:

- ``runs/<run id>/`` (the run store, images, SR copies, renders) and ``state/active/<run id>``;
- ``<reports>/<run id>/`` (the run's report bundle: rundata.json, HTML, PDF, evidence.json);
- ``spool/studies/<UID>_<patient hash>/``, and the instances of ``spool/incoming`` and
  ``spool/quarantine`` whose header names the patient or study;
- ``state/studies/*.json`` (``StudyState``);
- ``cache/`` (Orthanc downloads, found by their header);
- the review log (``ReviewStore.erase``: every event of the purged runs, free text included);
- suite runs (``NEUROSANDBOX_RUNS_DIR``): the patient's cases erased from each run's store
  (``RunStore.erase_cases``), the file rewritten;
- registered cases (``NEUROSANDBOX_CASES``): the case folders of the patient or study;
- with ``pacs``: the objects the sandbox wrote into Orthanc (its SR and PDF series of the
  study, UNVERIFIED and VERIFIED), never the hospital's images.

A run in progress is never touched (it is named in ``left``). SQLite files that lost rows are
rewritten (VACUUM, WAL truncated) so that deleted rows do not linger in free pages. The audit log
gets one entry without the data (``gateway.purge_report``).

The modules: ``purge_target`` (what a purge is of, and how a record is matched to it),
``purge_places`` (the places and what is removed from each), ``purge_report`` (the counts, the
report and the audit entry), this one (the order of the places, and retention).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from gateway.audit import AuditLog
from gateway.orthanc import OrthancClient
from gateway.purge_places import SANDBOX_SERIES_KINDS, Places, Removal, Sweep, vacuum_sqlite
from gateway.purge_report import (
    SALT_FILE,
    PurgeCounts,
    PurgeReport,
    audit_detail,
    subject_hash,
    write_audit,
)
from gateway.purge_target import PurgeError, PurgeTarget
from gateway.runs import StudyRunStore

__all__ = [
    "SALT_FILE",
    "SANDBOX_SERIES_KINDS",
    "Places",
    "PurgeCounts",
    "PurgeError",
    "PurgeReport",
    "PurgeTarget",
    "Purger",
    "RetentionTimer",
    "audit_detail",
    "subject_hash",
    "vacuum_sqlite",
]

log = logging.getLogger(__name__)


class Purger:
    """Finds and removes a target's data from every place (see the module's docstring)."""

    def __init__(
        self,
        places: Places,
        *,
        orthanc: OrthancClient | None = None,
        audit: AuditLog | None = None,
        runs: StudyRunStore | None = None,
    ) -> None:
        self.places = places
        self.orthanc = orthanc
        self.audit = audit
        self.runs = runs or StudyRunStore(
            places.runs_root or places.data_dir, places.reports_dir, places.database_url
        )
        self._lock = threading.Lock()  # one purge at a time in a process

    def purge(
        self,
        target: PurgeTarget,
        *,
        dry_run: bool = False,
        pacs: bool = False,
        actor: str = "system",
        now: datetime | None = None,
    ) -> PurgeReport:
        if pacs and self.orthanc is None:
            raise PurgeError("--pacs needs the PACS (Orthanc) the gateway writes to")
        if pacs and target.kind == "retention":
            raise PurgeError("retention never deletes from the PACS: the PACS keeps its records")
        now = now or datetime.now(UTC)
        with self._lock:
            return self._purge(target, dry_run, pacs, actor, now)

    def _purge(
        self, target: PurgeTarget, dry_run: bool, pacs: bool, actor: str, now: datetime
    ) -> PurgeReport:
        report = PurgeReport(
            kind=target.kind,
            subject=subject_hash(self.places.data_dir, target),
            dry_run=dry_run,
            pacs=pacs,
            at=now.isoformat(timespec="seconds"),
        )
        sweep = Sweep(
            places=self.places,
            runs=self.runs,
            target=target,
            report=report,
            cutoff=target.cutoff(now),
            rm=Removal(dry_run, report.counts, state_lock=self.runs.study_state_lock),
            database_url=self.places.database_url,
            data_dir=self.places.data_dir,
        )
        sweep.resolve()  # PurgeError when a PatientID is held under two issuers
        report.issuers = sweep.issuers_matched
        sweep.gateway_runs()
        sweep.spool_studies()
        sweep.study_states()
        report.counts.studies = len(sweep.keys)
        sweep.loose_instances()
        sweep.forward_journals()
        if sweep.cutoff is None:  # a patient or study: retention is the gateway's own data
            sweep.suite_runs()
            sweep.registered_cases()
        sweep.review_events()
        if pacs and self.orthanc is not None:
            sweep.pacs(self.orthanc)
        sweep.run_log()
        sweep.rm.apply()
        if not dry_run and self.audit is not None:
            write_audit(self.audit, actor, target, report)
        return report


class RetentionTimer:
    """Purges what is older than the retention period at start, then every ``every_s``."""

    def __init__(
        self,
        purger: Purger,
        days: float,
        every_s: float = 86400.0,
        on_done: Callable[[PurgeReport], None] | None = None,
    ) -> None:
        self.purger, self.days, self.every_s, self.on_done = purger, days, every_s, on_done
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def run_once(self) -> PurgeReport:
        report = self.purger.purge(PurgeTarget(older_than_days=self.days), actor="system:retention")
        log.info("retention (%g days): %s", self.days, report.counts.summary())
        if self.on_done is not None:
            self.on_done(report)
        return report

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # a failed pass is logged; the next one tries again
                log.exception("retention purge failed")
            self._stop.wait(max(1.0, self.every_s - (time.monotonic() - started)))
