"""Tests for dicom.deid: PS3.15 Annex E basic profile de-identification.

Corpus-based tests read the shared DICOM corpus (never copied into the repo) and are skipped
when it is absent, unless NEUROSANDBOX_REQUIRE_CORPUS=1.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from conftest import corpus_path as _corpus
from pydicom.charset import convert_encodings, encode_string
from pydicom.datadict import repeater_has_keyword, tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicom.deid import (
    BASIC_PROFILE,
    MAX_SEQUENCE_DEPTH,
    BurnedInAnnotationError,
    Deidentifier,
    DeidPolicy,
    burned_in_reason,
)
from dicom.deid_study import SourceIdentifiers, deidentify_study, verify_deidentified_study
from dicom.errors import ImagingError, UnreadableHeaderError

SALT = "unit-test-salt-0123456789abcdef-not-a-real-secret"
UID_RE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
ENCODINGS_DIR = "hostile/Database/Encodings/DavidClunie"
CHARSET_FILES = ["SCSARAB", "SCSGREEK", "SCSH31", "SCSX2"]
BRAINIX_T1 = "brainix/BRAINIX/DICOM/T1"
SIEMENS_DIR = "siemens_xa30/In/5001_anat-T1w_acq-tfl"
INSTANCE_UIDS = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID")
# ISO 2022 escape sequences (JIS X 0208 / ASCII / JIS X 0201 Roman), stripped to also look for
# the bare double-byte JIS codes of a name.
_ISO2022_ESC = re.compile(rb"\x1b(?:\$[@B]|\([BJ])")


def _deid(**policy: bool) -> Deidentifier:
    return Deidentifier(DeidPolicy(salt=SALT, **policy))


def _read(rel: str) -> Dataset:
    return pydicom.dcmread(_corpus() / rel)


def _brainix(index: int = 1) -> Dataset:
    return _read(f"{BRAINIX_T1}/IM-0001-{index:04d}.dcm")


def _siemens(index: int = 0) -> Dataset:
    files = sorted((_corpus() / SIEMENS_DIR).glob("*.dcm"))
    assert len(files) > index, f"expected Siemens files in {SIEMENS_DIR}"
    return pydicom.dcmread(files[index])


def _to_bytes(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds)
    return buf.getvalue()


def _write_output(ds: Dataset) -> bytes:
    """Write a de-identified dataset as a conformant Part 10 file."""
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _name_variants(ds: Dataset) -> list[str]:
    """The decoded patient name, each component group and each component."""
    name = ds.PatientName
    variants = {str(name)}
    for group in name.components:
        variants.add(group)
        variants.update(c for c in group.split("^") if c)
    return sorted(v for v in variants if v)


def _encoded_forms(text: str, dicom_charset: str | list[str]) -> set[bytes]:
    """`text` as it could appear on disk: the original charset (with and without ISO 2022
    escapes, and per individual codec) and UTF-8."""
    codecs = convert_encodings(dicom_charset)
    forms = {text.encode("utf-8"), encode_string(text, codecs)}
    for codec in codecs:
        try:
            forms.add(text.encode(codec))
        except UnicodeEncodeError:
            continue
    forms |= {_ISO2022_ESC.sub(b"", f) for f in list(forms)}
    return {f for f in forms if f}


def _known_keyword(keyword: str) -> bool:
    """A keyword of the DICOM dictionary, including repeating groups (OverlayData, 60xx)."""
    return tag_for_keyword(keyword) is not None or repeater_has_keyword(keyword)


# ------------------------------------------------------------------ policy / derived values


def test_profile_keywords_are_dicom_keywords() -> None:
    unknown = [kw for kw in BASIC_PROFILE if not _known_keyword(kw)]
    assert unknown == []
    assert set(BASIC_PROFILE.values()) <= {"X", "Z", "D", "U", "K", "C"}
    # The attributes the brief requires to be covered by the table.
    required = {
        "PatientName", "PatientID", "IssuerOfPatientID", "OtherPatientIDs",
        "OtherPatientIDsSequence", "OtherPatientNames", "PatientBirthDate", "PatientBirthTime",
        "PatientAddress", "PatientTelephoneNumbers", "PatientMotherBirthName", "MilitaryRank",
        "EthnicGroup", "Occupation", "AdditionalPatientHistory", "PatientComments",
        "MedicalRecordLocator", "ReferringPhysicianName", "ReferringPhysicianAddress",
        "ReferringPhysicianTelephoneNumbers", "PerformingPhysicianName",
        "NameOfPhysiciansReadingStudy", "OperatorsName", "PhysiciansOfRecord",
        "RequestingPhysician", "InstitutionName", "InstitutionAddress",
        "InstitutionalDepartmentName", "StationName", "DeviceSerialNumber", "AccessionNumber",
        "StudyID", "RequestAttributesSequence", "ImageComments", "StudyComments",
        "RequestedProcedureDescription", "PerformedProcedureStepID",
        "PerformedProcedureStepDescription", "ScheduledProcedureStepID", "AdmissionID",
        "ContentCreatorName", "FrameComments", "DerivationDescription", "StudyInstanceUID",
        "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID",
        "MediaStorageSOPInstanceUID", "ReferencedSOPInstanceUID",
        "SynchronizationFrameOfReferenceUID", "IrradiationEventUID", "ConcatenationUID",
        "DimensionOrganizationUID", "StudyDate", "SeriesDate", "AcquisitionDate", "ContentDate",
        "InstanceCreationDate", "PerformedProcedureStepStartDate", "AcquisitionDateTime",
        "PatientAge", "PatientSex", "PatientSize", "PatientWeight",
    }  # fmt: skip
    assert required - BASIC_PROFILE.keys() == set()
    for kw in ("PatientAge", "PatientSex", "PatientSize", "PatientWeight"):
        assert BASIC_PROFILE[kw] == "K"


def test_policy_requires_a_salt_and_hides_it() -> None:
    with pytest.raises(ValueError):
        DeidPolicy()  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        DeidPolicy(salt="   ")
    with pytest.raises(ValueError):
        DeidPolicy(salt=SALT, keep_date=False)  # type: ignore[call-arg]  # typo is rejected
    policy = DeidPolicy(salt=SALT)
    assert SALT not in repr(policy)
    assert policy.keep_dates and policy.keep_descriptions and not policy.allow_burned_in


def test_pseudonym_is_stable_and_distinct() -> None:
    deid = _deid()
    first = deid.pseudonym("12345")
    assert re.fullmatch(r"NS-[0-9a-f]{16}", first)
    assert first == deid.pseudonym("12345") == _deid().pseudonym("12345")
    assert first != deid.pseudonym("12346")
    assert first != deid.pseudonym("12345", issuer="OTHER-HOSPITAL")
    assert first != Deidentifier(DeidPolicy(salt=SALT + "x")).pseudonym("12345")
    assert len({deid.pseudonym(str(i)) for i in range(2000)}) == 2000


def test_map_uid_is_valid_stable_and_distinct() -> None:
    deid = _deid()
    originals = [f"1.3.12.2.1107.5.2.43.67093.{i}.{i * 7919}" for i in range(500)]
    mapped = [deid.map_uid(u) for u in originals]
    for orig, new in zip(originals, mapped, strict=True):
        assert UID_RE.fullmatch(new) and len(new) <= 64
        assert new != orig and new.startswith("2.25.")
        assert all(c == "0" or not c.startswith("0") for c in new.split("."))
        assert deid.map_uid(orig) == new
    assert len(set(mapped)) == len(mapped)
    assert deid.map_uid("") == ""


def test_date_shift_is_stable_negative_and_bounded() -> None:
    deid = _deid()
    shifts = [deid.date_shift_days(f"P{i}") for i in range(1000)]
    assert all(-365 <= s <= -1 for s in shifts)
    assert len(set(shifts)) > 100  # actually spread, not a constant
    assert deid.date_shift_days("P7") == _deid().date_shift_days("P7")


# ------------------------------------------------------------------ burned-in refusal


@pytest.mark.corpus
@pytest.mark.parametrize("name", CHARSET_FILES)
def test_secondary_captures_refused_by_default(name: str) -> None:
    ds = _read(f"{ENCODINGS_DIR}/{name}")
    assert ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.7"  # these are Secondary Captures
    deid = _deid()
    with pytest.raises(BurnedInAnnotationError) as info:
        deid.deidentify(ds)
    assert isinstance(info.value, ImagingError)
    message = str(info.value)
    assert ds.SOPInstanceUID in message and "Secondary Capture" in message
    for variant in [*_name_variants(ds), ds.PatientID]:
        assert variant not in message
    assert deid.audit_record()["refused"]


@pytest.mark.corpus
def test_burned_in_annotation_yes_refused_unless_allowed() -> None:
    ds = _brainix()
    ds.BurnedInAnnotation = "YES"
    with pytest.raises(BurnedInAnnotationError, match="BurnedInAnnotation"):
        _deid().deidentify(ds)
    out = _deid(allow_burned_in=True).deidentify(ds)
    assert out.PatientIdentityRemoved == "YES"
    ds.BurnedInAnnotation = "NO"
    assert _deid().deidentify(ds).PatientIdentityRemoved == "YES"


def test_other_risky_sop_classes_refused() -> None:
    for sop_class in ("1.2.840.10008.5.1.4.1.1.7.4", "1.2.840.10008.5.1.4.1.1.104.1"):
        ds = Dataset()
        ds.SOPClassUID = sop_class
        ds.SOPInstanceUID = "1.2.3.4"
        ds.PatientName = "Doe^John"
        with pytest.raises(BurnedInAnnotationError) as info:
            _deid().deidentify(ds)
        assert "Doe" not in str(info.value)


# ------------------------------------------------------------------ character sets


@pytest.mark.corpus
@pytest.mark.parametrize("name", CHARSET_FILES)
def test_names_gone_in_every_encoding(name: str) -> None:
    path = _corpus() / ENCODINGS_DIR / name
    original_bytes = path.read_bytes()
    ds = pydicom.dcmread(path)
    charset = ds.SpecificCharacterSet
    deid = _deid(allow_burned_in=True)
    out = deid.deidentify(ds)
    raw = _write_output(out)

    needles: dict[str, set[bytes]] = {v: _encoded_forms(v, charset) for v in _name_variants(ds)}
    # The check is only meaningful if the original file does carry the name in its charset.
    assert any(f in original_bytes for forms in needles.values() for f in forms)
    for variant, forms in needles.items():
        for form in forms:
            assert form not in raw, f"{name}: {variant!r} survives as {form!r}"
    assert ds.PatientID.encode("ascii") not in raw

    back = pydicom.dcmread(io.BytesIO(raw))
    assert back.SpecificCharacterSet == "ISO_IR 192"
    assert str(back.PatientName) == deid.pseudonym(ds.PatientID)
    assert back.PatientID == deid.pseudonym(ds.PatientID)


@pytest.mark.corpus
def test_latin1_text_survives_reencoding_to_utf8() -> None:
    ds = _brainix()
    out = _deid().deidentify(ds)
    back = pydicom.dcmread(io.BytesIO(_write_output(out)))
    assert back.StudyDescription == ds.StudyDescription == "IRM cérébrale, neuro-crâne"
    assert back.ProcedureCodeSequence[0].CodeMeaning == "IRM cérébrale, neuro-crâne"


# ------------------------------------------------------------------ consistency


@pytest.mark.corpus
def test_same_series_consistent_mapping() -> None:
    a, b = _brainix(1), _brainix(2)
    assert a.PatientID == b.PatientID and a.SeriesInstanceUID == b.SeriesInstanceUID
    deid = _deid()
    out_a, out_b = deid.deidentify(a), deid.deidentify(b)
    assert out_a.PatientName == out_b.PatientName == deid.pseudonym(a.PatientID)
    assert out_a.PatientID == out_b.PatientID
    for kw in ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID"):
        assert out_a[kw].value == out_b[kw].value == deid.map_uid(a[kw].value)
    assert out_a.SOPInstanceUID != out_b.SOPInstanceUID
    for ds, out in ((a, out_a), (b, out_b)):
        assert out.SOPInstanceUID == deid.map_uid(ds.SOPInstanceUID)
        assert out.file_meta.MediaStorageSOPInstanceUID == out.SOPInstanceUID
    # A separate instance with the same salt reproduces the mapping (stateless derivation).
    again = _deid().deidentify(a)
    assert again.SOPInstanceUID == out_a.SOPInstanceUID and again.PatientID == out_a.PatientID


@pytest.mark.corpus
def test_different_patients_get_different_pseudonyms() -> None:
    deid = _deid(allow_burned_in=True)
    datasets = [_brainix(), _siemens()] + [
        _read(f"{ENCODINGS_DIR}/{name}") for name in CHARSET_FILES
    ]
    assert len({ds.PatientID for ds in datasets}) == len(datasets)
    pseudonyms = {str(deid.deidentify(ds).PatientName) for ds in datasets}
    assert len(pseudonyms) == len(datasets)


@pytest.mark.corpus
def test_uids_valid_and_changed() -> None:
    ds = _siemens()
    original_uids = {
        str(e.value)
        for e in [*ds.file_meta, *ds.iterall()]
        if e.VR == "UI" and not str(e.value).startswith("1.2.840.10008.")
        and "ClassUID" not in e.keyword
    }  # fmt: skip
    assert original_uids
    out = _deid().deidentify(ds)
    for kw in INSTANCE_UIDS:
        assert out[kw].value != ds[kw].value
    for elem in [*out.file_meta, *out.iterall()]:
        if elem.VR == "UI" and elem.value:
            value = str(elem.value)
            assert UID_RE.fullmatch(value), (elem.keyword, value)
            assert len(value) <= 64
            assert value not in original_uids
    raw = _write_output(out)
    for uid in original_uids:
        assert uid.encode("ascii") not in raw


@pytest.mark.corpus
def test_referenced_uids_remapped_consistently() -> None:
    deid = _deid()
    ds = _brainix(1)
    ref_study = ds.ReferencedStudySequence[0].ReferencedSOPInstanceUID
    assert ref_study == ds.StudyInstanceUID  # the file references its own study
    out = deid.deidentify(ds)
    assert out.ReferencedStudySequence[0].ReferencedSOPInstanceUID == out.StudyInstanceUID
    for orig, new in zip(ds.ReferencedImageSequence, out.ReferencedImageSequence, strict=True):
        assert new.ReferencedSOPInstanceUID == deid.map_uid(orig.ReferencedSOPInstanceUID)
        assert new.ReferencedSOPClassUID == orig.ReferencedSOPClassUID  # class UIDs kept

    # One image referencing another, two levels deep: must match the other's new UID.
    source, derived = _brainix(1), _brainix(2)
    inner = Dataset()
    inner.ReferencedSOPClassUID = source.SOPClassUID
    inner.ReferencedSOPInstanceUID = source.SOPInstanceUID
    outer = Dataset()
    outer.ReferencedImageSequence = Sequence([inner])
    derived.SourceImageSequence = Sequence([outer])
    out_source, out_derived = deid.deidentify(source), deid.deidentify(derived)
    nested = out_derived.SourceImageSequence[0].ReferencedImageSequence[0]
    assert nested.ReferencedSOPInstanceUID == out_source.SOPInstanceUID

    siemens = _siemens()
    out_siemens = deid.deidentify(siemens)
    related = out_siemens.RelatedSeriesSequence[0]
    assert related.StudyInstanceUID == out_siemens.StudyInstanceUID


# ------------------------------------------------------------------ dates


@pytest.mark.corpus
def test_dates_shifted_with_order_and_interval_preserved() -> None:
    ds = _brainix()
    ds.StudyDate = "20061201"
    ds.ContentDate = "20061215"
    ds.AcquisitionDateTime = "20061201143334.39+0100"
    item = Dataset()
    item.ObservationDateTime = "20061203101500"
    ds.SourceImageSequence = Sequence([item])
    deid = _deid()
    out = deid.deidentify(ds)
    shift = deid.date_shift_days(ds.PatientID)
    assert -365 <= shift <= -1

    def day(value: str) -> dt.date:
        return dt.datetime.strptime(value[:8], "%Y%m%d").date()

    assert out.StudyDate != ds.StudyDate
    assert (day(out.StudyDate) - day(ds.StudyDate)).days == shift
    assert day(out.StudyDate) < day(out.ContentDate)
    assert (day(out.ContentDate) - day(out.StudyDate)).days == 14
    assert out.AcquisitionDateTime[8:] == "143334.39+0100"  # time and offset kept
    assert day(out.AcquisitionDateTime) == day(out.StudyDate)
    nested = out.SourceImageSequence[0].ObservationDateTime
    assert (day(nested) - day(out.StudyDate)).days == 2
    assert out.StudyTime == ds.StudyTime  # whole-day shift: times kept with dates
    assert out.PatientBirthDate == ""
    assert out.LongitudinalTemporalInformationModified == "MODIFIED"
    codes = {i.CodeValue for i in out.DeidentificationMethodCodeSequence}
    assert "113107" in codes
    # The same patient in another file gets the same shift.
    assert deid.deidentify(_brainix(2)).StudyDate == out.StudyDate


@pytest.mark.corpus
def test_dates_emptied_when_not_kept() -> None:
    ds = _siemens()
    out = _deid(keep_dates=False).deidentify(ds)
    for kw in ("StudyDate", "SeriesDate", "ContentDate", "StudyTime", "AcquisitionDateTime"):
        assert kw not in out or out[kw].value in ("", None), kw
    assert out.LongitudinalTemporalInformationModified == "REMOVED"
    codes = {i.CodeValue for i in out.DeidentificationMethodCodeSequence}
    assert "113107" not in codes and "113100" in codes
    raw = _write_output(out)
    assert ds.StudyDate.encode("ascii") not in raw


# ------------------------------------------------------------------ private tags, markers


@pytest.mark.corpus
def test_no_private_tags_anywhere() -> None:
    ds = _siemens()
    assert any(e.tag.is_private for e in ds.iterall())
    deid = _deid()
    out = deid.deidentify(ds)
    for current in (out, pydicom.dcmread(io.BytesIO(_write_output(out)))):
        assert not any(e.tag.is_private for e in current.iterall())
    assert deid.audit_record()["private_tags_removed"] > 0


def test_private_tags_removed_in_nested_items() -> None:
    ds = Dataset()
    ds.PatientID = "P1"
    item = Dataset()
    item.add_new(0x00290010, "LO", "ACME PRIVATE")
    item.add_new(0x00291001, "LO", "secret")
    ds.SourceImageSequence = Sequence([item])
    out = _deid().deidentify(ds)
    assert all(not e.tag.is_private for e in out.iterall())


@pytest.mark.corpus
def test_deidentification_markers_and_identifying_attributes() -> None:
    ds = _brainix()
    deid = _deid()
    out = deid.deidentify(ds)
    assert out.PatientIdentityRemoved == "YES"
    assert out.DeidentificationMethod and len(out.DeidentificationMethod) <= 64
    items = {i.CodeValue: i for i in out.DeidentificationMethodCodeSequence}
    assert items["113100"].CodingSchemeDesignator == "DCM"
    assert items["113100"].CodeMeaning == "Basic Application Confidentiality Profile"
    assert "113105" in items and "113107" in items
    for kw in (
        "InstitutionName",
        "InstitutionalDepartmentName",
        "StationName",
        "DeviceSerialNumber",
        "RequestAttributesSequence",
        "RequestedProcedureDescription",
        "PerformedProcedureStepID",
        "PerformedProcedureStepDescription",
    ):
        assert kw in ds and kw not in out, kw
    for kw in ("ReferringPhysicianName", "AccessionNumber", "StudyID", "PatientBirthDate"):
        assert out[kw].value in ("", None), kw
    for kw in ("PatientSex", "PatientWeight"):  # clinically needed, kept
        assert out[kw].value == ds[kw].value
    raw = _write_output(out)
    for secret in (ds.InstitutionName, str(ds.ReferringPhysicianName), ds.PatientID, "19490301"):
        assert secret.encode("latin-1") not in raw


@pytest.mark.corpus
def test_audit_record_lists_keywords_never_values() -> None:
    ds = _brainix()
    deid = _deid()
    deid.deidentify(ds)
    audit = deid.audit_record()
    assert {"PatientName", "PatientID"} <= set(audit["replaced"])
    assert "InstitutionName" in audit["removed"]
    assert "StudyInstanceUID" in audit["uids_remapped"]
    assert "StudyDate" in audit["shifted"]
    assert audit["refused"] is None and "113100" in audit["method_codes"]
    listed = [kw for key in ("removed", "emptied", "replaced", "shifted") for kw in audit[key]]
    assert all(_known_keyword(kw) for kw in listed)
    dump = json.dumps(audit)
    for secret in (str(ds.PatientName), ds.PatientID, ds.StudyInstanceUID, ds.StudyDate):
        assert secret not in dump
    assert deid.pseudonym(ds.PatientID) not in dump
    audit["removed"].clear()  # a copy: callers cannot corrupt the record
    assert deid.audit_record()["removed"]


def test_overlays_and_unknown_standard_tags_removed() -> None:
    ds = Dataset()
    ds.PatientID = "P1"
    ds.add_new(0x60003000, "OW", b"\x01\x00" * 8)
    ds.add_new(0x60024000, "LT", "overlay comment naming someone")
    ds.add_new(0x00090000, "UL", 4)  # private group length
    out = _deid().deidentify(ds)
    assert not any(0x6000 <= e.tag.group <= 0x60FF for e in out)
    assert 0x00090000 not in out


# ------------------------------------------------------------------ descriptors


@pytest.mark.corpus
def test_descriptions_cleaned_of_name_and_id() -> None:
    ds = _brainix()
    ds.SeriesDescription = f"T1 brainix {ds.PatientID} axial"
    ds.ProtocolName = "BRAINIX_T1"
    deid = _deid()
    out = deid.deidentify(ds)
    assert out.SeriesDescription == "T1 axial"
    assert "brainix" not in out.ProtocolName.lower() and "T1" in out.ProtocolName
    assert out.StudyDescription == ds.StudyDescription  # nothing to clean: unchanged
    assert "SeriesDescription" in deid.audit_record()["cleaned"]

    removed = _deid(keep_descriptions=False).deidentify(ds)
    for kw in ("SeriesDescription", "StudyDescription", "ProtocolName"):
        assert kw not in removed
    codes = {i.CodeValue for i in removed.DeidentificationMethodCodeSequence}
    assert "113105" not in codes


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["SCSGREEK", "SCSH31", "SCSX2"])
def test_descriptions_cleaned_in_non_latin_charsets(name: str) -> None:
    ds = _read(f"{ENCODINGS_DIR}/{name}")
    components = [c for g in ds.PatientName.components for c in g.split("^") if len(c) >= 2]
    ds.StudyDescription = "Head " + " ".join(c.upper() for c in components)
    out = _deid(allow_burned_in=True).deidentify(ds)
    assert out.StudyDescription == "Head"


# ------------------------------------------------------------------ robustness


@pytest.mark.corpus
@pytest.mark.parametrize("loader", [_brainix, _siemens])
def test_input_dataset_unchanged(loader: Callable[[], Dataset]) -> None:
    ds = loader()
    before = _to_bytes(ds)
    name, pid, study = str(ds.PatientName), ds.PatientID, ds.StudyInstanceUID
    n_private = sum(e.tag.is_private for e in ds.iterall())
    out = _deid().deidentify(ds)
    assert out is not ds
    assert _to_bytes(ds) == before
    assert (str(ds.PatientName), ds.PatientID, ds.StudyInstanceUID) == (name, pid, study)
    assert sum(e.tag.is_private for e in ds.iterall()) == n_private
    assert ds.SpecificCharacterSet != "ISO_IR 192"


def _nested(levels: int) -> Dataset:
    """A dataset with `levels` nested sequence items, built iteratively."""
    inner = Dataset()
    inner.CodeValue = "leaf"
    for _ in range(levels):
        outer = Dataset()
        outer.SourceImageSequence = Sequence([inner])
        inner = outer
    inner.PatientID = "P1"
    return inner


@pytest.mark.parametrize("levels", [100, 5000])
def test_deep_nesting_raises_unreadable_header(levels: int) -> None:
    ds = _nested(levels)
    with pytest.raises(UnreadableHeaderError, match="nesting"):
        _deid().deidentify(ds)


def test_nesting_at_the_limit_is_accepted() -> None:
    out = _deid().deidentify(_nested(MAX_SEQUENCE_DEPTH))
    assert out.PatientIdentityRemoved == "YES"
    with pytest.raises(UnreadableHeaderError):
        _deid().deidentify(_nested(MAX_SEQUENCE_DEPTH + 1))


def test_missing_patient_id_does_not_collapse_patients() -> None:
    a, b = Dataset(), Dataset()
    a.PatientName, b.PatientName = "Doe^Jane", "Roe^Richard"
    deid = _deid()
    assert deid.deidentify(a).PatientID != deid.deidentify(b).PatientID
    assert a.PatientName == "Doe^Jane" and "PatientIdentityRemoved" not in a


# ------------------------------------------------------------------ the patient and other people


@pytest.mark.corpus
def test_subject_is_the_pseudonym_and_shift_deidentify_uses() -> None:
    ds = _brainix()
    deid = _deid()
    out = deid.deidentify(ds)
    pseudonym, shift = deid.subject(ds)
    assert out.PatientName == out.PatientID == pseudonym
    shifted = dt.datetime.strptime(out.StudyDate, "%Y%m%d").date()
    original = dt.datetime.strptime(ds.StudyDate, "%Y%m%d").date()
    assert (shifted - original).days == shift < 0


@pytest.mark.corpus
def test_every_person_named_in_the_object_is_cleaned_from_kept_text() -> None:
    """Not only the patient: the referring physician, operators, and a name in a nested item
    are cleaned from descriptions, as whole words (a short name never cuts another word)."""
    ds = _brainix()
    ds.ReferringPhysicianName = "Rao^Priya^^Dr"
    ds.OperatorsName = "Okonkwo^Chibueze"
    item = Dataset()
    item.PersonName = "Nakamura^Hiroshi"
    ds.ReferencedStudySequence[0].PersonName = item.PersonName
    ds.SeriesDescription = "T1 Rao paraorbital okonkwo"
    ds.ProtocolName = "Nakamura_T1"
    out = _deid().deidentify(ds)
    assert out.SeriesDescription == "T1 paraorbital"
    assert "nakamura" not in out.ProtocolName.lower() and "T1" in out.ProtocolName
    assert "OperatorsName" not in out and out.ReferringPhysicianName == ""
    assert out.ReferencedStudySequence[0].PersonName == "ANONYMIZED"


def test_burned_in_reason_names_standard_values_only() -> None:
    ds = Dataset()
    ds.SOPInstanceUID = "1.2.3.4.5"
    assert burned_in_reason(ds) == ""
    ds.BurnedInAnnotation = "YES"
    assert burned_in_reason(ds) == "BurnedInAnnotation is YES"
    del ds.BurnedInAnnotation
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    assert "Secondary Capture" in burned_in_reason(ds) and "1.2.3.4.5" not in burned_in_reason(ds)


# ------------------------------------------------------------------ a whole study (dicom.deid_study)


def _small_study(tmp_path: Path, *, burned_in_flair: bool = False) -> Path:
    """BRAINIX T1 and FLAIR (8 files each) and a structured report naming a physician."""
    study = tmp_path / "Doe_John_study"  # a folder name that names the patient
    for series in ("T1", "FLAIR"):
        (study / series).mkdir(parents=True)
        for n in range(1, 9):
            ds = _read(f"brainix/BRAINIX/DICOM/{series}/IM-0001-{n:04d}.dcm")
            ds.OperatorsName = "Okonkwo^Chibueze"
            if burned_in_flair and series == "FLAIR":
                ds.BurnedInAnnotation = "YES"
            ds.save_as(study / series / f"Doe_John_{n}.dcm")
    sr = Dataset()
    sr.SOPClassUID = "1.2.840.10008.5.1.4.1.1.88.11"  # Basic Text SR
    sr.SOPInstanceUID = "1.2.3.999.1"
    sr.StudyInstanceUID = _brainix().StudyInstanceUID
    sr.SeriesInstanceUID = "1.2.3.999"
    sr.Modality = "SR"
    sr.PatientName = "BRAINIX"
    sr.VerifyingObserverSequence = Sequence([Dataset()])
    sr.VerifyingObserverSequence[0].VerifyingObserverName = "Quist^Tobias"
    sr.ensure_file_meta()
    sr.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    (study / "SR").mkdir()
    sr.save_as(study / "SR" / "report.dcm", enforce_file_format=True)
    return study


@pytest.mark.corpus
def test_study_written_under_new_names_and_read_back_clean(tmp_path: Path) -> None:
    study = _small_study(tmp_path)
    out = tmp_path / "out"
    result = deidentify_study(study, out, DeidPolicy(salt=SALT))
    assert [(s.folder, s.series_class, len(s.files)) for s in result.series] == [
        ("S01_MR", "FLAIR", 8),
        ("S02_MR", "T1", 8),
    ]
    assert all(re.fullmatch(r"S0\d_MR/IM000\d\.dcm", f) for f in result.files)
    assert [s.reason.split(" (")[0] for s in result.skipped] == ["non-image object"]
    assert result.n_patients == 1 and result.pseudonym.startswith("NS-")
    assert result.date_shift_days is not None and result.date_shift_days < 0
    assert "OperatorsName" in result.summary.removed
    # The report's physician is known, to scrub the case's note with; never dumped.
    terms = result.identifiers.terms()
    assert {"Quist", "Tobias", "Okonkwo", "BRAINIX"} <= set(terms)
    dumped = result.model_dump_json()
    assert "Quist" not in dumped and str(result.date_shift_days) not in json.loads(dumped)
    check = verify_deidentified_study(out, result)
    assert check.ok and check.files_checked == 16 and check.series_checked == 2
    for path in out.rglob("*"):
        assert "doe" not in str(path.relative_to(out)).lower()


@pytest.mark.corpus
def test_same_secret_same_files(tmp_path: Path) -> None:
    study = _small_study(tmp_path)
    one = deidentify_study(study, tmp_path / "one", DeidPolicy(salt=SALT))
    two = deidentify_study(study, tmp_path / "two", DeidPolicy(salt=SALT))
    assert one.files == two.files
    for rel in one.files:
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes()
    other = deidentify_study(study, tmp_path / "three", DeidPolicy(salt=SALT + "x"))
    assert other.series[0].series_uid != one.series[0].series_uid


@pytest.mark.corpus
def test_burned_in_series_left_out_or_flagged(tmp_path: Path) -> None:
    study = _small_study(tmp_path, burned_in_flair=True)
    left = deidentify_study(study, tmp_path / "left", DeidPolicy(salt=SALT))
    assert [s.series_class for s in left.series] == ["T1"]
    assert "BurnedInAnnotation is YES" in left.skipped[0].reason
    assert not (tmp_path / "left" / "S01_MR").exists() or left.series[0].folder == "S01_MR"
    assert verify_deidentified_study(tmp_path / "left", left).ok
    flagged = deidentify_study(
        study, tmp_path / "flag", DeidPolicy(salt=SALT, allow_burned_in=True)
    )
    assert [(s.series_class, s.burned_in) for s in flagged.series] == [
        ("FLAIR", "BurnedInAnnotation is YES"),
        ("T1", ""),
    ]
    assert verify_deidentified_study(tmp_path / "flag", flagged).ok


@pytest.mark.corpus
def test_verification_finds_what_leaked(tmp_path: Path) -> None:
    """Read-back catches a person name, an original UID in a nested item, an identifier in free
    text, a private tag, a missing mark and a stray file; it names attributes, never values."""
    study = _small_study(tmp_path)
    out = tmp_path / "out"
    result = deidentify_study(study, out, DeidPolicy(salt=SALT))
    source = _brainix()
    path = out / result.files[0]
    ds = pydicom.dcmread(path)
    ds.PerformingPhysicianName = "Somebody^Else"
    item = Dataset()
    item.ReferencedSOPInstanceUID = source.SOPInstanceUID
    ds.ReferencedImageSequence = Sequence([item])
    ds.ImageComments = f"patient {source.PatientID}"
    ds.add_new(0x00291010, "LO", "private")
    del ds.PatientIdentityRemoved
    ds.save_as(path)
    (out / "S01_MR" / "notes.txt").write_text("x")
    check = verify_deidentified_study(out, result)
    text = "\n".join(check.problems)
    assert not check.ok
    for finding in (
        "PerformingPhysicianName holds a person name",
        "ReferencedSOPInstanceUID is an original UID",
        "PatientID value is in its bytes",
        "private tag (0029,1010) is present",
        "PatientIdentityRemoved is not YES",
        "S01_MR/notes.txt: written but not listed",
    ):
        assert finding in text, text
    assert source.PatientID not in text and source.SOPInstanceUID not in text


def test_identifier_search_is_whole_word_and_any_case() -> None:
    ids = SourceIdentifiers(values={"Rao": "ReferringPhysicianName", "PH1234": "PatientID"})
    ids.uids.add("1.2.3.4")
    assert ids.find(b"seen by dr RAO today") == ["ReferringPhysicianName"]
    assert ids.find(b"paraorbital; PH12345; 1.2.3.45; 11.2.3.4") == []
    assert ids.find(b"ref 1.2.3.4\x00 and ph1234") == ["PatientID", "an original instance UID"]
