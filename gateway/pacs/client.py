"""What every kind of PACS does for the sandbox, as typed records and one Protocol.

``StudyQuery`` is what a cohort is found by; ``StudyMatch`` is one study the archive holds;
``RetrievedStudy`` is a study pulled into a folder; ``PacsClient`` finds, retrieves and stores.
The DIMSE (``dimse``), DICOMweb (``dicomweb``) and Orthanc REST (``orthanc_rest``) clients
implement it; ``open_client`` (``gateway.pacs``) makes the one a configuration names.

A UID is not an identity: a match carries its patient, and ``keep_the_study`` is the one rule a
retrieved (or received) file passes to be kept under a match: its StudyInstanceUID and its
PatientID with issuer are the match's. A file of another study or patient is removed and listed,
never evaluated under the match's identity.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Protocol, runtime_checkable

import pydicom
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.multival import MultiValue

from dicom import PatientKey, check_uid

MAX_QUERY_VALUES = 1000  # accession numbers or patient IDs in one query
MAX_MATCHES = 5000  # studies one query may list
MAX_LISTED = 50  # files listed by name in a RetrievedStudy's problems

# the values a query may carry: no backslash (DICOM's value separator), no control characters;
# a description pattern may use * and ? (DICOM's wildcards), nothing else may
_PLAIN = r"^[^\\\x00-\x1f\x7f*?]*$"
Accession = Annotated[str, Field(min_length=1, max_length=16, pattern=_PLAIN)]  # SH
PatientId = Annotated[str, Field(min_length=1, max_length=64, pattern=_PLAIN)]  # LO
Modality = Annotated[str, Field(pattern=r"^[A-Z0-9_]{1,16}$")]  # CS

# Progress of a retrieval: (instances done, instances expected or None when unknown)
Progress = Callable[[int, int | None], None]


class PacsRequestError(RuntimeError):
    """A PACS could not be reached, refused, or answered what the standard does not allow;
    the message names the PACS and what was asked."""


class StudyQuery(BaseModel):
    """A cohort's definition: every field given narrows it (lists are alternatives)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accession_numbers: list[Accession] = Field(default_factory=list, max_length=MAX_QUERY_VALUES)
    patient_ids: list[PatientId] = Field(default_factory=list, max_length=MAX_QUERY_VALUES)
    study_uids: list[str] = Field(default_factory=list, max_length=MAX_QUERY_VALUES)
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    modalities: list[Modality] = Field(default_factory=list, max_length=16)
    description: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[^\\\x00-\x1f\x7f]*$",
        description="StudyDescription pattern; * and ? are wildcards; case-insensitive",
    )
    limit: int = Field(default=500, ge=1, le=MAX_MATCHES)

    @field_validator("study_uids")
    @classmethod
    def _uids(cls, v: list[str]) -> list[str]:
        return [check_uid(u) for u in v]

    @model_validator(mode="after")
    def _dates(self) -> StudyQuery:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError(f"date_from {self.date_from} is after date_to {self.date_to}")
        return self

    def dicom_date_range(self) -> str:
        """The StudyDate range matching key ("YYYYMMDD-YYYYMMDD", open ends allowed), "" if none."""
        if not (self.date_from or self.date_to):
            return ""
        f = self.date_from.strftime("%Y%m%d") if self.date_from else ""
        t = self.date_to.strftime("%Y%m%d") if self.date_to else ""
        return f if f == t else f"{f}-{t}"

    def description_patterns(self) -> list[str]:
        """The description patterns to send: as typed and, when it has lower-case letters, in
        upper case too (matching is case-sensitive in most archives, and StudyDescription is
        usually upper case); the answers are filtered again case-insensitively."""
        if not self.description:
            return []
        upper = self.description.upper()
        return [self.description] if upper == self.description else [self.description, upper]

    def description_matches(self, value: str) -> bool:
        """Whether a StudyDescription matches the pattern (True when there is none): the
        client filters again what a PACS returned, as archives differ on case and wildcards."""
        if not self.description:
            return True
        rx = "".join(
            ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in self.description
        )
        return re.fullmatch(rx, value.strip(), re.IGNORECASE | re.DOTALL) is not None

    def matches(self, m: StudyMatch) -> bool:
        """Whether a study the PACS returned is in the cohort (archives ignore keys they do not
        support, so every key is checked again here)."""
        if self.accession_numbers and m.accession not in self.accession_numbers:
            return False
        if self.patient_ids and m.patient_id not in self.patient_ids:
            return False
        if self.study_uids and m.study_uid not in self.study_uids:
            return False
        if self.modalities and m.modalities and not set(self.modalities) & set(m.modalities):
            return False
        if (self.date_from or self.date_to) and m.study_date is None:
            return False
        if self.date_from and m.study_date and m.study_date < self.date_from:
            return False
        if self.date_to and m.study_date and m.study_date > self.date_to:
            return False
        return self.description_matches(m.description)


class StudyMatch(BaseModel):
    """One study a PACS holds, found by its UID and its patient together. Names and dates stay
    on this machine (the manifest, the table); nothing here is sent to a model."""

    model_config = ConfigDict(frozen=True)

    pacs: str  # the configured name
    study_uid: str
    patient_id: str = ""
    issuer: str = ""
    patient_name: str = ""
    birth_date: str = ""  # YYYYMMDD as the archive has it
    accession: str = ""
    study_date: dt.date | None = None
    modalities: list[str] = Field(default_factory=list)
    description: str = ""
    n_series: int | None = None
    n_instances: int | None = None

    @field_validator("study_uid")
    @classmethod
    def _uid(cls, v: str) -> str:
        return check_uid(v)

    def patient(self) -> PatientKey:
        """The patient key the retrieved files must carry."""
        return PatientKey.of(self.patient_id, self.issuer, self.patient_name, self.birth_date)


class RetrievedStudy(BaseModel):
    """A study pulled into ``folder``: what was kept, and every file that was not, and why."""

    match: StudyMatch
    folder: Path
    n_files: int = 0  # files kept: this study, this patient
    n_bytes: int = 0
    seconds: float = 0.0
    cached: bool = False  # already in the cache: nothing was pulled
    failed: list[str] = Field(default_factory=list)  # instances the PACS could not send
    rejected: list[str] = Field(default_factory=list)  # files of another study or patient


class StoreResult(BaseModel):
    """One object stored (or not) by ``PacsClient.store``."""

    sop_instance_uid: str
    stored: bool
    detail: str = ""  # the PACS's status or error when not stored


@runtime_checkable
class PacsClient(Protocol):
    """Find, pull and store studies on one configured PACS."""

    name: str

    def find_studies(self, query: StudyQuery) -> list[StudyMatch]:
        """The studies of the cohort, at most ``query.limit``; PacsRequestError when the PACS fails."""
        ...

    def retrieve(
        self, match: StudyMatch, dest: Path, progress: Progress | None = None
    ) -> RetrievedStudy:
        """Pull every instance of ``match`` into the (empty) folder ``dest``; the files kept
        pass ``keep_the_study``."""
        ...

    def store(self, objects: Sequence[Dataset]) -> list[StoreResult]:
        """Store each object; one result per object, in order (never raises for one refusal;
        PacsRequestError when the PACS cannot be reached at all)."""
        ...

    def close(self) -> None: ...


MAX_TEXT = 256  # characters kept of any value a PACS returns


def pacs_text(v: object) -> str:
    """A value a PACS returned, as bounded printable text (a multi-valued one joined by \\)."""
    if v is None:
        return ""
    if isinstance(v, list | tuple | MultiValue):
        v = "\\".join(str(x) for x in list(v)[:64])
    return "".join(c for c in str(v)[:MAX_TEXT] if c.isprintable())


def pacs_date(v: object) -> dt.date | None:
    """A DICOM date (YYYYMMDD) a PACS returned, None when it is not one."""
    try:
        return dt.datetime.strptime(pacs_text(v)[:8], "%Y%m%d").date()
    except ValueError:
        return None


def pacs_count(v: object) -> int | None:
    """A count a PACS returned (0 to ten million), None when it is not one."""
    try:
        n = int(pacs_text(v).strip())
    except ValueError:
        return None
    return n if 0 <= n <= 10_000_000 else None


_KEY_TAGS = ["StudyInstanceUID", "PatientID", "IssuerOfPatientID", "SOPInstanceUID"]


def keep_the_study(match: StudyMatch, folder: Path, started: float | None = None) -> RetrievedStudy:
    """The one identity rule for pulled and received files: in ``folder``, a file whose
    StudyInstanceUID or PatientID/issuer is not the match's, or that is not DICOM, is removed
    and listed; the rest is the study."""
    import time

    out = RetrievedStudy(match=match, folder=folder)
    want = (match.study_uid, match.patient_id.strip(), match.issuer.strip())
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        name = str(path.relative_to(folder))[:200]
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_KEY_TAGS)
        except (InvalidDicomError, OSError, ValueError, EOFError) as exc:
            out.rejected.append(f"{name}: not a readable DICOM file ({str(exc)[:120]})")
            path.unlink(missing_ok=True)
            continue
        got = (
            str(ds.get("StudyInstanceUID", "")),
            str(ds.get("PatientID", "")).strip(),
            str(ds.get("IssuerOfPatientID", "")).strip(),
        )
        if got != want:
            why = "another study" if got[0] != want[0] else "another patient"
            out.rejected.append(f"{name}: {why} than the archive's study, removed")
            path.unlink(missing_ok=True)
            continue
        out.n_files += 1
        out.n_bytes += path.stat().st_size
    if len(out.rejected) > MAX_LISTED:
        more = len(out.rejected) - MAX_LISTED
        out.rejected = [*out.rejected[:MAX_LISTED], f"... and {more} more"]
    if started is not None:
        out.seconds = round(time.monotonic() - started, 3)
    return out
