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
gets one entry without the data: the kind, a salted hash of the patient or study (the salt is
``DATA_DIR/secret/purge.salt``: who holds it can check that a given patient was purged), the
counts, the actor.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pydicom
from pydantic import BaseModel, Field, ValidationError, model_validator

from dicom import check_uid
from evaluation import EvaluationError
from evaluation.datasets import case_registry
from evaluation.log import STORE_FILE, RunStore
from evaluation.review import ReviewStore
from gateway.audit import AuditLog
from gateway.orthanc import OrthancClient, OrthancError
from gateway.runs import FINAL, RunNotFoundError, RunRecord, StudyRunStore, StudyState
from gateway.sr import series_uid_for
from gateway.study_key import StudyKey, orthanc_id

log = logging.getLogger(__name__)

# The series the sandbox writes into a study (gateway.sr.series_uid_for kinds): UNVERIFIED SR
# and PDF (the pipeline), VERIFIED SR and PDF (a sign-off's re-issue)
SANDBOX_SERIES_KINDS = ("sr", "pdf", "sr-verified", "pdf-verified")
SALT_FILE = ("secret", "purge.salt")
_HEADER_TAGS = ["PatientID", "IssuerOfPatientID", "StudyInstanceUID"]


class PurgeError(ValueError):
    """A purge that cannot be done as asked (no target, two targets, an invalid value)."""


def _clean_id(value: str, what: str) -> str:
    text = value.strip()
    if not text or len(text) > 64 or not text.isprintable() or "\\" in text:
        raise PurgeError(f"{what} must be 1-64 printable characters without a backslash")
    return text


class PurgeTarget(BaseModel):
    """What to purge: one patient (PatientID and issuer), one study (its UID, every patient
    under it), or everything older than a number of days (retention)."""

    patient_id: str | None = None
    issuer: str = ""
    study_uid: str | None = None
    older_than_days: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> PurgeTarget:
        given = [x is not None for x in (self.patient_id, self.study_uid, self.older_than_days)]
        if sum(given) != 1:
            raise PurgeError("name exactly one of: a patient, a study, an age in days")
        if self.patient_id is not None:
            self.patient_id = _clean_id(self.patient_id, "the PatientID")
            self.issuer = _clean_id(self.issuer, "the issuer") if self.issuer.strip() else ""
        if self.study_uid is not None:
            try:
                self.study_uid = check_uid(self.study_uid)
            except ValueError as exc:
                raise PurgeError(str(exc)) from None
        return self

    @classmethod
    def of(cls, **values: Any) -> PurgeTarget:
        """The target from user input; ``PurgeError`` saying what is wrong."""
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            msg = str(err.get("ctx", {}).get("error") or err["msg"])
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise PurgeError(f"{where}: {msg}" if where else msg) from None

    @property
    def kind(self) -> Literal["patient", "study", "retention"]:
        if self.patient_id is not None:
            return "patient"
        return "study" if self.study_uid is not None else "retention"

    @property
    def patient_hash(self) -> str:
        """The patient's hash in spool folder and study state names (``StudyKey``)."""
        key = StudyKey(study_uid="0", patient_id=self.patient_id or "", issuer=self.issuer)
        return key.patient_hash

    def cutoff(self, now: datetime) -> datetime | None:
        if self.older_than_days is None:
            return None
        return now - timedelta(days=self.older_than_days)

    def key_matches(self, key_name: str | None) -> bool:
        """Whether a ``StudyKey.name`` (``<UID>_<patient hash>``) is of this patient or study."""
        parsed = StudyKey.parse_name(key_name or "")
        if parsed is None:
            return False
        uid, patient = parsed
        if self.patient_id is not None:
            return patient == self.patient_hash
        return self.study_uid is not None and uid == self.study_uid

    def header_matches(self, patient_id: str, issuer: str, study_uid: str) -> bool:
        """Whether a DICOM header's PatientID, issuer and StudyInstanceUID are of the target."""
        if self.patient_id is not None:
            return patient_id == self.patient_id and issuer == self.issuer
        return self.study_uid is not None and study_uid == self.study_uid

    def named_in(self, identities: Iterable[str]) -> bool:
        """Whether a held run's identities (``PatientKey.describe``) name this patient."""
        if self.patient_id is None:
            return False
        head = f"ID {self.patient_id}" + (f" ({self.issuer})" if self.issuer else "")
        return any(i == head or i.startswith(head + ",") for i in identities)


class PurgeCounts(BaseModel):
    """What a purge removed (or, dry, would remove), per place."""

    runs: int = 0  # gateway runs (their folder and run store)
    studies: int = 0  # distinct studies (UID and patient) any of the places held
    report_bundles: int = 0
    spool_studies: int = 0
    study_states: int = 0
    spool_files: int = 0  # instances in spool/incoming and spool/quarantine
    cache_files: int = 0
    review_events: int = 0
    suite_cases: int = 0  # cases erased from suite runs' stores
    suite_rows: int = 0  # their rows
    registered_cases: int = 0
    pacs_objects: int = 0  # SR and PDF instances the sandbox wrote into Orthanc
    files: int = 0  # every file deleted, all places together
    bytes: int = 0

    def summary(self) -> str:
        return (
            f"{self.runs} runs, {self.studies} studies, {self.files} files"
            f" ({self.bytes} bytes), {self.review_events} review events,"
            f" {self.suite_cases} suite cases, {self.registered_cases} registered cases,"
            f" {self.pacs_objects} PACS objects"
        )


class PurgeReport(BaseModel):
    kind: Literal["patient", "study", "retention"]
    subject: str = ""  # salted hash of the patient or study ("" for retention)
    dry_run: bool = False
    pacs: bool = False
    at: str = ""
    counts: PurgeCounts = Field(default_factory=PurgeCounts)
    left: list[str] = Field(default_factory=list)  # what was not purged, and why
    run_ids: list[str] = Field(default_factory=list)  # the gateway runs purged


@dataclass
class Places:
    """Where the sandbox keeps data (the settings' paths, passed explicitly)."""

    data_dir: Path
    reports_dir: Path | None = None
    review_log: Path | None = None
    suite_runs: Path | None = None  # NEUROSANDBOX_RUNS_DIR
    cases: Path | None = None  # NEUROSANDBOX_CASES

    @classmethod
    def from_settings(cls, settings: Any) -> Places:
        return cls(
            data_dir=settings.data_dir,
            reports_dir=settings.reports_root,
            review_log=settings.review_log,
            suite_runs=settings.runs_dir,
            cases=settings.cases,
        )


def subject_hash(data_dir: Path, target: PurgeTarget) -> str:
    """A salted hash of the patient or study (the salt: ``DATA_DIR/secret/purge.salt``, made
    on first use, readable by the owner only): the audit entry names no one."""
    if target.kind == "retention":
        return ""
    path = data_dir.joinpath(*SALT_FILE)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
    text = (
        f"patient:{target.patient_id}\\{target.issuer}"
        if target.kind == "patient"
        else f"study:{target.study_uid}"
    )
    return hmac.new(path.read_bytes(), text.encode(), hashlib.sha256).hexdigest()[:24]


def vacuum_sqlite(path: Path) -> None:
    """Rewrite a SQLite file so that deleted rows leave no bytes in free pages or the WAL."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def _header(path: Path) -> tuple[str, str, str] | None:
    """PatientID, issuer and StudyInstanceUID of a DICOM file; None when unreadable."""
    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_HEADER_TAGS)
    except Exception:  # hostile or partial files: not a DICOM header we can match
        return None
    return (
        str(ds.get("PatientID", "") or "").strip(),
        str(ds.get("IssuerOfPatientID", "") or "").strip(),
        str(ds.get("StudyInstanceUID", "") or "").strip(),
    )


def _mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)


def _iso(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


@dataclass
class _Removal:
    """Paths to delete, counted before anything is deleted (so a dry run counts the same)."""

    dry_run: bool
    counts: PurgeCounts
    paths: list[Path] = field(default_factory=list)
    prune: list[Path] = field(default_factory=list)  # roots whose empty folders go too
    _seen: set[Path] = field(default_factory=set)

    def add(self, path: Path) -> None:
        if path in self._seen or not (path.exists() or path.is_symlink()):
            return
        self._seen.add(path)
        self.paths.append(path)
        for f in _files(path):
            self.counts.files += 1
            with contextlib.suppress(OSError):
                self.counts.bytes += f.lstat().st_size

    def apply(self) -> None:
        if self.dry_run:
            return
        for path in self.paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for root in self.prune:  # folders left empty (their names may carry a study's UID)
            for folder in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir() and not path.is_symlink():
        yield from (p for p in path.rglob("*") if p.is_file() or p.is_symlink())
    else:
        yield path


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
        self.runs = runs or StudyRunStore(places.data_dir, places.reports_dir)
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
        c, rm = report.counts, _Removal(dry_run, report.counts)
        cutoff = target.cutoff(now)
        keys: set[str] = set()  # the study keys (names) purged
        uids: set[str] = set()  # their StudyInstanceUIDs (for the PACS)
        kept_keys: set[str] = set()  # keys of runs that stay (retention keeps their study)

        # gateway runs
        for rec in self._records():
            if self._run_matches(target, rec, cutoff):
                if rec.status not in FINAL:
                    report.left.append(f"run {rec.run_id}: in progress ({rec.stage}), not purged")
                    if rec.study_key:
                        kept_keys.add(rec.study_key)
                    continue
                report.run_ids.append(rec.run_id)
                rm.add(self.runs.run_dir(rec.run_id))
                rm.add(self.runs.report_folder(rec.run_id))
                rm.add(self.runs.active_dir / rec.run_id)
                if rec.study_key:
                    keys.add(rec.study_key)
                if rec.study_uid:
                    uids.add(rec.study_uid)
            elif rec.study_key:
                kept_keys.add(rec.study_key)
        c.runs = len(report.run_ids)
        c.report_bundles = sum(self.runs.report_folder(r).is_dir() for r in report.run_ids)

        # spool studies and study states
        studies = self.runs.root / "spool" / "studies"
        for folder in sorted(studies.iterdir()) if studies.is_dir() else ():
            if not folder.is_dir():
                continue
            if cutoff is not None:
                hit = _received_before(folder, cutoff) and folder.name not in kept_keys
            else:
                hit = target.key_matches(folder.name) or (
                    StudyKey.parse_name(folder.name) is None and _folder_matches(target, folder)
                )
            if hit:
                rm.add(folder)
                c.spool_studies += 1
                keys.add(folder.name)
                parsed = StudyKey.parse_name(folder.name)
                if parsed:
                    uids.add(parsed[0])
        for path in sorted(self.runs.state_dir.glob("*.json")):
            state = _state(path)
            if state is None:
                continue
            if cutoff is not None:
                hit = _mtime(path) < cutoff and (state.key or "") not in kept_keys
            else:
                hit = target.key_matches(state.key) or (
                    state.key is None and target.study_uid == state.study_uid
                )
            if hit:
                rm.add(path)
                c.study_states += 1
                keys.add(state.key or state.study_uid)
                uids.add(state.study_uid)
        c.studies = len(keys)

        # loose instances: incoming, quarantine, the instance cache
        spool = self.runs.root / "spool"
        for sub in ("incoming", "quarantine"):
            c.spool_files += self._instances(spool / sub, target, cutoff, rm)
        c.cache_files = self._instances(self.runs.root / "cache", target, cutoff, rm)

        # suite runs and registered cases (a patient or study: retention is the gateway's)
        if cutoff is None:
            self._suite_runs(target, report, dry_run)
            self._registered(target, report, rm)

        # the review log: every event of the purged runs
        if report.run_ids and self.places.review_log and self.places.review_log.is_file():
            store = ReviewStore(self.places.review_log)
            if dry_run:
                c.review_events = sum(len(store.events(r)) for r in report.run_ids)
            else:
                c.review_events = store.erase(report.run_ids)

        # the PACS: the sandbox's own series of each study
        if pacs and self.orthanc is not None:
            c.pacs_objects = self._pacs(target, uids, dry_run)

        rm.apply()
        if not dry_run and self.audit is not None:
            self.audit.write(
                actor,
                "purge",
                target=f"{target.kind}:{report.subject}" if report.subject else target.kind,
                outcome="done" if not report.left else "partial",
                detail=_audit_detail(target, report),
            )
        return report

    # ----------------------------------------------------------------- runs

    def _records(self) -> Iterator[RunRecord]:
        folders = self.runs.runs_dir.iterdir() if self.runs.runs_dir.is_dir() else ()
        for folder in sorted(folders):
            try:
                yield self.runs.get(folder.name)
            except RunNotFoundError:
                continue

    def _run_matches(self, target: PurgeTarget, rec: RunRecord, cutoff: datetime | None) -> bool:
        if cutoff is not None:
            when = _iso(rec.finished_at) or _iso(rec.created_at)
            return when is not None and when < cutoff
        if target.key_matches(rec.study_key) or target.named_in(rec.identities):
            return True
        if target.study_uid is not None and rec.study_uid == target.study_uid:
            return True
        if rec.study_key is None and target.patient_id is not None:
            # a run recorded before keys had a patient: its cases say whose it is
            return bool(self._case_ids(self.runs.run_dir(rec.run_id), target))
        return False

    @staticmethod
    def _case_ids(folder: Path, target: PurgeTarget) -> list[str]:
        if not (folder / STORE_FILE).is_file():
            return []
        try:
            with RunStore(folder) as store:
                return store.case_ids_of(patient_id=target.patient_id, study_uid=target.study_uid)
        except (OSError, EvaluationError, sqlite3.Error, ValueError):
            return []

    def _suite_runs(self, target: PurgeTarget, report: PurgeReport, dry_run: bool) -> None:
        root = self.places.suite_runs
        if root is None or not root.is_dir():
            return
        review = (
            ReviewStore(self.places.review_log)
            if self.places.review_log and self.places.review_log.is_file()
            else None
        )
        for folder in sorted(p for p in root.iterdir() if (p / STORE_FILE).is_file()):
            ids = self._case_ids(folder, target)
            if not ids:
                continue
            report.counts.suite_cases += len(ids)
            if dry_run:
                continue
            with RunStore(folder) as store:
                report.counts.suite_rows += store.erase_cases(ids)
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

    def _registered(self, target: PurgeTarget, report: PurgeReport, rm: _Removal) -> None:
        root = self.places.cases
        if root is None or not root.is_dir():
            return
        cases, _ = case_registry(root)
        seen: set[str] = set()
        for case in cases.values():
            if case.root is None or case.root in seen:
                continue
            mine = (
                case.patient_id == target.patient_id
                if target.patient_id is not None
                else target.study_uid in case.provenance.study_uids
            )
            folder = Path(case.root).resolve()
            if mine and folder.is_relative_to(root.resolve()):
                seen.add(case.root)
                rm.add(folder)
                report.counts.registered_cases += 1

    # ----------------------------------------------------------------- instances

    @staticmethod
    def _instances(root: Path, target: PurgeTarget, cutoff: datetime | None, rm: _Removal) -> int:
        """Instance files under ``root`` of the target (by header), or older than ``cutoff``."""
        n = 0
        rm.prune.append(root)
        for path in sorted(root.rglob("*")) if root.is_dir() else ():
            if not path.is_file():
                continue
            if cutoff is not None:
                hit = _mtime(path) < cutoff
            else:
                head = _header(path) if path.suffix in (".dcm", ".part", "") else None
                hit = head is not None and target.header_matches(*head)
            if hit:
                rm.add(path)
                n += 1
        return n

    # ----------------------------------------------------------------- PACS

    def _pacs(self, target: PurgeTarget, uids: set[str], dry_run: bool) -> int:
        """Delete the sandbox's SR and PDF series from the target's studies in Orthanc."""
        assert self.orthanc is not None
        studies: set[tuple[str, str]] = set()  # (PatientID, StudyInstanceUID)
        if target.patient_id is not None:
            for uid in uids:
                studies.add((target.patient_id, uid))
            try:
                for st in self.orthanc.list_studies(orthanc_id(target.patient_id)):
                    studies.add((target.patient_id, st.study_uid))
            except OrthancError as exc:
                if exc.status != 404:
                    raise
        else:
            assert target.study_uid is not None
            for st in self.orthanc.studies_by_uid(target.study_uid):
                studies.add((st.patient_id, st.study_uid))
        n = 0
        for patient_id, uid in sorted(studies):
            for kind in SANDBOX_SERIES_KINDS:
                series = orthanc_id(patient_id, uid, series_uid_for(uid, kind))
                try:
                    instances = self.orthanc.series_instances(series)
                except OrthancError as exc:
                    if exc.status == 404:  # nothing of this kind written
                        continue
                    raise
                n += len(instances)
                if not dry_run:
                    for key in instances:
                        self.orthanc.delete_instance(key.instance_id)
        return n


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
        when = _iso(last) if isinstance(last, str) else None
    return (when or _mtime(info if info.exists() else folder)) < cutoff


def _folder_matches(target: PurgeTarget, folder: Path) -> bool:
    """A spool folder of an earlier layout (no patient in its name): by its first header."""
    first = next((p for p in folder.rglob("*.dcm")), None)
    head = _header(first) if first is not None else None
    return head is not None and target.header_matches(*head)


def _audit_detail(target: PurgeTarget, report: PurgeReport) -> str:
    if target.kind == "retention":
        what = f"data older than {target.older_than_days:g} days"
    else:
        what = f"1 {target.kind}"
    return f"purged {what}: {report.counts.summary()}"


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
