"""Who a study belongs to, as the hospital knows them: the identifiers a reviewer may see.

These never go to a model (the PHI gate works on the record and the note; images carry no
metadata). Every value comes from a DICOM header and is hostile: control characters are
dropped, lengths bounded, dates and sex checked against the standard's forms (an invalid value
becomes empty, never an error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import pydicom
from pydantic import BaseModel, Field

from dicom.errors import MixedPatientsError
from dicom.person import CONTROL_CHARS, NamedPerson, display_name, persons_of, series_headers
from dicom.records import IndexResult, PatientKey
from dicom.sources import HEADER_PREFIX, open_source

MAX_TEXT = 64
_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_TAGS = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "PatientAge",
         "AccessionNumber", "StudyDate", "StudyDescription", "InstitutionName")  # fmt: skip
_SCANNER_TAGS = ("Manufacturer", "ManufacturerModelName", "MagneticFieldStrength")
MAX_SCANNERS = 8  # distinct scanners kept per study (a study of many series names a few)


class ScannerHeader(BaseModel):
    """A scanner the series of a study name, as their headers write it (bounded text, the field
    strength as written: the standard says tesla, some write gauss; read by the subgroups)."""

    manufacturer: str = ""
    model_name: str = ""
    field_strength: float | None = None  # MagneticFieldStrength as written (finite, > 0)
    n_series: int = 0  # series whose first header names it


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
    age: str = ""  # PatientAge as written when a valid AS value ("045Y"), else empty
    # the scanners the series' headers name, most series first (empty: none named)
    scanners: list[ScannerHeader] = Field(default_factory=list)


# Enumerated values the standard lists for attributes copied into reports (PS3.3 C.7.1.1).
_ENUMS = {"PatientSex": ("M", "F", "O")}
_CONTROL_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x0c\x0e-\x1f\x7f]")


def header_value_problem(keyword: str, value: object) -> str | None:
    """Why ``value`` of attribute ``keyword`` is outside the standard (its VR's form and length,
    its VM, its enumerated values, a real date or time), or None when it is a valid value.

    The one rule for every patient/study attribute copied from a study into what we write."""
    from datetime import date

    from pydicom import config
    from pydicom.datadict import dictionary_VM, dictionary_VR, tag_for_keyword
    from pydicom.multival import MultiValue
    from pydicom.valuerep import validate_value

    if value is None or value == "":
        return None
    tag = tag_for_keyword(keyword)
    if tag is None:
        return f"{keyword} is not a DICOM attribute"
    vr = dictionary_VR(tag)
    if isinstance(value, MultiValue | list | tuple):
        if dictionary_VM(tag) == "1":
            return f"{keyword} holds {len(value)} values where the standard allows one"
        values = list(value)
    else:
        values = [value]
    for v in values:
        text = str(v)
        if _CONTROL_IN_VALUE.search(text):
            return f"{keyword} contains control characters"
        try:
            validate_value(vr, text, config.RAISE)
        except (ValueError, TypeError) as exc:
            return f"{keyword} {_show(text)} is not a valid {vr} value ({exc})"
        if keyword in _ENUMS and text.strip() not in _ENUMS[keyword]:
            allowed = ", ".join(_ENUMS[keyword])
            return f"{keyword} {_show(text)} is not a value the standard allows ({allowed})"
        if vr == "DA":
            try:
                date(int(text[:4]), int(text[4:6]), int(text[6:8]))
            except ValueError:
                return f"{keyword} {_show(text)} is not a calendar date"
        if vr == "PN" and any(len(group.split("^")) > 5 for group in text.split("=")):
            return f"{keyword} {_show(text)} has more than five name components"
    return None


def _show(text: str) -> str:
    return repr(clean_text(text, 40))


def checked_attributes(
    ds: pydicom.Dataset, keywords: Iterable[str]
) -> tuple[dict[str, object], list[str]]:
    """The values of ``keywords`` in ``ds`` that the standard allows (an invalid one becomes
    None: the standard's empty form), and a warning for each one left out."""
    values: dict[str, object] = {}
    warnings = []
    for kw in keywords:
        if kw not in ds:
            continue
        try:
            value = ds.data_element(kw).value  # type: ignore[union-attr]
        except (ValueError, TypeError, UnicodeError) as exc:
            warnings.append(f"{kw} could not be decoded ({exc}): left empty")
            values[kw] = None
            continue
        problem = header_value_problem(kw, value)
        if problem:
            warnings.append(f"{problem}: left empty")
            values[kw] = None
        else:
            values[kw] = value
    return values, warnings


def clean_text(value: object, limit: int = MAX_TEXT) -> str:
    """A header value as safe display text: no control characters, at most ``limit`` long."""
    text = CONTROL_CHARS.sub(" ", str(value if value is not None else "")).strip()
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
    """The identity a header names (values outside the standard left out)."""
    v, _ = checked_attributes(ds, _TAGS)
    name = v.get("PatientName")
    return HeaderIdentity(
        patient_name=clean_text(display_name(str(name).split("=")[0])) if name else "",
        patient_id=clean_text(v.get("PatientID") or ""),
        birth_date=iso_date(v.get("PatientBirthDate")),
        sex=str(v.get("PatientSex") or ""),
        accession_number=clean_text(v.get("AccessionNumber") or ""),
        study_date=iso_date(v.get("StudyDate")),
        study_description=clean_text(v.get("StudyDescription") or ""),
        institution=clean_text(v.get("InstitutionName") or ""),
        modalities=sorted({clean_text(m, 16) for m in modalities if m}),
        n_series=n_series,
        age=str(v.get("PatientAge") or "").strip(),
        scanners=scanners_of([ds]),
    )


def scanner_of(ds: pydicom.Dataset) -> ScannerHeader | None:
    """The scanner one header names (None when it names none): values outside the standard's
    form left empty, text bounded, a field strength that is not a finite positive number left
    out."""
    import math

    v, _ = checked_attributes(ds, _SCANNER_TAGS)
    field: float | None = None
    try:
        raw = v.get("MagneticFieldStrength")
        field = float(raw) if raw is not None and str(raw).strip() else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        field = None
    if field is not None and not (math.isfinite(field) and field > 0):
        field = None
    found = ScannerHeader(
        manufacturer=clean_text(v.get("Manufacturer") or ""),
        model_name=clean_text(v.get("ManufacturerModelName") or ""),
        field_strength=field,
        n_series=1,
    )
    return found if found.manufacturer or found.model_name or field is not None else None


def scanners_of(headers: Iterable[pydicom.Dataset | None]) -> list[ScannerHeader]:
    """The distinct scanners ``headers`` (one per series) name, most series first, at most
    ``MAX_SCANNERS``; an unreadable header (None) adds none."""
    return merged_scanners(_scanner_or_none(ds) for ds in headers)


def _scanner_or_none(ds: pydicom.Dataset | None) -> ScannerHeader | None:
    if ds is None:
        return None
    try:
        return scanner_of(ds)
    except _HEADER_ERRORS:
        return None


def merged_scanners(found: Iterable[ScannerHeader | None]) -> list[ScannerHeader]:
    """One entry per distinct scanner, its series counted, most series first (the first seen
    first among equals), at most ``MAX_SCANNERS``."""
    counts: dict[tuple[str, str, float | None], ScannerHeader] = {}
    for s in found:
        if s is None:
            continue
        key = (s.manufacturer, s.model_name, s.field_strength)
        if key in counts:
            counts[key].n_series += s.n_series
        elif len(counts) < 4 * MAX_SCANNERS:
            counts[key] = s.model_copy()
    return sorted(counts.values(), key=lambda s: -s.n_series)[:MAX_SCANNERS]


_HEADER_ERRORS = (ValueError, TypeError, UnicodeError, RecursionError, AttributeError)


def study_identity(index: IndexResult) -> HeaderIdentity | None:
    """The identity of an indexed study, from the header of its first image (None if unreadable)."""
    series = [s for s in index.series if s.volumes and s.volumes[0]]
    if not series:
        return None
    kept = index.series_headers.get(series[0].series_uid)
    if kept is not None:
        return identity_of(
            kept, [s.modality for s in index.series], len({s.series_uid for s in index.series})
        )
    try:
        with open_source(series[0].volumes[0][0].path, prefix=HEADER_PREFIX) as fh:
            ds = pydicom.dcmread(fh, stop_before_pixels=True, specific_tags=list(_TAGS))
    except (OSError, ValueError, pydicom.errors.InvalidDicomError, EOFError):
        return None
    return identity_of(
        ds, [s.modality for s in index.series], len({s.series_uid for s in index.series})
    )


def study_identity_and_persons(
    index: IndexResult,
) -> tuple[HeaderIdentity | None, list[NamedPerson]]:
    """The study's identity and every person its headers name, reading the first header of
    each series once (the identity, and ``persons_of`` over ``series_headers``, in one pass)."""
    modalities = [s.modality for s in index.series]
    n_series = len({s.series_uid for s in index.series})
    found: list[HeaderIdentity] = []
    scanners: list[ScannerHeader] = []

    def tapped() -> Iterator[pydicom.Dataset | None]:
        seen: list[ScannerHeader | None] = []
        for k, ds in enumerate(series_headers(index)):
            if k == 0 and ds is not None:
                found.append(identity_of(ds, modalities, n_series))
            seen.append(_scanner_or_none(ds))
            yield ds
        scanners.extend(merged_scanners(seen))  # every series' header, not the first alone

    persons = persons_of(tapped())
    # A first header that failed whole may still give the identity's few attributes.
    identity = found[0] if found else study_identity(index)
    if identity is not None and scanners:
        identity.scanners = scanners
    return identity, persons


# --------------------------------------------------------------------------- one patient


def distinct_patients(keys: Iterable[PatientKey]) -> list[PatientKey]:
    """The different people among ``keys`` by ``PatientKey.same_patient`` (the fullest key of
    each kept: the one carrying most values)."""
    out: list[PatientKey] = []
    for key in sorted(set(keys), key=lambda k: (-sum(map(bool, k.model_dump().values())), repr(k))):
        if not any(key.same_patient(k) for k in out):
            out.append(key)
    return out


def patients_in(index: IndexResult) -> list[PatientKey]:
    """Every different patient the index's image series name (normally one)."""
    return distinct_patients(k for s in index.series for k in s.patients)


def one_patient(index: IndexResult, what: str = "the study") -> PatientKey:
    """The one patient of an index; ``MixedPatientsError`` naming the identities (and, for a
    series that mixes patients, the series) when its files name more than one."""
    found = patients_in(index)
    if len(found) <= 1:
        return found[0] if found else PatientKey()
    mixed = sorted(
        {
            f"series {s.series_number if s.series_number is not None else '?'} "
            f"({clean_text(s.description, 40) or s.series_uid[-12:]})"
            for s in index.series
            if len(distinct_patients(s.patients)) > 1
        }
    )
    who = [k.describe() for k in found]
    where = f"; mixed within {', '.join(mixed[:5])}" if mixed else ""
    raise MixedPatientsError(
        f"{what} names {len(found)} patients ({'; '.join(who[:5])}){where}: not evaluated as one",
        who,
    )
