"""A DICOM archive as a PacsClient by DIMSE (gateway/pacs/dimse.py), against dcmtk's dcmqrscp."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from gateway.pacs import DimsePacs, PacsRequestError, StudyQuery, TlsConfig
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port
from tests.dcmqrscp_fixture import AE_TITLE, CALLING_AE, MOVE_AE, Dcmqrscp
from tests.gateway_synth import make_study
from tests.tls_fixture import TLS_AE, TlsOrthanc


@pytest.fixture(scope="module")
def loaded(dcmqrscp: Dcmqrscp, tmp_path_factory: pytest.TempPathFactory):
    tag = uuid.uuid4().hex[:8].upper()
    root = tmp_path_factory.mktemp("dimse")
    a = make_study(root / "a", classes=("FLAIR", "T2"), n_slices=3, patient_id=f"A{tag}")
    b = make_study(root / "b", classes=("T1",), n_slices=2, patient_id=f"B{tag}")
    for study, acc, date, desc in (
        (a, f"A{tag}", "20240305", "MRI HEAD W/O"),
        (b, f"B{tag}", "20240412", "MR SPINE"),
    ):
        for f in study.files:
            ds = pydicom.dcmread(f)
            ds.AccessionNumber, ds.StudyDate, ds.StudyDescription = acc, date, desc
            ds.save_as(f)
    dcmqrscp.store(root / "a", root / "b")
    return tag, a, b


def _client(dcmqrscp: Dcmqrscp, **kw: object) -> DimseClient:
    cfg = DimsePacs(kind="dimse", ae_title=AE_TITLE, host="127.0.0.1", port=dcmqrscp.port,
                    calling_ae=CALLING_AE, timeout_s=20, **kw)  # type: ignore[arg-type]  # fmt: skip
    return DimseClient("archive", cfg)


def test_the_cohort_is_found_by_c_find(dcmqrscp: Dcmqrscp, loaded) -> None:
    tag, a, _ = loaded
    client = _client(dcmqrscp)
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    assert (m.study_uid, m.patient_id, m.accession) == (a.study_uid, f"A{tag}", f"A{tag}")
    assert m.modalities == ["MR"] and m.n_series == 2 and m.n_instances == 6
    assert m.study_date == dt.date(2024, 3, 5) and m.description == "MRI HEAD W/O"
    both = client.find_studies(StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"]))
    assert [x.patient_id for x in both] == [f"A{tag}", f"B{tag}"]
    march = client.find_studies(
        StudyQuery(
            patient_ids=[f"A{tag}", f"B{tag}"],
            date_from=dt.date(2024, 3, 1),
            date_to=dt.date(2024, 3, 31),
        )
    )
    assert [x.patient_id for x in march] == [f"A{tag}"]
    spine = client.find_studies(
        StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"], description="*spine*")
    )
    assert [x.patient_id for x in spine] == [f"B{tag}"]
    assert client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"], modalities=["CT"])) == []


@pytest.mark.parametrize("how", ["c-get", "c-move"])
def test_the_study_is_pulled(dcmqrscp: Dcmqrscp, loaded, tmp_path: Path, how: str) -> None:
    tag, a, _ = loaded
    extra = {"move_destination": MOVE_AE, "receive_host": "127.0.0.1",
             "receive_port": dcmqrscp.move_port} if how == "c-move" else {}  # fmt: skip
    client = _client(dcmqrscp, retrieve=how, **extra)
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    seen: list[int] = []
    got = client.retrieve(m, tmp_path / how, lambda done, total: seen.append(done))
    assert got.n_files == 6 and not got.failed and not got.rejected, got
    assert seen[-1] == 6
    sops = {str(pydicom.dcmread(p).SOPInstanceUID) for p in (tmp_path / how).glob("*.dcm")}
    assert sops == {str(pydicom.dcmread(f).SOPInstanceUID) for f in a.files}


def test_an_sr_is_stored_by_c_store_and_found_again(dcmqrscp: Dcmqrscp, loaded) -> None:
    tag, _, b = loaded
    client = _client(dcmqrscp)
    ds = pydicom.dcmread(b.files[0])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    (res,) = client.store([ds])
    assert res.stored, res
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"B{tag}"]))
    assert m.n_series == 2 and m.n_instances == 3


def test_an_object_built_in_memory_is_stored(dcmqrscp: Dcmqrscp, loaded) -> None:
    """An SR or PDF made by write-back has no File Meta: it is sent as Explicit VR LE."""
    b = loaded[2]
    ds = pydicom.dcmread(b.files[1])
    del ds.file_meta
    ds.SOPInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    (res,) = _client(dcmqrscp).store([ds])
    assert res.stored, res
    assert not hasattr(ds, "file_meta")  # the caller's dataset is left as it was


def test_an_archive_that_is_down_is_a_clear_error_in_bounded_time() -> None:
    cfg = DimsePacs(kind="dimse", ae_title="NOBODY", host="127.0.0.1", port=free_port(),
                    timeout_s=5)  # fmt: skip
    start = time.monotonic()
    with pytest.raises(PacsRequestError, match=r"PACS 'down' \(NOBODY@127.0.0.1:\d+\)"):
        DimseClient("down", cfg).find_studies(StudyQuery(patient_ids=["X"]))
    assert time.monotonic() - start < 10


def _tls_client(server: TlsOrthanc, ca: Path) -> DimseClient:
    cfg = DimsePacs(kind="dimse", ae_title=TLS_AE, host="127.0.0.1", port=server.dicom_port,
                    timeout_s=20, tls=TlsConfig(ca_file=ca))  # fmt: skip
    return DimseClient("secure", cfg)


def test_c_find_and_c_get_over_tls_with_the_hospitals_ca(
    tls_orthanc: TlsOrthanc, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=2, patient_id="TLS1")
    for f in study.files:
        tls_orthanc.upload(f)
    client = _tls_client(tls_orthanc, tls_orthanc.pki.ca)
    (m,) = client.find_studies(StudyQuery(patient_ids=["TLS1"]))
    got = client.retrieve(m, tmp_path / "pulled")
    assert m.study_uid == study.study_uid and got.n_files == 2 and not got.rejected
    # a PACS whose certificate another CA signed is refused, and said so
    with pytest.raises(PacsRequestError, match="TLS"):
        _tls_client(tls_orthanc, tls_orthanc.pki.other_ca).find_studies(
            StudyQuery(patient_ids=["TLS1"])
        )
