"""A whole study de-identified into a folder, and the folder checked by reading it back.

What leaves the building as DICOM (``neurosandbox export-case``): every image object of a study
goes through the PS3.15 basic profile of :mod:`dicom.deid` and is written under a new name
(``S01_MR/IM0001.dcm``), never the source's file or folder names, which may name the patient.
Non-image objects (structured reports, raw data, documents) are left out: their free text is
beyond what the profile can clean, and no case renders them. A series whose pixels may carry
identifying text (burned-in annotation, secondary capture, scanned document) is left out whole,
unless the policy allows it; then it is exported and flagged.

:func:`verify_deidentified_study` reads every written file again and checks it on its own
terms: the de-identification marks, one patient pseudonym, no original instance UID, no person
name, no private tag, consistent study/series UIDs, and none of the identifying strings of the
source headers anywhere in its bytes (:class:`SourceIdentifiers`, which is also what a caller
scrubs the case's free text with).
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from typing import Any

import pydicom
from pydantic import BaseModel, Field, PrivateAttr
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.valuerep import PersonName

from dicom.deid import (
    DICOM_ROOT,
    DUMMY_TEXT,
    NON_INSTANCE_UID_KEYWORDS,
    BurnedInAnnotationError,
    Deidentifier,
    DeidPolicy,
    as_list,
    burned_in_reason,
    walk_elements,
)
from dicom.errors import ImagingError
from dicom.headers import DEFAULT_MEMORY_CAP
from dicom.index import index_path
from dicom.records import SequenceClass, SeriesInfo
from dicom.sources import iter_sources, open_source

__all__ = [
    "DeidSummary",
    "DeidentifiedStudy",
    "ExportedSeries",
    "SkippedSeries",
    "SourceIdentifiers",
    "StudyCheck",
    "deidentify_study",
    "verify_deidentified_study",
]

# Identifier attributes whose whole value identifies the patient or the visit (any depth).
_ID_KEYWORDS = frozenset(
    {
        "PatientID",
        "OtherPatientIDs",
        "AccessionNumber",
        "StudyID",
        "AdmissionID",
        "ServiceEpisodeID",
        "RequestedProcedureID",
        "PerformedProcedureStepID",
        "ScheduledProcedureStepID",
        "FillerOrderNumberImagingServiceRequest",
        "PlacerOrderNumberImagingServiceRequest",
        "MedicalRecordLocator",
        "InsurancePlanIdentification",
    }
)
# Where the patient lives and where the study was made.
_PLACE_KEYWORDS = frozenset(
    {
        "PatientAddress",
        "PatientTelephoneNumbers",
        "ReferringPhysicianAddress",
        "ReferringPhysicianTelephoneNumbers",
        "PersonAddress",
        "PersonTelephoneNumbers",
        "InstitutionName",
        "InstitutionAddress",
    }
)
# Shorter strings identify nobody and would match ordinary words, lab values or pixel bytes.
_MIN_NAME = 3
_MIN_ID = 4
_MIN_DIGIT_ID = 6  # an all-digit identifier shorter than this is any number in a record
# Pixel data is copied unchanged (what it shows is the burned-in policy's business); it is still
# searched for the longer terms, which random pixel bytes cannot spell by chance.
_MIN_PIXEL_TERM = 6
_PIXEL_TAGS = (0x7FE00010, 0x7FE00008, 0x7FE00009)  # PixelData, Float and Double Float
_WORD = rb"0-9A-Za-z"
_UID_TOKEN = re.compile(rb"[0-9]+(?:\.[0-9]+)+")
_NAME_SPLIT = re.compile(r"[\s,\-]+")
_DCM_MARKER = b"DICM"


def _is_instance_uid(keyword: str, value: str) -> bool:
    """A UID that names an instance (remapped by the profile), not a class or syntax."""
    return bool(value) and not (
        "ClassUID" in keyword
        or keyword in NON_INSTANCE_UID_KEYWORDS
        or value.startswith(DICOM_ROOT)
    )


def _values(value: Any) -> list[Any]:
    """Values of an element as a list, an empty string as none."""
    return [] if value == "" else as_list(value)


class SourceIdentifiers(BaseModel):
    """The identifying strings and instance UIDs of a study's source headers.

    Names (every component of every person-name attribute, at any depth), identifiers (patient,
    visit, order and study IDs), places (addresses, telephone numbers, institution) and the
    birth date in its usual written forms, each with the attribute it came from; and every
    instance UID. Held in memory to scrub the case's text and to check what is written; never
    written anywhere, never shown (a finding names the attribute, not the value).
    """

    values: dict[str, str] = Field(default_factory=dict, repr=False)  # term -> keyword
    uids: set[str] = Field(default_factory=set, repr=False)
    _text_rx: re.Pattern[bytes] | None = PrivateAttr(default=None)
    _forms: dict[bytes, str] = PrivateAttr(default_factory=dict)

    def add(self, ds: Dataset) -> None:
        """Collect the identifiers of one source dataset (private elements are not read)."""
        self._text_rx = None
        for _parent, elem in walk_elements(ds):
            if elem.tag.is_private:
                continue
            keyword = elem.keyword or ""
            if elem.VR == "PN":
                for value in _values(elem.value):
                    for term in _name_terms(value):
                        self.values.setdefault(term, keyword)
            elif elem.VR == "UI":
                for value in _values(elem.value):
                    uid = str(value).strip().rstrip("\x00")
                    if _is_instance_uid(keyword, uid):
                        self.uids.add(uid)
            elif keyword in _ID_KEYWORDS or keyword in _PLACE_KEYWORDS:
                for value in _values(elem.value):
                    term = " ".join(str(value).split())
                    if _long_enough_id(term):
                        self.values.setdefault(term, keyword)
            elif keyword == "PatientBirthDate":
                for value in _values(elem.value):
                    for term in _date_forms(str(value)):
                        self.values.setdefault(term, keyword)

    def with_terms(self, terms: list[str], where: str) -> SourceIdentifiers:
        """A copy that also looks for `terms` (reported as found values of `where`)."""
        values = dict(self.values)
        for term in terms:
            values.setdefault(term, where)
        return SourceIdentifiers(values=values, uids=set(self.uids))

    def terms(self) -> list[str]:
        """The identifying strings, longest first (for scrubbing free text; UIDs excluded)."""
        return sorted(self.values, key=lambda t: (-len(t), t))

    def find(self, data: bytes) -> list[str]:
        """Keywords whose source values occur in `data` (case-insensitive, whole words), and
        "an original instance UID" when one does."""
        found: set[str] = set()
        rx = self._pattern()
        if rx is not None:
            for match in rx.finditer(data):
                found.add(self._forms.get(match.group(0).lower(), "an identifier"))
        if self.uids and any(t.decode() in self.uids for t in _UID_TOKEN.findall(data)):
            found.add("an original instance UID")
        return sorted(found)

    def find_in_dicom(self, data: bytes, ds: Dataset) -> list[str]:
        """`find` over a DICOM file's bytes read as `ds`: everything but the pixel data in full;
        the pixel data (copied unchanged) for the longer terms only."""
        spans = _pixel_spans(ds)
        outside = bytearray()
        pos = 0
        for start, end in spans:
            outside += data[pos:start] + b"\x00"
            pos = end
        outside += data[pos:]
        found = set(self.find(bytes(outside)))
        self._pattern()
        for start, end in spans:
            pixels = data[start:end]
            for form, keyword in self._forms.items():
                if len(form) >= _MIN_PIXEL_TERM and _find_any_case(pixels, form):
                    found.add(keyword)
        return sorted(found)

    def _pattern(self) -> re.Pattern[bytes] | None:
        if self._text_rx is None and self.values:
            forms: dict[bytes, str] = {}
            for term, keyword in self.values.items():
                for variant in {term, term.upper(), term.lower()}:
                    for encoding in ("utf-8", "latin-1"):
                        try:
                            raw = variant.encode(encoding)
                        except UnicodeEncodeError:
                            continue
                        forms.setdefault(raw.lower(), keyword)
            self._forms = forms
            alternatives = b"|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
            self._text_rx = re.compile(
                rb"(?<![" + _WORD + rb"])(?:" + alternatives + rb")(?![" + _WORD + rb"])",
                re.IGNORECASE,
            )
        return self._text_rx


def _find_any_case(data: bytes, form: bytes) -> bool:
    return any(v in data for v in {form, form.upper(), form.lower(), form.title()})


def _name_terms(value: Any) -> list[str]:
    """Family, given and middle names (and each of their words), not prefixes or suffixes."""
    try:
        name = value if isinstance(value, PersonName) else PersonName(str(value))
        groups = name.components
    except (ValueError, UnicodeError, TypeError):
        groups = (str(value),)
    terms: list[str] = []
    for group in groups:
        for component in group.split("^")[:3]:
            words = [component.strip(), *_NAME_SPLIT.split(component)]
            terms.extend(
                w.strip()
                for w in words
                if len(w.strip()) >= _MIN_NAME and any(c.isalpha() for c in w)
            )
    return terms


def _long_enough_id(term: str) -> bool:
    if term.isdigit():
        return len(term) >= _MIN_DIGIT_ID
    return len(term) >= _MIN_ID


def _date_forms(value: str) -> list[str]:
    digits = value.strip().replace(".", "")
    if len(digits) != 8 or not digits.isdigit():
        return []
    y, m, d = digits[:4], digits[4:6], digits[6:]
    return [digits, f"{y}-{m}-{d}", f"{d}/{m}/{y}", f"{m}/{d}/{y}", f"{d}.{m}.{y}"]


def _pixel_spans(ds: Dataset) -> list[tuple[int, int]]:
    """Byte ranges of the pixel data values in the file `ds` was read from."""
    spans = []
    for tag in _PIXEL_TAGS:
        if tag not in ds:
            continue
        elem = ds.get_item(tag)
        start = getattr(elem, "value_tell", None)
        if start is None:
            start = getattr(elem, "file_tell", None)
        value = elem.value
        if isinstance(start, int) and isinstance(value, bytes | bytearray):
            spans.append((start, start + len(value)))
    return sorted(spans)


# --------------------------------------------------------------------------- records


class ExportedSeries(BaseModel):
    """One series as written: its folder, new UIDs and files (relative to the output folder)."""

    folder: str
    study_uid: str
    series_uid: str
    modality: str = ""
    series_number: int | None = None
    series_class: str = ""
    description: str = ""  # as written (cleaned of the patient's name and ID)
    files: list[str] = Field(default_factory=list)
    burned_in: str = ""  # why its pixels may show text, when the policy let it through


class SkippedSeries(BaseModel):
    """Objects of the source left out, and why; safe to write (no UID, name or path)."""

    series_number: int | None = None
    modality: str = ""
    series_class: str = ""
    n_files: int = 0
    reason: str
    detail: str = Field(default="", exclude=True, repr=False)  # local: may name a path


class DeidSummary(BaseModel):
    """What the profile did over the whole study: attribute keywords per action, counts."""

    method: str = ""
    method_codes: list[str] = Field(default_factory=list)
    temporal_information: str | None = None
    removed: list[str] = Field(default_factory=list)
    emptied: list[str] = Field(default_factory=list)
    replaced: list[str] = Field(default_factory=list)
    uids_remapped: list[str] = Field(default_factory=list)
    shifted: list[str] = Field(default_factory=list)
    cleaned: list[str] = Field(default_factory=list)
    private_tags_removed: int = 0
    unknown_tags_removed: int = 0

    def merge(self, audit: dict[str, Any]) -> None:
        for key in ("removed", "emptied", "replaced", "uids_remapped", "shifted", "cleaned"):
            merged = set(getattr(self, key)) | set(audit.get(key) or [])
            setattr(self, key, sorted(merged))
        self.private_tags_removed += int(audit.get("private_tags_removed") or 0)
        self.unknown_tags_removed += int(audit.get("unknown_tags_removed") or 0)
        self.method_codes = list(audit.get("method_codes") or self.method_codes)
        self.temporal_information = audit.get("temporal_information") or (self.temporal_information)


class DeidentifiedStudy(BaseModel):
    """A study written de-identified: what was written, what was left out and why.

    ``date_shift_days`` and ``identifiers`` are for the caller in this process only (to treat
    the case's record alike and to check the output): excluded from every dump.
    """

    series: list[ExportedSeries] = Field(default_factory=list)
    skipped: list[SkippedSeries] = Field(default_factory=list)
    n_source_files: int = 0
    summary: DeidSummary = Field(default_factory=DeidSummary)
    pseudonym: str = ""
    n_patients: int = 0
    allow_burned_in: bool = False
    date_shift_days: int | None = Field(default=None, exclude=True, repr=False)
    identifiers: SourceIdentifiers = Field(
        default_factory=SourceIdentifiers, exclude=True, repr=False
    )

    @property
    def files(self) -> list[str]:
        return [f"{s.folder}/{f}" for s in self.series for f in s.files]


class StudyCheck(BaseModel):
    """What reading the written study back found."""

    files_checked: int = 0
    series_checked: int = 0
    problems: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.files_checked > 0


# --------------------------------------------------------------------------- writing


def _series_groups(series: list[SeriesInfo]) -> list[list[SeriesInfo]]:
    """Image stacks grouped by series UID, in the index's order."""
    groups: dict[str, list[SeriesInfo]] = {}
    for s in series:
        if s.series_class is SequenceClass.NON_IMAGE or not s.volumes:
            continue
        groups.setdefault(s.series_uid or s.path, []).append(s)
    return list(groups.values())


def _paths(stacks: list[SeriesInfo]) -> list[str]:
    """The files of a series in display order, each once (multi-frame objects hold many)."""
    seen: dict[str, None] = {}
    for s in stacks:
        for volume in s.volumes:
            for ref in volume:
                seen.setdefault(ref.path, None)
    return list(seen)


def _read(source: str, memory_cap: int, *, pixels: bool = True) -> Dataset:
    with open_source(source, max_bytes=memory_cap) as fh:
        ds = pydicom.dcmread(fh, stop_before_pixels=not pixels)
    if getattr(ds, "buffer", None) is not None:
        ds.buffer = None  # closed with the source; a copy must not try to duplicate it
    return ds


def _safe_modality(value: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", value.upper())[:8] or "OT"


def deidentify_study(
    study: Path,
    out: Path,
    policy: DeidPolicy,
    *,
    memory_cap: int = DEFAULT_MEMORY_CAP,
    workers: int | None = None,
) -> DeidentifiedStudy:
    """De-identify every image object of `study` (folder, file or zip) into `out` (created).

    Raises ImagingError when `study` is not DICOM (a NIfTI file) or holds no image object.
    """
    if study.is_file() and study.name.lower().endswith((".nii", ".nii.gz")):
        raise ImagingError(f"{study} is NIfTI: only a DICOM study can be de-identified")
    index = index_path(study, memory_cap=memory_cap, workers=workers)
    deid = Deidentifier(policy)
    result = DeidentifiedStudy(n_source_files=index.n_files, allow_burned_in=policy.allow_burned_in)
    patients: set[str] = set()
    out.mkdir(parents=True, exist_ok=False)
    image_paths: set[str] = set()
    for stacks in _series_groups(index.series):
        paths = _paths(stacks)
        image_paths.update(paths)
        first = stacks[0]
        skipped = SkippedSeries(
            series_number=first.series_number,
            modality=first.modality,
            series_class=first.series_class.value,
            n_files=len(paths),
            reason="",
        )
        folder = f"S{len(result.series) + 1:02d}_{_safe_modality(first.modality)}"
        written = _write_series(paths, out / folder, deid, result, patients, memory_cap, skipped)
        if skipped.reason:
            shutil.rmtree(out / folder, ignore_errors=True)
            result.skipped.append(skipped)
            continue
        if written is not None:
            written.folder = folder
            written.series_number = first.series_number
            written.series_class = first.series_class.value
            result.series.append(written)
    _skip_unused(study, index, image_paths, result, memory_cap)
    result.pseudonym = sorted(patients)[0] if patients else ""
    result.n_patients = len(patients)
    if not result.series:
        reasons = "; ".join(sorted({s.reason for s in result.skipped})) or "no image object"
        raise ImagingError(f"nothing to export from {study}: {reasons}")
    return result


def _write_series(
    paths: list[str],
    folder: Path,
    deid: Deidentifier,
    result: DeidentifiedStudy,
    patients: set[str],
    memory_cap: int,
    skipped: SkippedSeries,
) -> ExportedSeries | None:
    """Write one series; on a burned-in refusal set ``skipped.reason`` (the caller removes it)."""
    series: ExportedSeries | None = None
    failures: list[str] = []
    for source in paths:
        try:
            ds = _read(source, memory_cap)
        except (OSError, ValueError, EOFError, InvalidDicomError) as exc:
            failures.append(f"{source}: cannot be read again: {exc}")
            continue
        try:
            result.identifiers.add(ds)
        except RecursionError:
            failures.append(f"{source}: nested too deeply")
            continue
        try:
            clean = deid.deidentify(ds)
        except BurnedInAnnotationError as exc:
            skipped.reason = (
                f"pixels may show identifying text ({deid.audit_record()['refused']}); "
                "left out (allow burned-in to export and flag it)"
            )
            skipped.detail = str(exc)
            return None
        except ImagingError as exc:
            failures.append(f"{source}: {exc}")
            continue
        pseudonym, shift = deid.subject(ds)
        patients.add(pseudonym)
        if result.date_shift_days is None and deid.policy.keep_dates:
            result.date_shift_days = shift
        result.summary.merge(deid.audit_record())
        result.summary.method = str(clean.get("DeidentificationMethod", "") or "")
        if series is None:
            folder.mkdir(parents=True)
            series = ExportedSeries(
                folder=folder.name,
                study_uid=str(clean.get("StudyInstanceUID", "") or ""),
                series_uid=str(clean.get("SeriesInstanceUID", "") or ""),
                modality=str(clean.get("Modality", "") or ""),
                description=str(clean.get("SeriesDescription", "") or ""),
            )
        reason = burned_in_reason(clean)
        if reason:
            series.burned_in = reason
        name = f"IM{len(series.files) + 1:04d}.dcm"
        pydicom.dcmwrite(folder / name, clean, enforce_file_format=True)
        series.files.append(name)
    if failures:
        result.skipped.append(
            SkippedSeries(
                series_number=skipped.series_number,
                modality=skipped.modality,
                series_class=skipped.series_class,
                n_files=len(failures),
                reason="file(s) of an exported series could not be read or de-identified",
                detail="; ".join(failures[:5]),
            )
        )
    return series


def _skip_unused(
    study: Path,
    index: Any,
    image_paths: set[str],
    result: DeidentifiedStudy,
    memory_cap: int,
) -> None:
    """Record what the index could not use, and read the identifiers of non-image objects (their
    names and IDs may be repeated in the case's note, which is scrubbed with them)."""
    by_kind: dict[str, list[str]] = {}
    for error in index.errors:
        by_kind.setdefault(error.kind, []).append(f"{error.path}: {error.message}")
    for kind, messages in sorted(by_kind.items()):
        result.skipped.append(
            SkippedSeries(
                n_files=len(messages),
                reason=f"not usable ({kind})",
                detail="; ".join(messages[:5]),
            )
        )
    error_paths = {e.path for e in index.errors}
    non_image: dict[str, int] = {}
    for source in iter_sources(study):
        if source in image_paths or source in error_paths:
            continue
        try:
            ds = _read(source, memory_cap, pixels=False)
            result.identifiers.add(ds)
        except (OSError, ValueError, EOFError, RecursionError, InvalidDicomError):
            continue
        modality = str(ds.get("Modality", "") or "")
        non_image[modality] = non_image.get(modality, 0) + 1
    for modality, count in sorted(non_image.items()):
        result.skipped.append(
            SkippedSeries(
                modality=modality,
                series_class=SequenceClass.NON_IMAGE.value,
                n_files=count,
                reason="non-image object (report, raw data or document): its text is beyond "
                "the basic profile, and no case renders it",
            )
        )


# --------------------------------------------------------------------------- checking


def _check_dataset(ds: Dataset, study: DeidentifiedStudy) -> list[str]:
    """Problems of one written object, on its own terms (attribute keywords, never values)."""
    problems: list[str] = []
    if str(ds.get("PatientIdentityRemoved", "") or "") != "YES":
        problems.append("PatientIdentityRemoved is not YES")
    if not str(ds.get("DeidentificationMethod", "") or "").strip():
        problems.append("DeidentificationMethod is not set")
    codes = {
        str(item.get("CodeValue", "")) for item in ds.get("DeidentificationMethodCodeSequence", [])
    }
    if "113100" not in codes:
        problems.append("DeidentificationMethodCodeSequence lacks 113100 (basic profile)")
    for keyword in ("PatientName", "PatientID"):
        if str(ds.get(keyword, "") or "") != study.pseudonym:
            problems.append(f"{keyword} is not the case's pseudonym")
    reason = burned_in_reason(ds)
    if reason and not study.allow_burned_in:
        problems.append(f"pixels may show identifying text ({reason})")
    meta = getattr(ds, "file_meta", None)
    if isinstance(meta, Dataset) and meta.get("MediaStorageSOPInstanceUID") != ds.get(
        "SOPInstanceUID"
    ):
        problems.append("MediaStorageSOPInstanceUID differs from SOPInstanceUID")
    allowed_names = {"", study.pseudonym, DUMMY_TEXT}
    found: set[str] = set()
    for _parent, elem in walk_elements(ds):
        keyword = elem.keyword or str(elem.tag)
        if elem.tag.is_private:
            found.add(f"private tag {elem.tag} is present")
        elif elem.VR == "PN":
            if any(str(v).strip() not in allowed_names for v in _values(elem.value)):
                found.add(f"{keyword} holds a person name")
        elif elem.VR == "UI" and any(
            str(v).strip().rstrip("\x00") in study.identifiers.uids for v in _values(elem.value)
        ):
            found.add(f"{keyword} is an original UID")
    return problems + sorted(found)


def verify_deidentified_study(
    out: Path, study: DeidentifiedStudy, identifiers: SourceIdentifiers | None = None
) -> StudyCheck:
    """Read every file written under `out` again and check it (see the module docstring).

    `identifiers`: what to look for in the bytes, when more than the study's own (the case's
    record terms added by the caller).
    """
    check = StudyCheck()
    terms = identifiers if identifiers is not None else study.identifiers
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    listed = set(study.files)
    for extra in sorted(on_disk - listed):
        check.problems.append(f"{extra}: written but not listed")
    for missing in sorted(listed - on_disk):
        check.problems.append(f"{missing}: listed but not written")
    sop_uids: set[str] = set()
    for series in study.series:
        series_uids: set[str] = set()
        study_uids: set[str] = set()
        for name in series.files:
            rel = f"{series.folder}/{name}"
            path = out / rel
            if not path.is_file():
                continue
            data = path.read_bytes()
            try:
                ds = pydicom.dcmread(io.BytesIO(data))
                spans_ok = data[128:132] == _DCM_MARKER
                hits = terms.find_in_dicom(data, ds)
                problems = _check_dataset(ds, study)
            except Exception as exc:  # any failure to read back is a finding, not a crash
                check.problems.append(f"{rel}: cannot be read back ({type(exc).__name__})")
                continue
            check.files_checked += 1
            if not spans_ok:
                problems.append("not a DICOM Part 10 file")
            problems.extend(f"the source's {kw} value is in its bytes" for kw in hits)
            check.problems.extend(f"{rel}: {p}" for p in problems)
            series_uids.add(str(ds.get("SeriesInstanceUID", "")))
            study_uids.add(str(ds.get("StudyInstanceUID", "")))
            sop = str(ds.get("SOPInstanceUID", ""))
            if sop in sop_uids:
                check.problems.append(f"{rel}: SOPInstanceUID repeats another file's")
            sop_uids.add(sop)
        check.series_checked += 1
        if series_uids and series_uids != {series.series_uid}:
            check.problems.append(f"{series.folder}: SeriesInstanceUID not one consistent value")
        if study_uids and study_uids != {series.study_uid}:
            check.problems.append(f"{series.folder}: StudyInstanceUID not one consistent value")
    if study.n_patients != 1:
        check.problems.append(f"the study holds {study.n_patients} patients, a case is one")
    return check
