"""What a purge is of, and how a place's record is matched to it (``gateway.purge``).

A patient is found as the sandbox keys it (``StudyKey``: PatientID with its issuer, hashed into
spool folder and study state names; a DICOM header's PatientID and issuer; a case's
``patient_id``), never by a name. A study is its StudyInstanceUID, whichever patient it is under.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pydicom
from pydantic import BaseModel, Field, ValidationError, model_validator

from dicom import check_uid
from evaluation import EvaluationError
from evaluation.log import open_store, store_exists
from gateway.runs import RunNotFoundError, RunRecord, StudyRunStore
from gateway.study_key import StudyKey

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
    # None: not given, the PatientID under whatever issuer the sandbox holds it (one at most:
    # two issuers are two patients, and the purge is refused naming them); "": none
    issuer: str | None = None
    # the issuers the patient's data carry, as found (``Sweep.resolve``): whose keys match
    issuers: list[str] = Field(default_factory=list)
    study_uid: str | None = None
    older_than_days: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> PurgeTarget:
        given = [x is not None for x in (self.patient_id, self.study_uid, self.older_than_days)]
        if sum(given) != 1:
            raise PurgeError("name exactly one of: a patient, a study, an age in days")
        if self.patient_id is not None:
            self.patient_id = _clean_id(self.patient_id, "the PatientID")
            if self.issuer is not None:
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
        """The patient's hash in spool folder and study state names (``StudyKey``), under the
        issuer given (none when not given)."""
        return _hash(self.patient_id or "", self.issuer or "")

    @property
    def patient_hashes(self) -> set[str]:
        """Every patient hash of the target's keys: with an issuer given, that issuer's; else
        the PatientID with no issuer (a study from Orthanc's change feed is keyed so, as
        Orthanc keys it) and with each issuer found."""
        if self.issuer is not None:
            return {self.patient_hash}
        return {_hash(self.patient_id or "", i) for i in ("", *self.issuers)}

    def is_patient(self, patient_id: str, issuer: str) -> bool:
        """Whether a PatientID and issuer (a header's, a spool study's) are the target's."""
        if self.patient_id is None or patient_id != self.patient_id:
            return False
        return self.issuer is None or issuer == self.issuer

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
            return patient in self.patient_hashes
        return self.study_uid is not None and uid == self.study_uid

    def header_matches(self, patient_id: str, issuer: str, study_uid: str) -> bool:
        """Whether a DICOM header's PatientID, issuer and StudyInstanceUID are of the target."""
        if self.patient_id is not None:
            return self.is_patient(patient_id, issuer)
        return self.study_uid is not None and study_uid == self.study_uid

    def named_in(self, identities: Iterable[str]) -> bool:
        """Whether a held run's identities (``PatientKey.describe``) name this patient."""
        if self.patient_id is None:
            return False
        return any(self.is_patient(*identity_patient(i)) for i in identities)


def _hash(patient_id: str, issuer: str) -> str:
    return StudyKey(study_uid="0", patient_id=patient_id, issuer=issuer).patient_hash


_IDENTITY = re.compile(r"^ID (.*?)(?: \(([^()]*)\))?(?:, .*)?$")


def identity_patient(identity: str) -> tuple[str, str]:
    """PatientID and issuer of a held run's identity (``PatientKey.describe``: ``ID X
    (issuer), name ..., born ...``); ("", "") when it is not one."""
    m = _IDENTITY.match(identity)
    return (m.group(1), m.group(2) or "") if m else ("", "")


def read_header(path: Path) -> tuple[str, str, str] | None:
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


def mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)


def iso(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


@dataclass(kw_only=True)
class Finder:
    """What is the target's, as each place records it: runs (folders, and the PostgreSQL run
    log's), DICOM headers (read once), a patient's issuers."""

    runs: StudyRunStore
    target: PurgeTarget
    cutoff: datetime | None
    database_url: str | None = None
    # the DATA_DIR of the spool and the instance cache (None: the runs' root, as without a
    # NEUROSANDBOX_SHARED_DIR)
    data_dir: Path | None = None
    issuers_matched: list[str] = field(default_factory=list)
    _headers: dict[Path, tuple[str, str, str] | None] = field(default_factory=dict)

    def header(self, path: Path) -> tuple[str, str, str] | None:
        if path not in self._headers:
            self._headers[path] = read_header(path)
        return self._headers[path]

    def run_header(self, run_id: str) -> tuple[str, str, str] | None:
        """The header of the first DICOM file in a run's folder (its study, for a study from
        Orthanc; its SR copies, which carry the study's patient and issuer)."""
        folder = self.runs.run_dir(run_id)
        first = next(iter(sorted(folder.rglob("*.dcm"))), None) if folder.is_dir() else None
        return self.header(first) if first is not None else None

    # ----------------------------------------------------------------- the patient's issuers

    def resolve(self) -> None:
        """A patient's issuers as the sandbox holds the PatientID (spool studies, loose
        instances, runs' DICOM files and held runs' identities). With ``--issuer`` not given,
        the target matches the PatientID with no issuer and with the one issuer found; two
        issuers are two patients: ``PurgeError`` naming them, nothing removed."""
        t = self.target
        if t.patient_id is None or self.cutoff is not None:
            return
        found: set[str] = set()
        studies = self.data / "spool" / "studies"
        for folder in studies.iterdir() if studies.is_dir() else ():
            info = _received_info(folder)
            if info.get("patient_id") == t.patient_id:
                found.add(str(info.get("issuer") or ""))
        for root in self.instance_roots():
            for path in sorted(root.rglob("*")) if root.is_dir() else ():
                head = self.header(path) if maybe_dicom(path) else None
                if head is not None and head[0] == t.patient_id:
                    found.add(head[1])
        for rec in self.records():
            found |= {i for p, i in map(identity_patient, rec.identities) if p == t.patient_id}
            head = self.run_header(rec.run_id)
            if head is not None and head[0] == t.patient_id:
                found.add(head[1])
        named = sorted(i for i in found if i)
        if t.issuer is None and len(named) > 1:
            raise PurgeError(
                f"PatientID {t.patient_id} is held under {len(named)} issuers "
                f"({', '.join(named)}): each is another patient; name one with --issuer"
            )
        self.target = t.model_copy(update={"issuers": named})
        self.issuers_matched = sorted(i for i in found if t.is_patient(t.patient_id, i))

    def records(self) -> Iterator[RunRecord]:
        """Every gateway run: the run folders, and with PostgreSQL the log's runs too."""
        folders = self.runs.runs_dir.iterdir() if self.runs.runs_dir.is_dir() else ()
        ids = {f.name for f in folders}
        if self.database_url is not None:
            ids.update(self.runs.ids())
        for run_id in sorted(ids):
            try:
                yield self.runs.get(run_id)
            except RunNotFoundError:
                continue

    def run_matches(self, rec: RunRecord) -> bool:
        target = self.target
        if self.cutoff is not None:
            when = iso(rec.finished_at) or iso(rec.created_at)
            return when is not None and when < self.cutoff
        if target.key_matches(rec.study_key) or target.named_in(rec.identities):
            return True
        if target.study_uid is not None and rec.study_uid == target.study_uid:
            return True
        if target.patient_id is None:
            return False
        # a study from Orthanc's change feed is keyed without its issuer: its files say whose
        head = self.run_header(rec.run_id)
        if head is not None and target.is_patient(head[0], head[1]):
            return True
        if rec.study_key is None:
            # a run recorded before keys had a patient: its cases say whose it is
            return bool(case_ids(self.runs.run_dir(rec.run_id), target, self.database_url))
        return False

    @property
    def data(self) -> Path:
        """DATA_DIR: the spool and the instance cache (the runs may be in SHARED_DIR)."""
        return self.data_dir or self.runs.root

    def instance_roots(self) -> tuple[Path, Path, Path]:
        spool = self.data / "spool"
        return spool / "incoming", spool / "quarantine", self.data / "cache"


def case_ids(folder: Path, target: PurgeTarget, database_url: str | None = None) -> list[str]:
    """The cases of the target in the run store of ``folder`` ([] when none or unreadable)."""
    if not store_exists(folder, database_url):
        return []
    try:
        with open_store(folder, database_url=database_url) as store:
            return store.case_ids_of(patient_id=target.patient_id, study_uid=target.study_uid)
    except (OSError, EvaluationError, sqlite3.Error, ValueError):
        return []


def maybe_dicom(path: Path) -> bool:
    return path.is_file() and path.suffix in (".dcm", ".part", "")


def _received_info(folder: Path) -> dict[str, Any]:
    try:
        info = json.loads((folder / ".received.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
