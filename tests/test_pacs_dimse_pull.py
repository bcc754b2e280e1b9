"""Pulling from a DICOM archive by DIMSE (gateway/pacs/dimse.py) against dcmtk's dcmqrscp: what
the archive sends is judged here, whatever it is."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest

from gateway.pacs import DimsePacs, PacsRequestError, StudyQuery, TlsConfig, dimse
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port
from tests.dcmqrscp_fixture import AE_TITLE, CALLING_AE, MOVE_AE, Dcmqrscp, _wait_listening
from tests.gateway_synth import make_study
from tests.tls_fixture import TLS_AE, Pki, TlsOrthanc


def _client(dcmqrscp: Dcmqrscp, how: str) -> DimseClient:
    extra = {"move_destination": MOVE_AE, "receive_host": "127.0.0.1",
             "receive_port": dcmqrscp.move_port} if how == "c-move" else {}  # fmt: skip
    cfg = DimsePacs(kind="dimse", ae_title=AE_TITLE, host="127.0.0.1", port=dcmqrscp.port,
                    calling_ae=CALLING_AE, timeout_s=20, retrieve=how, **extra)  # type: ignore[arg-type]  # fmt: skip
    return DimseClient("archive", cfg)


@pytest.fixture(scope="module")
def shared_uid(dcmqrscp: Dcmqrscp, tmp_path_factory: pytest.TempPathFactory):
    """One study UID under two patients: 3 files of P, 1 of Q (a mix-up the archive keeps)."""
    tag = uuid.uuid4().hex[:8].upper()
    root = tmp_path_factory.mktemp("shared-uid")
    p = make_study(root / "p", classes=("FLAIR",), n_slices=3, patient_id=f"P{tag}")
    q = make_study(root / "q", classes=("T2",), n_slices=1, patient_id=f"Q{tag}",
                   study_uid=p.study_uid)  # fmt: skip
    ds = pydicom.dcmread(q.files[0])
    ds.Modality = "CT"  # Q's series is told apart by its modality too
    ds.save_as(q.files[0])
    dcmqrscp.store(root / "p", root / "q")
    return p, q


@pytest.mark.parametrize("how", ["c-get", "c-move"])
def test_a_file_of_another_patient_under_the_study_uid_is_not_kept(
    dcmqrscp: Dcmqrscp, shared_uid, tmp_path: Path, how: str
) -> None:
    p, q = shared_uid
    client = _client(dcmqrscp, how)
    found = client.find_studies(StudyQuery(study_uids=[p.study_uid]))
    assert sorted(x.patient_id for x in found) == [p.patient_id, q.patient_id]
    (m,) = [x for x in found if x.patient_id == p.patient_id]
    # P's own series and instances: dcmqrscp answers the SERIES and IMAGE finds asked with P's
    # ID with Q's series too (the patient is not a key below the study level)
    assert (m.modalities, m.n_series, m.n_instances) == (["MR"], 1, 3), m
    got = client.retrieve(m, tmp_path / how)
    kept = {pydicom.dcmread(f).PatientID for f in (tmp_path / how).glob("*.dcm")}
    assert got.n_files == 3 and kept == {p.patient_id}, got


def test_a_file_of_another_patient_the_archive_sends_is_removed_and_listed(
    tls_orthanc: TlsOrthanc, tmp_path: Path
) -> None:
    """Orthanc answers a C-GET by study UID with both patients' files: Q's is removed, listed."""
    tag = uuid.uuid4().hex[:8].upper()
    p = make_study(tmp_path / "p", classes=("FLAIR",), n_slices=2, patient_id=f"P{tag}")
    q = make_study(tmp_path / "q", classes=("T2",), n_slices=1, patient_id=f"Q{tag}",
                   study_uid=p.study_uid)  # fmt: skip
    for f in (*p.files, *q.files):
        tls_orthanc.upload(f)
    cfg = DimsePacs(kind="dimse", ae_title=TLS_AE, host="127.0.0.1", port=tls_orthanc.dicom_port,
                    timeout_s=20, tls=TlsConfig(ca_file=tls_orthanc.pki.ca))  # fmt: skip
    client = DimseClient("secure", cfg)
    (m,) = client.find_studies(StudyQuery(patient_ids=[p.patient_id]))
    got = client.retrieve(m, tmp_path / "pulled")
    kept = {pydicom.dcmread(f).PatientID for f in (tmp_path / "pulled").glob("*.dcm")}
    assert got.n_files == 2 and kept == {p.patient_id}, got
    assert len(got.rejected) == 1 and "another patient" in got.rejected[0], got.rejected


@pytest.mark.parametrize(
    ("how", "bound", "value"),
    [("c-get", "MAX_STUDY_BYTES", 25_000), ("c-move", "MAX_STUDY_BYTES", 25_000),
     ("c-get", "MAX_STUDY_INSTANCES", 2)],
)  # fmt: skip
def test_an_archive_sending_more_than_a_study_can_be_is_stopped_and_nothing_kept(
    dcmqrscp: Dcmqrscp, shared_uid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    how: str, bound: str, value: int,
) -> None:  # fmt: skip
    """A study is bounded as a whole (bytes, instances), not only per instance: past the bound
    the archive's association is aborted, the pull is an error, and no file of it is kept."""
    p, _ = shared_uid
    client = _client(dcmqrscp, how)
    (m,) = client.find_studies(StudyQuery(patient_ids=[p.patient_id]))
    monkeypatch.setattr(dimse, bound, value)  # 3 instances of ~9.5 kB each
    start = time.monotonic()
    with pytest.raises(PacsRequestError, match=r"PACS 'archive' .*stopped.* nothing of it kept"):
        client.retrieve(m, tmp_path / how)
    assert time.monotonic() - start < 10
    assert list((tmp_path / how).iterdir()) == []
    # and the archive is not left in a state that refuses the next pull
    monkeypatch.undo()
    assert client.retrieve(m, tmp_path / "again").n_files == 3


def test_the_c_move_receiver_over_tls_takes_only_a_peer_the_hospitals_ca_signed(
    tls_pki: Pki, tmp_path: Path
) -> None:
    """With tls.ca_file, our receiver asks the sending peer for its certificate and checks it:
    the archive's AE title alone (a string anyone on the network may send) is not enough."""
    study = make_study(tmp_path / "s", classes=("T2",), n_slices=1, patient_id="TLSRECV1")
    tls = TlsConfig(ca_file=tls_pki.ca, cert_file=tls_pki.client_cert, key_file=tls_pki.client_key)
    port = free_port()
    cfg = DimsePacs(kind="dimse", ae_title=TLS_AE, host="127.0.0.1", port=1, timeout_s=10,
                    tls=tls, retrieve="c-move", move_destination="NSBXRECV",
                    receive_host="127.0.0.1", receive_port=port)  # fmt: skip
    got: list[int] = []

    def send(*identity: str) -> int:
        args = ["/usr/bin/storescu", *identity, "+cf", str(tls_pki.ca), "-aet", TLS_AE,
                "-aec", "NSBXRECV", "127.0.0.1", str(port), str(study.files[0])]  # fmt: skip
        return subprocess.run(args, capture_output=True, timeout=30).returncode

    with DimseClient("secure", cfg).receiving(lambda event: got.append(1) or 0x0000):
        assert send("+tla") != 0 and got == []  # TLS, the right AE title, no certificate
        assert send("+tls", str(tls_pki.key), str(tls_pki.cert)) == 0 and got == [1]


@pytest.fixture
def compressing_archive(tmp_path: Path) -> Iterator[int]:
    """A dcmqrscp preferring JPEG Lossless for what it accepts (+xs), its port."""
    db = tmp_path / "db"
    db.mkdir()
    port = free_port()
    (tmp_path / "c.cfg").write_text(
        f"NetworkTCPPort = {port}\nMaxPDUSize = 65536\nMaxAssociations = 16\n"
        "HostTable BEGIN\nHostTable END\nVendorTable BEGIN\nVendorTable END\n"
        f"AETable BEGIN\n{AE_TITLE} {db} RW (20, 100mb) ANY\nAETable END\n"
    )
    proc = subprocess.Popen(["/usr/bin/dcmqrscp", "+xs", "-c", str(tmp_path / "c.cfg")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_listening(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_c_get_from_an_archive_preferring_a_compressed_syntax_gets_every_instance(
    compressing_archive: int, tmp_path: Path
) -> None:
    """Each image class is offered in a context of the uncompressed syntaxes and one context per
    compressed syntax: an archive that accepts JPEG Lossless where it may still has a context to
    send an uncompressed instance on (one context of every syntax: all 3 failed, 0xA702)."""
    make_study(tmp_path / "s", classes=("T1",), n_slices=3, patient_id="XSPAT1")
    subprocess.run(["/usr/bin/storescu", "-aec", AE_TITLE, "+sd", "127.0.0.1",
                    str(compressing_archive), str(tmp_path / "s")], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    cfg = DimsePacs(kind="dimse", ae_title=AE_TITLE, host="127.0.0.1", port=compressing_archive,
                    timeout_s=20)  # fmt: skip
    client = DimseClient("archive", cfg)
    (m,) = client.find_studies(StudyQuery(patient_ids=["XSPAT1"]))
    got = client.retrieve(m, tmp_path / "got")
    assert got.n_files == 3 and not got.failed, got
