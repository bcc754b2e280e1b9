"""Who a study belongs to, as the hospital knows them: the identifiers a reviewer may see.

These never go to a model (the PHI gate works on the record and the note; images carry no
metadata). Every value comes from a DICOM header and is hostile: control characters are
dropped, lengths bounded, dates and sex checked against the standard's forms (an invalid value
becomes empty, never an error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pydicom
from pydantic import BaseModel, Field

from dicom.person import display_name
from dicom.records import IndexResult
from dicom.sources import open_source

MAX_TEXT = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_TAGS = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "AccessionNumber",
         "StudyDate", "StudyDescription", "InstitutionName")  # fmt: skip
_HEADER_CAP = 64 << 20


class HeaderIdentity(BaseModel):
    """The hospital's identifiers of one study (shown to reviewers, never sent to a model)."""

    patient_name: str = ""  # display form: "Given Family"
    patient_id: str = ""
    birth_date: str = ""  # ISO (YYYY-MM-DD) or empty
    sex: str = ""  # M, F, O or empty
    accession_number: str = ""
    study_date: str = ""  # ISO (YYYY-MM-DD) or empty
    study_description: str = ""
    institution: str = ""
    modalities: list[str] = Field(default_factory=list)
    n_series: int = 0


def clean_text(value: object, limit: int = MAX_TEXT) -> str:
    """A header value as safe display text: no control characters, at most ``limit`` long."""
    text = _CONTROL.sub(" ", str(value if value is not None else "")).strip()
    return text[:limit]


def iso_date(value: object) -> str:
    """A DICOM DA value (YYYYMMDD) as YYYY-MM-DD; empty when it is not a real date."""
    import datetime as dt

    m = _DATE.match(str(value or "").strip())
    if not m:
        return ""
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3])).isoformat()
    except ValueError:
        return ""


def identity_of(
    ds: pydicom.Dataset, modalities: Iterable[str] = (), n_series: int = 0
) -> HeaderIdentity:
    """The identity a header names (invalid values left out)."""
    sex = str(ds.get("PatientSex", "") or "").strip().upper()
    name = ds.get("PatientName", "")
    return HeaderIdentity(
        patient_name=clean_text(display_name(str(name).split("=")[0]) if name else ""),
        patient_id=clean_text(ds.get("PatientID", "")),
        birth_date=iso_date(ds.get("PatientBirthDate", "")),
        sex=sex if sex in ("M", "F", "O") else "",
        accession_number=clean_text(ds.get("AccessionNumber", "")),
        study_date=iso_date(ds.get("StudyDate", "")),
        study_description=clean_text(ds.get("StudyDescription", "")),
        institution=clean_text(ds.get("InstitutionName", "")),
        modalities=sorted({clean_text(m, 16) for m in modalities if m}),
        n_series=n_series,
    )


def study_identity(index: IndexResult) -> HeaderIdentity | None:
    """The identity of an indexed study, from the header of its first image (None if unreadable)."""
    series = [s for s in index.series if s.volumes and s.volumes[0]]
    if not series:
        return None
    try:
        with open_source(series[0].volumes[0][0].path, max_bytes=_HEADER_CAP) as fh:
            ds = pydicom.dcmread(fh, stop_before_pixels=True, specific_tags=list(_TAGS))
    except (OSError, ValueError, pydicom.errors.InvalidDicomError, EOFError):
        return None
    return identity_of(
        ds, [s.modality for s in index.series], len({s.series_uid for s in index.series})
    )
