"""A DICOMweb server as a PacsClient (gateway/pacs/dicomweb.py): Orthanc's DICOMweb plugin, and
the same over HTTPS with the hospital's CA."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pydicom
import pytest
import yaml
from pydicom.uid import generate_uid

from gateway.orthanc import OrthancClient
from gateway.pacs import DicomwebPacs, PacsRequestError, StudyQuery, TlsConfig
from gateway.pacs.dicomweb import DicomwebClient
from tests.gateway_synth import make_study
from tests.orthanc_fixture import OrthancServer
from tests.tls_fixture import TlsOrthanc, TlsProxy


@pytest.fixture(scope="module")
def loaded(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory):
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    tag = uuid.uuid4().hex[:8].upper()
    root = tmp_path_factory.mktemp("web")
    a = make_study(root / "a", classes=("FLAIR", "T2"), n_slices=2, patient_id=f"A{tag}")
    b = make_study(root / "b", classes=("T1",), n_slices=2, patient_id=f"B{tag}")
    c = make_study(root / "c", classes=("T1",), n_slices=1, patient_id=f"C{tag}",
                   study_uid=a.study_uid)  # fmt: skip
    for study, acc, date, desc in (
        (a, f"A{tag}", "20240305", "MRI HEAD W/O"),
        (b, f"B{tag}", "20240412", "MR SPINE"),
        (c, f"C{tag}", "20240305", "MRI HEAD W/O"),
    ):
        for f in study.files:
            ds = pydicom.dcmread(f)
            ds.AccessionNumber, ds.StudyDate, ds.StudyDescription = acc, date, desc
            ds.save_as(f)
            orthanc.upload(f)
    orthanc.close()
    return tag, a, b


@pytest.fixture
def client(orthanc_server: OrthancServer, monkeypatch: pytest.MonkeyPatch):
    ep = orthanc_server.endpoints
    monkeypatch.setenv("TEST_PACS_USER", ep.username)
    monkeypatch.setenv("TEST_PACS_PASSWORD", orthanc_server.password)
    cfg = DicomwebPacs(kind="dicomweb", url=f"{ep.orthanc_url}/dicom-web",
                       username_env="TEST_PACS_USER", password_env="TEST_PACS_PASSWORD")  # fmt: skip
    c = DicomwebClient("web", cfg)
    yield c
    c.close()


def test_the_rendered_orthanc_serves_dicomweb_at_its_root(orthanc_server: OrthancServer) -> None:
    # the configuration `neurosandbox pacs up` renders loads the plugin, and the root it names
    # is the one a PACS file's url ends with
    config = json.loads(orthanc_server.pacs.config_file.read_text())
    assert any(p.endswith("libOrthancDicomWeb.so") for p in config["Plugins"])
    assert config["DicomWeb"]["Enable"] is True and config["DicomWeb"]["Root"] == "/dicom-web/"
    ep = orthanc_server.endpoints
    auth = (ep.username, orthanc_server.password)
    with httpx.Client(auth=auth, timeout=20) as http:
        assert "dicom-web" in http.get(f"{ep.orthanc_url}/plugins").json()
        r = http.get(f"{ep.orthanc_url}/dicom-web/studies", params={"limit": "1"},
                     headers={"Accept": "application/dicom+json"})  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "application/dicom+json"
        )


def test_the_cohort_is_found_by_qido(client: DicomwebClient, loaded) -> None:
    tag, a, _ = loaded
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    assert (m.study_uid, m.patient_id, m.accession) == (a.study_uid, f"A{tag}", f"A{tag}")
    assert m.modalities == ["MR"] and m.n_series == 2 and m.n_instances == 4
    assert m.study_date == dt.date(2024, 3, 5) and m.description == "MRI HEAD W/O"
    assert m.birth_date == "19700101" and m.patient_name == "Test^Synthetic"
    both = client.find_studies(StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"]))
    assert [x.patient_id for x in both] == [f"A{tag}", f"B{tag}"]
    march = client.find_studies(StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"],
        date_from=dt.date(2024, 3, 1), date_to=dt.date(2024, 3, 31), description="mri head*"))  # fmt: skip
    assert [x.patient_id for x in march] == [f"A{tag}"]
    assert client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"], modalities=["CT"])) == []


def test_qido_pages_past_one_page_on_a_real_server(
    client: DicomwebClient, loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.pacs.dicomweb as dw

    tag, a, b = loaded
    monkeypatch.setattr(dw, "PAGE", 1)  # every study its own page: limit=1&offset=n
    found = client.find_studies(
        StudyQuery(date_from=dt.date(2024, 3, 5), date_to=dt.date(2024, 4, 12))
    )
    mine = sorted((m.patient_id, m.study_uid) for m in found if m.patient_id.endswith(tag))
    # A's UID is held under A and C: two studies of two patients, and B's
    assert mine == sorted(
        [(f"A{tag}", a.study_uid), (f"C{tag}", a.study_uid), (f"B{tag}", b.study_uid)]
    )


def test_the_study_is_pulled_by_wado_for_its_patient_only(
    client: DicomwebClient, loaded, tmp_path: Path
) -> None:
    tag, _a, _ = loaded
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    seen: list[tuple[int, int | None]] = []
    got = client.retrieve(m, tmp_path / "w", lambda d, t: seen.append((d, t)))
    # the archive holds this UID for two patients: only this patient's series are pulled
    assert got.n_files == 4 and not got.failed and not got.rejected, got
    assert seen[-1] == (4, 4)
    assert {str(pydicom.dcmread(p).PatientID) for p in got.folder.iterdir()} == {f"A{tag}"}
    assert not list((tmp_path / "w").glob(".part-*"))


def test_a_cohort_is_found_and_pulled_by_dicomweb_alone(
    orthanc_server: OrthancServer, loaded, tmp_path: Path
) -> None:
    # the command a hospital runs, with a PACS file naming Orthanc's DICOMweb root only
    tag, a, b = loaded
    ep = orthanc_server.endpoints
    pacs_file = tmp_path / "pacs.yaml"
    pacs_file.write_text(
        f"pacs:\n  web:\n    kind: dicomweb\n    url: {ep.orthanc_url}/dicom-web\n"
        "    username_env: TEST_PACS_USER\n    password_env: TEST_PACS_PASSWORD\n"
    )
    env = {**os.environ, **orthanc_server.env, "NEUROSANDBOX_PACS_FILE": str(pacs_file),
           "TEST_PACS_USER": ep.username, "TEST_PACS_PASSWORD": orthanc_server.password,
           "NEUROSANDBOX_ORTHANC_URL": "http://127.0.0.1:9"}  # fmt: skip
    cli = str(Path(sys.executable).with_name("neurosandbox"))
    run = subprocess.run(
        [cli, "cases", "from-pacs", "--pacs", "web", "--accession", f"A{tag}", "--accession",
         f"B{tag}", "--date-from", "2024-03-01", "--modality", "MR", "--out", "web.yaml",
         "--name", "web-pilot", "--json"],
        env=env, cwd=tmp_path, text=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    pulled = {s["match"]["study_uid"]: s["retrieved"] for s in out["studies"]}
    assert set(pulled) == {a.study_uid, b.study_uid}
    # A's UID is also held under patient C: only A's 4 instances are kept
    assert pulled[a.study_uid]["n_files"] == 4 and not pulled[a.study_uid]["rejected"]
    assert pulled[b.study_uid]["n_files"] >= 2
    # (test_cases_from_pacs runs `cases check` on what from-pacs writes: one CLI start less)
    cases = yaml.safe_load((tmp_path / "web.yaml").read_text())["cases"]
    counts = sorted(len(list(Path(c["study"]).glob("*.dcm"))) for c in cases)
    assert counts == sorted([pulled[b.study_uid]["n_files"], 4])


def test_an_sr_is_stored_by_stow_and_read_back(
    client: DicomwebClient, loaded, tmp_path: Path
) -> None:
    tag, _, b = loaded
    ds = pydicom.dcmread(b.files[0])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    (res,) = client.store([ds])
    assert res.stored and res.sop_instance_uid == ds.SOPInstanceUID, res
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"B{tag}"]))
    assert m.n_series == 2 and m.n_instances == 3
    got = client.retrieve(m, tmp_path / "b")
    assert ds.SOPInstanceUID in {
        str(pydicom.dcmread(p).SOPInstanceUID) for p in got.folder.iterdir()
    }


def test_a_wrong_password_is_said(
    orthanc_server: OrthancServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PACS_USER", "nobody")
    monkeypatch.setenv("TEST_PACS_PASSWORD", "wrong")
    cfg = DicomwebPacs(kind="dicomweb", url=f"{orthanc_server.endpoints.orthanc_url}/dicom-web",
                       username_env="TEST_PACS_USER", password_env="TEST_PACS_PASSWORD")  # fmt: skip
    with pytest.raises(PacsRequestError, match=r"HTTP 401.*password_env"):
        DicomwebClient("web", cfg).find_studies(StudyQuery(patient_ids=["X"]))


def test_https_with_the_hospitals_ca(
    tls_orthanc: TlsOrthanc, https_orthanc: TlsProxy, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=2, patient_id="HTTPS1")
    for f in study.files:
        tls_orthanc.upload(f)

    def client(ca: Path, server_name: str | None = None) -> DicomwebClient:
        tls = TlsConfig(ca_file=ca, server_name=server_name)
        return DicomwebClient("secure", DicomwebPacs(kind="dicomweb",
            url=f"{https_orthanc.url}/dicom-web", tls=tls, timeout_s=20))  # fmt: skip

    (m,) = client(tls_orthanc.pki.ca).find_studies(StudyQuery(patient_ids=["HTTPS1"]))
    got = client(tls_orthanc.pki.ca).retrieve(m, tmp_path / "pulled")
    assert m.study_uid == study.study_uid and got.n_files == 2
    with pytest.raises(PacsRequestError, match="TLS: the PACS's certificate is not trusted"):
        client(tls_orthanc.pki.other_ca).find_studies(StudyQuery(patient_ids=["HTTPS1"]))
    # tls.server_name is the name the certificate must carry (not the URL's host)
    (same,) = client(tls_orthanc.pki.ca, "localhost").find_studies(
        StudyQuery(patient_ids=["HTTPS1"])
    )
    assert same.study_uid == study.study_uid
    with pytest.raises(PacsRequestError, match=r"TLS: .*(mismatch|doesn't match)"):
        client(tls_orthanc.pki.ca, "pacs.elsewhere.example").find_studies(
            StudyQuery(patient_ids=["HTTPS1"])
        )


def test_https_with_a_client_certificate(
    tls_orthanc: TlsOrthanc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an archive that asks for the sandbox's certificate (mutual TLS): tls.cert_file/key_file
    import ssl
    import time

    import gateway.pacs.dicomweb as dw

    proxy = TlsProxy(tls_orthanc.pki, tls_orthanc.http_port)
    proxy.ctx.verify_mode = ssl.CERT_REQUIRED
    proxy.ctx.load_verify_locations(str(tls_orthanc.pki.ca))
    pki = tls_orthanc.pki
    try:
        study = make_study(tmp_path / "s", classes=("T2",), n_slices=1, patient_id="MTLS1")
        tls_orthanc.upload(study.files[0])

        def client(**mine: Path) -> DicomwebClient:
            tls = TlsConfig(ca_file=pki.ca, **mine)
            return DicomwebClient("mtls", DicomwebPacs(kind="dicomweb",
                url=f"{proxy.url}/dicom-web", tls=tls, timeout_s=10))  # fmt: skip

        with_cert = client(cert_file=pki.client_cert, key_file=pki.client_key)
        (m,) = with_cert.find_studies(StudyQuery(patient_ids=["MTLS1"]))
        assert with_cert.retrieve(m, tmp_path / "p").n_files == 1
        monkeypatch.setattr(dw, "RETRY_WAIT_S", 2.0)
        started = time.monotonic()
        with pytest.raises(PacsRequestError, match=r"TLS: .*CERTIFICATE_REQUIRED"):
            client().find_studies(StudyQuery(patient_ids=["MTLS1"]))
        assert time.monotonic() - started < 1.5  # a TLS refusal is not tried again
    finally:
        proxy.close()
