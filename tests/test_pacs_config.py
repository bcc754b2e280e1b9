"""The PACS file (gateway/pacs/config.py) and the cohort query (gateway/pacs/client.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pydicom
import pytest
from pydantic import ValidationError
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from gateway.pacs import (
    DicomwebPacs,
    DimsePacs,
    PacsConfigError,
    StudyMatch,
    StudyQuery,
    keep_the_study,
    load_pacs_file,
    pacs_named,
)

GOOD = """
pacs:
  archive: {kind: dimse, ae_title: ARCHIVE, host: 127.0.0.1, port: 11112, retrieve: c-move,
            receive_port: 11113}
  web:
    kind: dicomweb
    url: https://pacs.example/dicom-web/
    username_env: HOSPITAL_PACS_USER
    password_env: HOSPITAL_PACS_PASSWORD
    tls: {ca_file: /etc/ssl/ca.pem}
writeback: archive
"""


def test_a_good_file_names_each_pacs_and_the_writeback(tmp_path: Path) -> None:
    f = tmp_path / "pacs.yaml"
    f.write_text(GOOD)
    pacs = load_pacs_file(f)
    assert isinstance(pacs.pacs["archive"], DimsePacs)
    web = pacs.pacs["web"]
    assert isinstance(web, DicomwebPacs)
    assert web.service("qido") == "https://pacs.example/dicom-web"
    assert pacs.writeback == "archive"
    with pytest.raises(PacsConfigError, match=r"no PACS named 'nope'; known: archive, local, web"):
        pacs_named(pacs, "nope", None)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("pacs: {a: {kind: dimse, host: h, port: 104}}", "pacs.a.dimse.ae_title"),
        ("pacs: {a: {kind: dimse, ae_title: 'A\\\\B', host: h, port: 104}}", "ae_title"),
        ("pacs: {a: {kind: dimse, ae_title: A, host: h, port: 70000}}", "pacs.a.dimse.port"),
        # a secret of this machine that is not meant for a PACS is never sent to one
        (
            "pacs: {a: {kind: dicomweb, url: 'https://x', password_env: OPENAI_API_KEY}}",
            "password_env",
        ),
        ("pacs: {a: {kind: dicomweb, url: 'https://x', password: hunter2}}", "password"),
        ("pacs: {a: {kind: ftp, url: 'ftp://x'}}", "pacs.a"),
        ("pacs: {a: {kind: orthanc, url: 'http://x'}}\nwriteback: b", "writeback: 'b'"),
        ("- just a list", "must be a mapping"),
        ("pacs: [", "not YAML"),
    ],
)
def test_a_wrong_file_says_where(tmp_path: Path, text: str, where: str) -> None:
    f = tmp_path / "pacs.yaml"
    f.write_text(text)
    with pytest.raises(PacsConfigError) as exc:
        load_pacs_file(f)
    assert str(f) in str(exc.value) and where in str(exc.value)
    assert "hunter2" not in str(exc.value)


def test_a_query_bounds_its_values_and_checks_again_what_the_pacs_returned() -> None:
    with pytest.raises(ValidationError):
        StudyQuery(accession_numbers=["A\\B"])  # a value separator would widen the query
    with pytest.raises(ValidationError):
        StudyQuery(patient_ids=["*"])  # a wildcard in an ID would list every patient
    with pytest.raises(ValidationError):
        StudyQuery(date_from=dt.date(2024, 3, 2), date_to=dt.date(2024, 3, 1))
    q = StudyQuery(
        modalities=["MR"], date_from=dt.date(2024, 3, 1), date_to=dt.date(2024, 3, 31),
        description="*head*",
    )  # fmt: skip
    assert q.dicom_date_range() == "20240301-20240331"
    uid = generate_uid()
    inside = StudyMatch(pacs="a", study_uid=uid, study_date=dt.date(2024, 3, 5),
                        modalities=["MR", "SR"], description="MRI HEAD w/o")  # fmt: skip
    assert q.matches(inside)
    assert not q.matches(inside.model_copy(update={"study_date": dt.date(2024, 4, 1)}))
    assert not q.matches(inside.model_copy(update={"modalities": ["CT"]}))
    assert not q.matches(inside.model_copy(update={"description": "SPINE"}))


def _file(folder: Path, study: str, patient: str, issuer: str = "") -> Path:
    ds = pydicom.Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
    ds.StudyInstanceUID, ds.PatientID = study, patient
    if issuer:
        ds.IssuerOfPatientID = issuer
    path = folder / f"{ds.SOPInstanceUID}.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


def test_a_pulled_file_of_another_study_or_patient_is_removed_and_listed(tmp_path: Path) -> None:
    study = generate_uid()
    match = StudyMatch(pacs="a", study_uid=study, patient_id="P1")
    kept = [_file(tmp_path, study, "P1") for _ in range(2)]
    other_patient = _file(tmp_path, study, "P2")
    other_issuer = _file(tmp_path, study, "P1", issuer="OTHER")
    other_study = _file(tmp_path, generate_uid(), "P1")
    (tmp_path / "junk.bin").write_bytes(b"not dicom")
    got = keep_the_study(match, tmp_path)
    assert got.n_files == 2 and all(p.exists() for p in kept)
    assert not other_patient.exists() and not other_issuer.exists() and not other_study.exists()
    assert len(got.rejected) == 4
    assert sum("another patient" in r for r in got.rejected) == 2
    assert sum("another study" in r for r in got.rejected) == 1


def test_the_documented_example_file_loads() -> None:
    example = Path(__file__).resolve().parents[1] / "docs" / "pacs.example.yaml"
    pacs = load_pacs_file(example)
    assert set(pacs.pacs) == {"archive", "web"} and pacs.writeback == "local"
