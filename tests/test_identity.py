"""The hospital's identifiers of a study (dicom.identity): read from the headers, bounded and
cleaned (hostile values), carried by the case to the reviewer's checklist."""

from __future__ import annotations

import pydicom
import pytest
from phantom_fixture import PhantomSuite
from pydicom.dataset import Dataset

from dicom import index_path, study_identity
from dicom.identity import header_value_problem, identity_of


def test_identity_of_a_phantom_study_is_what_its_headers_say(phantom_suite: PhantomSuite) -> None:
    folder = phantom_suite.case_dir("gbm") / "dicom"
    first = sorted(p for p in folder.rglob("*") if p.is_file())[0]
    ds = pydicom.dcmread(first, stop_before_pixels=True)
    index = index_path(folder)
    ident = study_identity(index)
    assert ident is not None
    family, given = str(ds.PatientName).split("^")[:2]
    assert ident.patient_name == f"{given} {family}"
    assert ident.patient_id == ds.PatientID and ident.accession_number == ds.AccessionNumber
    assert ident.study_date == f"{ds.StudyDate[:4]}-{ds.StudyDate[4:6]}-{ds.StudyDate[6:]}"
    assert ident.n_series == len({s.series_uid for s in index.series}) > 1
    assert ident.modalities == ["MR"]


def test_hostile_header_values_are_cleaned_not_fatal() -> None:
    ds = Dataset()
    ds.PatientName = "Evil\x1b[31m^Eve" + "x" * 200
    ds.PatientID = "ID\x00\x07"
    ds.PatientSex = "0000"
    ds.PatientBirthDate = "20231341"
    ds.StudyDate = "2024-01-02"
    ds.AccessionNumber = "A" * 500
    ident = identity_of(ds, ["MR", "MR\nX"], 3)
    assert "\x1b" not in ident.patient_name and len(ident.patient_name) <= 64
    assert ident.patient_id == ""  # control characters: outside the standard, left out
    assert ident.sex == "" and ident.birth_date == "" and ident.study_date == ""
    assert ident.accession_number == ""  # 500 characters where SH allows 16
    assert all("\n" not in m for m in ident.modalities)


@pytest.mark.parametrize(
    ("keyword", "value", "valid"),
    [("PatientAge", "45", False), ("PatientAge", "045Y", True), ("StudyTime", "256100", False),
     ("StudyTime", "101500.123", True), ("StudyDate", "20230229", False),
     ("StudyDate", "20240229", True), ("PatientSex", "U", False), ("PatientSex", "O", True),
     ("ReferringPhysicianName", "A^B^C^D^E^F", False), ("PatientID", "A\\B", False)],
)  # fmt: skip
def test_the_one_rule_for_copied_header_values(keyword: str, value: str, valid: bool) -> None:
    """Members of the class beyond the issue's example: ages, times, leap days, enumerations,
    person-name components, a value-multiplicity of one (dicom.header_value_problem)."""
    from pydicom.multival import MultiValue

    v: object = MultiValue(str, value.split("\\")) if "\\" in value else value
    assert (header_value_problem(keyword, v) is None) is valid
