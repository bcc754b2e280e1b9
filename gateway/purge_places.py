"""The places a purge empties, and what it removes from each (``gateway.purge``).

``Sweep`` goes through them in order for one target: gateway runs, spool studies and study
states, loose instances (incoming, quarantine, the instance cache), suite runs and registered
cases, the review log, the PACS. Files are listed and counted first and deleted together at the
end (``Removal``), so that a dry run counts what a purge removes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dicom import atomic_write
from evaluation.datasets import case_registry
from evaluation.log import STORE_FILE, open_store, store_exists
from evaluation.review import ReviewStore
from gateway.forward import FORWARD_JOURNAL
from gateway.orthanc import OrthancClient, OrthancError
from gateway.purge_report import PurgeCounts, PurgeReport
from gateway.purge_target import Finder, PurgeTarget, case_ids, iso, maybe_dicom, mtime, read_header
from gateway.runs import FINAL, StudyState
from gateway.sr import series_uid_for
from gateway.study_key import StudyKey, orthanc_id

# The series the sandbox writes into a study (gateway.sr.series_uid_for kinds): UNVERIFIED SR
# and PDF (the pipeline), VERIFIED SR and PDF (a sign-off's re-issue)
SANDBOX_SERIES_KINDS = ("sr", "pdf", "sr-verified", "pdf-verified")


@dataclass
class Places:
    """Where the sandbox keeps data (the settings' paths, passed explicitly)."""

    data_dir: Path
    reports_dir: Path | None = None
    runs_root: Path | None = None  # NEUROSANDBOX_SHARED_DIR: the gateway's runs and state
    review_log: Path | None = None
    suite_runs: Path | None = None  # NEUROSANDBOX_RUNS_DIR
    cases: Path | None = None  # NEUROSANDBOX_CASES
    database_url: str | None = None  # NEUROSANDBOX_DATABASE_URL: the PostgreSQL run log

    @classmethod
    def from_settings(cls, settings: Any) -> Places:
        return cls(
            data_dir=settings.data_dir,
            reports_dir=settings.reports_root,
            runs_root=settings.runs_root,
            review_log=settings.review_log,
            suite_runs=settings.runs_dir,
            cases=settings.cases,
            database_url=settings.database_url,
        )


def vacuum_sqlite(path: Path) -> None:
    """Rewrite a SQLite file so that deleted rows leave no bytes in free pages or the WAL."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir() and not path.is_symlink():
        yield from (p for p in path.rglob("*") if p.is_file() or p.is_symlink())
    else:
        yield path


@dataclass
class Removal:
    """Paths to delete, counted before anything is deleted (so a dry run counts the same)."""

    dry_run: bool
    counts: PurgeCounts
    paths: list[Path] = field(default_factory=list)
    prune: list[Path] = field(default_factory=list)  # roots whose empty folders go too
    # study states (files a running evaluation may change at the same time) go under this
    # lock (StudyRunStore.study_state_lock): a change read before never writes one back
    states: list[Path] = field(default_factory=list)
    state_lock: Callable[[], AbstractContextManager[None]] | None = None
    _seen: set[Path] = field(default_factory=set)

    def add(self, path: Path, *, state: bool = False) -> None:
        """``path`` to delete; ``state``: a study's state file (see ``states``)."""
        if path in self._seen or not (path.exists() or path.is_symlink()):
            return
        self._seen.add(path)
        (self.states if state else self.paths).append(path)
        for f in _files(path):
            self.counts.files += 1
            with contextlib.suppress(OSError):
                self.counts.bytes += f.lstat().st_size

    def apply(self) -> None:
        if self.dry_run:
            return
        if self.states:
            with self.state_lock() if self.state_lock is not None else contextlib.nullcontext():
                for path in self.states:
                    path.unlink(missing_ok=True)
        for path in self.paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for root in self.prune:  # folders left empty (their names may carry a study's UID)
            for folder in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()


@dataclass(kw_only=True)
class Sweep(Finder):
    """One purge's pass over the places: what it found (run ids, study keys and UIDs) and the
    removal it builds; each method is one place."""

    places: Places
    report: PurgeReport
    rm: Removal
    keys: set[str] = field(default_factory=set)  # the study keys (names) purged
    uids: set[str] = field(default_factory=set)  # their StudyInstanceUIDs (for the PACS)
    kept_keys: set[str] = field(default_factory=set)  # of runs that stay (retention)

    @property
    def dry_run(self) -> bool:
        return self.rm.dry_run

    # ----------------------------------------------------------------- gateway runs

    def gateway_runs(self) -> None:
        """Each finished run of the target: its folder, report bundle and active marker."""
        report, c = self.report, self.report.counts
        for rec in self.records():
            if self.run_matches(rec):
                if rec.status not in FINAL:
                    report.left.append(f"run {rec.run_id}: in progress ({rec.stage}), not purged")
                    if rec.study_key:
                        self.kept_keys.add(rec.study_key)
                    continue
                report.run_ids.append(rec.run_id)
                self.rm.add(self.runs.run_dir(rec.run_id))
                self.rm.add(self.runs.report_folder(rec.run_id))
                self.rm.add(self.runs.active_dir / rec.run_id)
                if rec.study_key:
                    self.keys.add(rec.study_key)
                if rec.study_uid:
                    self.uids.add(rec.study_uid)
            elif rec.study_key:
                self.kept_keys.add(rec.study_key)
        c.runs = len(report.run_ids)
        c.report_bundles = sum(self.runs.report_folder(r).is_dir() for r in report.run_ids)

    def run_log(self) -> None:
        """With PostgreSQL, the purged runs' rows (every table) deleted from the run log; with
        SQLite they go with the run folder."""
        url = self.places.database_url
        if url is None or self.dry_run:
            return
        for run_id in self.report.run_ids:
            folder = self.runs.run_dir(run_id)
            with open_store(folder, run_id=run_id, database_url=url, create=True) as store:
                self.report.counts.run_log_rows += store.erase_run()
            shutil.rmtree(folder, ignore_errors=True)  # its marker (made if it was missing)

    # ----------------------------------------------------------------- spool and state

    def spool_studies(self) -> None:
        """The spool's study folders of the target (by their key's name)."""
        studies = self.data / "spool" / "studies"
        for folder in sorted(studies.iterdir()) if studies.is_dir() else ():
            if not folder.is_dir():
                continue
            if self.cutoff is not None:
                hit = _received_before(folder, self.cutoff) and folder.name not in self.kept_keys
            else:
                hit = self.target.key_matches(folder.name) or (
                    StudyKey.parse_name(folder.name) is None
                    and _folder_matches(self.target, folder)
                )
            if hit:
                self.rm.add(folder)
                self.report.counts.spool_studies += 1
                self.keys.add(folder.name)
                parsed = StudyKey.parse_name(folder.name)
                if parsed:
                    self.uids.add(parsed[0])

    def study_states(self) -> None:
        """``state/studies/*.json`` of the target (by their key)."""
        for path in sorted(self.runs.state_dir.glob("*.json")):
            state = _state(path)
            if state is None:
                continue
            if self.cutoff is not None:
                hit = mtime(path) < self.cutoff and (state.key or "") not in self.kept_keys
            else:
                hit = (
                    self.target.key_matches(state.key)
                    or (state.key is not None and state.key in self.keys)
                    or (state.last_run_id is not None and state.last_run_id in self.report.run_ids)
                    or (state.key is None and self.target.study_uid == state.study_uid)
                )
            if hit:
                self.rm.add(path, state=True)
                self.report.counts.study_states += 1
                self.keys.add(state.key or state.study_uid)
                self.uids.add(state.study_uid)

    # ----------------------------------------------------------------- instances

    def loose_instances(self) -> None:
        """Instances in ``spool/incoming``, ``spool/quarantine`` and the instance cache."""
        incoming, quarantine, cache = self.instance_roots()
        for root in (incoming, quarantine):
            self.report.counts.spool_files += self._instances(root)
        self.report.counts.cache_files = self._instances(cache)

    def forward_journals(self) -> None:
        """The forwarder's journals in ``spool/incoming`` and ``spool/quarantine`` (a staging
        folder's Orthanc ids and staged files ``<study key>/<series UID>/<n>.dcm``; a start
        moves an interrupted association's folder, journal included, to quarantine): the lines
        of the purged studies, or of files being removed, are dropped; a journal left empty is
        deleted."""
        incoming, quarantine, _cache = self.instance_roots()
        removed = {p.resolve() for p in self.rm.paths}
        journals = [
            j for root in (incoming, quarantine) if root.is_dir()
            for j in sorted(root.glob(f"*/{FORWARD_JOURNAL}"))
        ]  # fmt: skip
        for journal in journals:
            try:
                lines = journal.read_text("utf-8", "replace").splitlines()
            except OSError:
                continue
            keep = []
            for line in lines:
                staged = line.partition(" ")[2]
                key = staged.partition("/")[0]
                mine = self.target.key_matches(key) or key in self.keys
                if not mine and (journal.parent / staged).resolve() not in removed:
                    keep.append(line)
            if len(keep) == len(lines):
                continue
            if not keep:
                self.rm.add(journal)
            elif not self.dry_run:
                with atomic_write(journal, "w") as fh:
                    fh.write("".join(f"{line}\n" for line in keep))

    def _instances(self, root: Path) -> int:
        """Instance files under ``root`` of the target (by header), or older than the cutoff."""
        n = 0
        self.rm.prune.append(root)
        for path in sorted(root.rglob("*")) if root.is_dir() else ():
            if not path.is_file():
                continue
            if self.cutoff is not None:
                hit = mtime(path) < self.cutoff
            else:
                head = self.header(path) if maybe_dicom(path) else None
                hit = head is not None and self.target.header_matches(*head)
            if hit:
                self.rm.add(path)
                n += 1
        return n

    # ----------------------------------------------------------------- suite runs and cases

    def suite_runs(self) -> None:
        """The target's cases erased from each suite run's store (the file rewritten), and
        their review events."""
        root, report = self.places.suite_runs, self.report
        if root is None or not root.is_dir():
            return
        review, url = self._review(), self.places.database_url
        for folder in sorted(p for p in root.iterdir() if store_exists(p, url)):
            ids = case_ids(folder, self.target, url)
            if not ids:
                continue
            report.counts.suite_cases += len(ids)
            if self.dry_run:
                continue
            with open_store(folder, database_url=url) as store:
                report.counts.suite_rows += store.erase_cases(ids)
            if url is None:
                vacuum_sqlite(folder / STORE_FILE)
            if review is not None:
                report.counts.review_events += review.erase([folder.name], ids)
            # the run's exports hold the cases too: rebuilt from the log on demand
            for export in ("rundata.json", "report"):
                if (folder / export).exists():
                    report.left.append(
                        f"suite run {folder.name}: {export} predates the purge; rebuild it "
                        "with `neurosandbox report`"
                    )

    def registered_cases(self) -> None:
        """The folders of the registered cases (NEUROSANDBOX_CASES) of the target."""
        root = self.places.cases
        if root is None or not root.is_dir():
            return
        cases, _ = case_registry(root)
        seen: set[str] = set()
        for case in cases.values():
            if case.root is None or case.root in seen:
                continue
            mine = (
                case.patient_id == self.target.patient_id
                if self.target.patient_id is not None
                else self.target.study_uid in case.provenance.study_uids
            )
            folder = Path(case.root).resolve()
            if mine and folder.is_relative_to(root.resolve()):
                seen.add(case.root)
                self.rm.add(folder)
                self.report.counts.registered_cases += 1

    # ----------------------------------------------------------------- review log

    def _review(self) -> ReviewStore | None:
        log = self.places.review_log
        return ReviewStore(log) if log is not None and log.is_file() else None

    def review_events(self) -> None:
        """Every review event of the purged gateway runs, free text included."""
        review = self._review()
        if not self.report.run_ids or review is None:
            return
        if self.dry_run:
            n = sum(len(review.events(r)) for r in self.report.run_ids)
        else:
            n = review.erase(self.report.run_ids)
        self.report.counts.review_events = n

    # ----------------------------------------------------------------- PACS

    def pacs(self, orthanc: OrthancClient) -> None:
        """Delete the sandbox's SR and PDF series from the target's studies in Orthanc."""
        target = self.target
        studies: set[tuple[str, str]] = set()  # (PatientID, StudyInstanceUID)
        if target.patient_id is not None:
            for uid in self.uids:
                studies.add((target.patient_id, uid))
            try:
                for st in orthanc.list_studies(orthanc_id(target.patient_id)):
                    studies.add((target.patient_id, st.study_uid))
            except OrthancError as exc:
                if exc.status != 404:
                    raise
        else:
            assert target.study_uid is not None
            for st in orthanc.studies_by_uid(target.study_uid):
                studies.add((st.patient_id, st.study_uid))
        n = 0
        for patient_id, uid in sorted(studies):
            for kind in SANDBOX_SERIES_KINDS:
                series = orthanc_id(patient_id, uid, series_uid_for(uid, kind))
                try:
                    instances = orthanc.series_instances(series)
                except OrthancError as exc:
                    if exc.status == 404:  # nothing of this kind written
                        continue
                    raise
                n += len(instances)
                if not self.dry_run:
                    for key in instances:
                        orthanc.delete_instance(key.instance_id)
        self.report.counts.pacs_objects = n


def _state(path: Path) -> StudyState | None:
    try:
        return StudyState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _received_before(folder: Path, cutoff: datetime) -> bool:
    """A spool study last received before ``cutoff`` (its ``.received.json``, else the folder)."""
    info = folder / ".received.json"
    try:
        last = json.loads(info.read_text()).get("last_received")
    except (OSError, ValueError, AttributeError):
        last = None
    if isinstance(last, int | float):
        when: datetime | None = datetime.fromtimestamp(last, UTC)
    else:
        when = iso(last) if isinstance(last, str) else None
    return (when or mtime(info if info.exists() else folder)) < cutoff


def _folder_matches(target: PurgeTarget, folder: Path) -> bool:
    """A spool folder of an earlier layout (no patient in its name): by its first header."""
    first = next((p for p in folder.rglob("*.dcm")), None)
    head = read_header(first) if first is not None else None
    return head is not None and target.header_matches(*head)
