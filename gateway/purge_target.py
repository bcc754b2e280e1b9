"""What a purge is of, and how a place's record is matched to it (``gateway.purge``).

A patient is found as the sandbox keys it (``StudyKey``: PatientID with its issuer, hashed into
spool folder and study state names; a DICOM header's PatientID and issuer; a case's
``patient_id``), never by a name. A study is its StudyInstanceUID, whichever patient it is under.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pydicom
from pydantic import BaseModel, Field, ValidationError, model_validator

from dicom import check_uid
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
