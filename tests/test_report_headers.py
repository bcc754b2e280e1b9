"""Patient and study attributes copied from a real study into the SR and the PDF: a value
outside the standard (BRAINIX's PatientSex '0000', impossible dates and times, over-long
identifiers, broken person names, ages) never fails the write-back. It is left out (the
standard's empty form) and said in a warning; what is written passes dciodvfy."""

from __future__ import annotations

import io
from pathlib import Path

import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from gateway_synth import make_study

from evaluation.answers import Finding
from evaluation.review import ReportContent
from gateway.sr import build_pdf, build_sr, header_warnings

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
# keyword -> a value outside the standard for it (set raw: as a scanner would write it)
HOSTILE = {
    "PatientSex": b"0000",
    "PatientBirthDate": b"19991399",
    "StudyDate": b"2024-01-02",
    "StudyTime": b"25:61:00",
    "AccessionNumber": b"A" * 40,
    "StudyID": b"S" * 30,
    "PatientName": b"Doe^John^^^^^^Extra" + b"x" * 100,
    "ReferringPhysicianName": b"Bad\x07Name",
    "PatientID": b"ID\\WITH\\BACKSLASH",
    "StudyDescription": b"D" * 100,
}


def _hostile(tmp_path: Path, keyword: str) -> list[pydicom.Dataset]:
    """The study's files with one attribute rewritten to a value outside the standard, read
    back as the gateway reads what a scanner sent."""
    study = make_study(tmp_path / keyword, n_slices=2, classes=("FLAIR",))
    value = HOSTILE[keyword].decode("latin-1")
    with pydicom.config.disable_value_validation():
        for p in study.files:
            ds = pydicom.dcmread(p)
            setattr(ds, keyword, value)
            ds.save_as(p, enforce_file_format=True)
    return [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]


@pytest.mark.parametrize("keyword", sorted(HOSTILE))
def test_an_invalid_header_value_is_left_out_with_a_warning(tmp_path: Path, keyword: str) -> None:
    headers = _hostile(tmp_path, keyword)
    content = ReportContent(findings=[Finding(description="lesion", hemisphere="left")])
    sr = build_sr(headers, content, "m", "v", 1)
    pdf = build_pdf(headers[0], PDF, "NeuroSandbox AI checklist", 1)
    for ds in (sr, pdf):
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        assert_dciodvfy_clean(buf.getvalue())
        back = pydicom.dcmread(io.BytesIO(buf.getvalue()))
        assert HOSTILE[keyword].decode("latin-1") != str(back.get(keyword, "")), keyword
        assert back.PatientID or keyword == "PatientID"  # the rest is still copied
    warnings = header_warnings(headers[0])
    assert any(keyword in w for w in warnings), warnings


def test_valid_values_are_copied_unchanged_and_warn_nothing(tmp_path: Path) -> None:
    study = make_study(tmp_path / "ok", n_slices=2, classes=("FLAIR",), patient_name="Müller^Jörg")
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    sr = build_sr(headers, ReportContent(no_findings=True), "m", "v", 1)
    assert str(sr.PatientName) == "Müller^Jörg" and sr.PatientID == study.patient_id
    assert sr.StudyDate == headers[0].StudyDate and sr.PatientSex == headers[0].PatientSex
    assert header_warnings(headers[0]) == []
