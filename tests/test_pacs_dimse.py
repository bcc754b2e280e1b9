"""A DICOM archive as a PacsClient by DIMSE (gateway/pacs/dimse.py), against dcmtk's dcmqrscp."""

from __future__ import annotations

import datetime as dt
import subprocess
import time
import uuid
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from gateway.pacs import DimsePacs, PacsRequestError, StudyQuery, TlsConfig, dimse
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port
from tests.dcmqrscp_fixture import (
    AE_TITLE,
    CALLING_AE,
    FULL_AE,
    MOVE_AE,
    READ_ONLY_AE,
    Dcmqrscp,
)
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


def _client(dcmqrscp: Dcmqrscp, ae_title: str = AE_TITLE, **kw: object) -> DimseClient:
    cfg = DimsePacs(kind="dimse", ae_title=ae_title, host="127.0.0.1", port=dcmqrscp.port,
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


def _move_client(dcmqrscp: Dcmqrscp, destination: str = MOVE_AE) -> DimseClient:
    return _client(dcmqrscp, retrieve="c-move", move_destination=destination,
                   receive_host="127.0.0.1", receive_port=dcmqrscp.move_port)  # fmt: skip


def test_a_move_to_a_destination_the_archive_does_not_know_names_it(
    dcmqrscp: Dcmqrscp, loaded, tmp_path: Path
) -> None:
    tag = loaded[0]
    client = _move_client(dcmqrscp, "STRANGER")
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    with pytest.raises(PacsRequestError, match=r"does not know the C-MOVE destination 'STRANGER'"):
        client.retrieve(m, tmp_path / "moved")
    assert not list((tmp_path / "moved").glob("*.dcm"))


@pytest.fixture(scope="module")
def with_ultrasound(dcmqrscp: Dcmqrscp, tmp_path_factory: pytest.TempPathFactory):
    """A study of 2 MR instances and 1 of a class the sandbox does not take (Ultrasound)."""
    root = tmp_path_factory.mktemp("us")
    study = make_study(
        root / "s", classes=("T2",), n_slices=3, patient_id=f"U{uuid.uuid4().hex[:8]}"
    )
    ds = pydicom.dcmread(study.files[0])
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.6.1"
    ds.Modality = "US"
    ds.save_as(study.files[0])
    dcmqrscp.store(root / "s")
    return study


@pytest.mark.parametrize("how", ["c-get", "c-move"])
def test_an_instance_of_a_class_not_taken_is_listed_and_the_rest_kept(
    dcmqrscp: Dcmqrscp, with_ultrasound, tmp_path: Path, how: str
) -> None:
    study = with_ultrasound
    client = _client(dcmqrscp) if how == "c-get" else _move_client(dcmqrscp)
    (m,) = client.find_studies(StudyQuery(patient_ids=[study.patient_id]))
    got = client.retrieve(m, tmp_path / how)
    assert got.n_files == 2, got
    assert len(got.failed) == 1 and "1 instance(s)" in got.failed[0], got.failed
    kept = {str(pydicom.dcmread(p).SOPClassUID) for p in (tmp_path / how).glob("*.dcm")}
    assert kept == {"1.2.840.10008.5.1.4.1.1.4"}


def _new_instance(path: Path) -> pydicom.Dataset:
    ds = pydicom.dcmread(path)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    return ds


def test_a_store_the_archive_refuses_is_a_result_with_its_status(
    dcmqrscp: Dcmqrscp, loaded
) -> None:
    ds = _new_instance(loaded[2].files[0])
    (res,) = _client(dcmqrscp, FULL_AE).store([ds])
    assert not res.stored and res.sop_instance_uid == str(ds.SOPInstanceUID)
    assert "0xA700" in res.detail and "Out of Resources" in res.detail, res.detail


def test_an_archive_that_takes_no_such_object_says_so_per_object(
    dcmqrscp: Dcmqrscp, loaded
) -> None:
    """A read-only archive accepts the association but none of the storage classes asked for:
    that is a refusal of each object (not 'down'), saying which class."""
    a, b = _new_instance(loaded[2].files[0]), _new_instance(loaded[2].files[1])
    results = _client(dcmqrscp, READ_ONLY_AE).store([a, b])
    assert [r.sop_instance_uid for r in results] == [str(a.SOPInstanceUID), str(b.SOPInstanceUID)]
    assert not any(r.stored for r in results)
    assert all("MR Image Storage" in r.detail and "accepted" in r.detail for r in results), results


def test_the_c_move_receiver_takes_only_the_archives_ae_title(
    dcmqrscp: Dcmqrscp, loaded, tmp_path: Path
) -> None:
    client = _move_client(dcmqrscp)
    got: list[int] = []

    def send(calling: str) -> int:
        args = ["/usr/bin/storescu", "-aet", calling, "-aec", MOVE_AE, "127.0.0.1",
                str(dcmqrscp.move_port), str(loaded[1].files[0])]  # fmt: skip
        return subprocess.run(args, capture_output=True, timeout=30).returncode

    with client.receiving(lambda event: got.append(1) or 0x0000):
        assert send("INTRUDER") != 0 and got == []  # refused: not the archive
        assert send(AE_TITLE) == 0 and got == [1]


def test_a_query_with_a_limit_asks_for_the_series_of_those_listed_only(
    dcmqrscp: Dcmqrscp, loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = loaded[0]
    client = _client(dcmqrscp)
    asked: list[str] = []
    series_of = client._series_of
    monkeypatch.setattr(
        client, "_series_of", lambda assoc, m: asked.append(m.study_uid) or series_of(assoc, m)
    )
    (m,) = client.find_studies(StudyQuery(patient_ids=[f"B{tag}", f"A{tag}"], limit=1))
    assert m.patient_id == f"A{tag}" and m.n_series == 2 and m.n_instances == 6  # the earliest
    assert asked == [m.study_uid]


def test_a_find_stopped_at_its_bound_leaves_the_association_in_order(
    dcmqrscp: Dcmqrscp, loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the bound of studies a find may list, the archive is told to stop (C-CANCEL) and the
    association goes on: the counts that follow are the study's own, not leftovers."""
    tag, a, _ = loaded
    client = _client(dcmqrscp)
    monkeypatch.setattr(dimse, "MAX_MATCHES", 1)
    start = time.monotonic()
    found = client.find_studies(StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"]))
    assert [(m.study_uid, m.n_series, m.n_instances) for m in found] == [(a.study_uid, 2, 6)]
    assert time.monotonic() - start < 5
