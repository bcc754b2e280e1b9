"""C-MOVE over DICOM TLS (gateway/pacs/dimse.py): the archive (an Orthanc speaking DICOM TLS with
a certificate the hospital's CA signed, tests/tls_fixture.py) sends the study to our receiver,
which speaks TLS with our certificate (signed by the same CA) for the time of the move."""

from __future__ import annotations

from pathlib import Path

import httpx
import pydicom
import pytest

from gateway.pacs import DimsePacs, PacsConfigError, StudyQuery, TlsConfig
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port
from tests.gateway_synth import make_study
from tests.tls_fixture import TLS_AE, TlsOrthanc

OUR_AE = "NSBXTLSMOVE"


def _client(server: TlsOrthanc, port: int, tls: TlsConfig) -> DimseClient:
    cfg = DimsePacs(kind="dimse", ae_title=TLS_AE, host="127.0.0.1", port=server.dicom_port,
                    calling_ae="NEUROSANDBOX", timeout_s=20, retrieve="c-move",
                    move_destination=OUR_AE, receive_host="127.0.0.1", receive_port=port,
                    tls=tls)  # fmt: skip
    return DimseClient("secure", cfg)


def test_a_study_is_moved_to_our_receiver_over_tls(tls_orthanc: TlsOrthanc, tmp_path: Path) -> None:
    pki = tls_orthanc.pki
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=3, patient_id="TLSMOVE1")
    for f in study.files:
        tls_orthanc.upload(f)
    port = free_port()
    # the archive's administrator: our AE title at our address and port, over TLS
    with httpx.Client(base_url=tls_orthanc.url, timeout=10) as api:
        api.put("/modalities/sandbox", json={"AET": OUR_AE, "Host": "127.0.0.1", "Port": port,
                                             "UseDicomTls": True}).raise_for_status()  # fmt: skip
        api.put("/modalities/requester", json={"AET": "NEUROSANDBOX", "Host": "127.0.0.1",
                                               "Port": 104, "AllowMove": True,
                                               "UseDicomTls": True}).raise_for_status()  # fmt: skip
    ours = TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    client = _client(tls_orthanc, port, ours)
    (m,) = client.find_studies(StudyQuery(patient_ids=["TLSMOVE1"]))
    got = client.retrieve(m, tmp_path / "moved")
    assert got.n_files == 3 and not got.failed and not got.rejected, got
    sops = {str(pydicom.dcmread(p).SOPInstanceUID) for p in (tmp_path / "moved").glob("*.dcm")}
    assert sops == {str(pydicom.dcmread(f).SOPInstanceUID) for f in study.files}

    # a receiver over TLS without our certificate cannot listen: said before anything moves
    alone = _client(tls_orthanc, port, TlsConfig(ca_file=pki.ca))
    with pytest.raises(PacsConfigError, match="cert_file and key_file"):
        alone.retrieve(m, tmp_path / "not-moved")
    assert not list((tmp_path / "not-moved").glob("*.dcm"))
