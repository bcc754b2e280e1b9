"""Names outside Latin-1 reach the viewer's study list whole (issue 34).

Orthanc's DICOMweb plugin builds its QIDO answers (the viewer's study list) from its index in
Orthanc's DefaultEncoding, which is Latin-1 unless configured: "Dvořák^Tomáš" came back as
"Dvoák^Tomá" even from a file that declares UTF-8 (ISO_IR 192); the WADO metadata, read from
the file, was right. DefaultEncoding is also how Orthanc reads a file without a
SpecificCharacterSet. deploy/orthanc sets it to UTF-8: tried with and without ISO_IR 192 (and
Latin-1, Latin-2) here, through the gateway's DICOMweb proxy as the viewer queries it, against
the session's real Orthanc rendered from that template.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from fastapi.testclient import TestClient
from orthanc_fixture import OrthancServer
from pydicom.dataelem import DataElement
from pydicom.uid import generate_uid

from gateway.api import GatewayContext, create_app
from gateway.audit import AuditLog
from gateway.auth import Role, TokenStore
from gateway.orthanc import OrthancClient
from gateway.runs import StudyRunStore

NAME = "Dvořák^Tomáš"
# (SpecificCharacterSet or None, the PatientName's bytes as the file holds them)
STUDIES = {
    "utf8": ("ISO_IR 192", NAME.encode("utf-8")),
    "no_charset": (None, NAME.encode("utf-8")),  # undeclared UTF-8, as many senders write
    "latin2": ("ISO_IR 101", NAME.encode("iso8859-2")),
    "latin1": ("ISO_IR 100", "Müller^Jörg".encode("latin-1")),
}
EXPECTED = {"utf8": NAME, "no_charset": NAME, "latin2": NAME, "latin1": "Müller^Jörg"}


def _instance(source: Path, charset: str | None, name: bytes, patient_id: str) -> bytes:
    """A real BRAINIX slice as a study of its own, its PatientName's bytes as given."""
    ds = pydicom.dcmread(source)
    ds.StudyInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.PatientID = patient_id
    if charset is None:
        del ds.SpecificCharacterSet
    else:
        ds.SpecificCharacterSet = charset
    ds[0x00100010] = DataElement(0x00100010, "PN", name)  # bytes: written as they are
    buf = io.BytesIO()
    ds.save_as(buf)
    data = buf.getvalue()
    assert name in data
    return data


@pytest.fixture(scope="module")
def proxy(
    orthanc_server: OrthancServer, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, str, dict[str, str]]]:
    """The gateway's app over the session's Orthanc, a reviewer's token, the stored studies."""
    data = tmp_path_factory.mktemp("charset-data")
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=30)
    settings = orthanc_server.settings.model_copy(update={"data_dir": data})
    ctx = GatewayContext(
        settings, orthanc, StudyRunStore(data), AuditLog(data / "audit.jsonl"),
        TokenStore(data / "secret" / "tokens.json"),
    )  # fmt: skip
    token = ctx.tokens.create(Role.REVIEWER, "Dr Charset", "Charset^Carla")[1]
    source = corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR" / "IM-0001-0001.dcm"
    uids: dict[str, str] = {}
    for key, (charset, name) in STUDIES.items():
        data_bytes = _instance(source, charset, name, f"NSBX-CHARSET-{key}")
        uids[key] = str(pydicom.dcmread(io.BytesIO(data_bytes)).StudyInstanceUID)
        orthanc.upload(data_bytes)
    try:
        with TestClient(create_app(ctx)) as client:
            yield client, token, uids
    finally:
        for uid in uids.values():
            study_id = orthanc.find_study(uid)
            if study_id is not None:
                orthanc.api.delete(f"{orthanc.url}/studies/{study_id}")
        orthanc.close()


def _names(answer: list[dict[str, dict[str, list[dict[str, str]]]]]) -> list[str]:
    return [study["00100010"]["Value"][0]["Alphabetic"] for study in answer]


def test_the_study_list_gives_each_name_whole_with_and_without_a_declared_charset(
    proxy: tuple[TestClient, str, dict[str, str]],
) -> None:
    client, token, uids = proxy
    auth = {"Authorization": f"Bearer {token}"}
    got = {}
    for key, uid in uids.items():
        r = client.get(
            "/review/viewer/dicom-web/studies",
            params={"StudyInstanceUID": uid, "includefield": "00081030"},
            headers=auth,
        )
        assert r.status_code == 200, r.text
        (got[key],) = _names(r.json())
    assert got == EXPECTED


def test_a_list_of_several_studies_gives_every_name_whole(
    proxy: tuple[TestClient, str, dict[str, str]],
) -> None:
    """As the viewer's study list asks: a wildcard search (the '*' as a browser sends it, not
    percent-encoded: Orthanc does not expand %2A) answered with several studies."""
    client, token, uids = proxy
    auth = {"Authorization": f"Bearer {token}"}
    r = client.get("/review/viewer/dicom-web/studies?PatientID=NSBX-CHARSET-*&limit=101", headers=auth)  # fmt: skip
    assert r.status_code == 200, r.text
    by_uid = {s["0020000D"]["Value"][0]: _names([s])[0] for s in r.json()}
    assert by_uid == {uids[key]: EXPECTED[key] for key in STUDIES}
    r = client.get("/review/viewer/dicom-web/studies?PatientName=dvo*", headers=auth)
    assert r.status_code == 200, r.text
    found = {s["0020000D"]["Value"][0]: _names([s])[0] for s in r.json()}
    assert {uids[k]: NAME for k in ("utf8", "no_charset", "latin2")}.items() <= found.items()
