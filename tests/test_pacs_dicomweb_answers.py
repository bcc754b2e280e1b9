"""The DICOMweb client against the answers Orthanc never gives: a real loopback HTTP server
(http.server in a thread) scripted per test to answer as other archives, proxies and broken
networks do: paged QIDO answers capped below our limit, a server ignoring offset, series listed
without their patient, WADO-RS bodies cut mid-part or of another type, 503 then success, STOW-RS
202 with failures, a bearer token."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pydicom
import pytest
from pydicom.uid import generate_uid

import gateway.pacs.dicomweb as dw
from gateway.pacs import DicomwebPacs, PacsConfigError, PacsRequestError, StudyMatch, StudyQuery
from gateway.pacs.dicomweb import DicomwebClient
from tests.gateway_synth import SynthStudy, make_study


@dataclass
class Request:
    method: str
    path: str
    params: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes


# an answer: (status, headers, body chunks); the connection closes after the last chunk
Answer = tuple[int, dict[str, str], list[bytes]]


@dataclass
class Script:
    routes: dict[tuple[str, str], Callable[[Request], Answer]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def calls(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]


class _Handler(BaseHTTPRequestHandler):
    script: Script

    def _serve(self) -> None:
        url = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        req = Request(self.command, url.path, parse_qsl(url.query),
                      {k.lower(): v for k, v in self.headers.items()},
                      self.rfile.read(n))  # fmt: skip
        self.script.requests.append(req)
        route = self.script.routes.get((self.command, url.path))
        status, headers, chunks = route(req) if route else (404, {}, [b"no route"])
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()  # no Content-Length: the body ends when the connection closes
        for c in chunks:
            self.wfile.write(c)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    handler = type("H", (_Handler,), {"script": script})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/dw", script
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def web(server: tuple[str, Script]) -> Iterator[tuple[DicomwebClient, Script]]:
    url, script = server
    script.routes.clear()
    script.requests.clear()
    c = DicomwebClient("scripted", DicomwebPacs(kind="dicomweb", url=url, timeout_s=5))
    yield c, script
    c.close()


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dw, "RETRY_WAIT_S", 0.05, raising=False)


def js(data: object, status: int = 200, **headers: str) -> Answer:
    return (
        status,
        {"Content-Type": "application/dicom+json", **headers},
        [json.dumps(data).encode()],
    )


def study_item(i: int, patient: str = "P1", uid: str | None = None) -> dict[str, object]:
    return {
        "0020000D": {"vr": "UI", "Value": [uid or f"1.2.826.0.1.3680043.99.{i}"]},
        "00100020": {"vr": "LO", "Value": [patient]},
        "00080050": {"vr": "SH", "Value": [f"ACC{i}"]},
        "00080020": {"vr": "DA", "Value": ["20240305"]},
        "00080061": {"vr": "CS", "Value": ["MR"]},
    }


def paged(items: list[dict[str, object]], cap: int, warn: bool) -> Callable[[Request], Answer]:
    """QIDO-RS as PS3.18 8.3.4.4 allows: at most ``cap`` answers a page whatever the limit,
    with a Warning that more can be asked when ``warn``."""

    def answer(req: Request) -> Answer:
        p = dict(req.params)
        off, lim = int(p.get("offset", 0)), int(p.get("limit", 10**6))
        page = items[off : off + min(lim, cap)]
        more = off + len(page) < len(items)
        extra = {"Warning": '299 scripted: "There are additional results that can be requested"'}
        return js(page, **(extra if more and warn else {}))

    return answer


def test_paging_follows_a_server_that_caps_its_pages(
    web: tuple[DicomwebClient, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, script = web
    monkeypatch.setattr(dw, "PAGE", 5)
    items = [study_item(i) for i in range(12)]
    script.routes["GET", "/dw/studies"] = paged(items, cap=3, warn=True)
    found = client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert sorted(m.accession for m in found) == sorted(f"ACC{i}" for i in range(12))
    offsets = [dict(r.params)["offset"] for r in script.calls("/dw/studies")]
    assert offsets == ["0", "3", "6", "9"]  # the next page starts after what came, not at +limit


def test_paging_stops_on_a_server_that_ignores_offset(
    web: tuple[DicomwebClient, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, script = web
    monkeypatch.setattr(dw, "PAGE", 5)
    items = [study_item(i) for i in range(8)]
    script.routes["GET", "/dw/studies"] = lambda req: js(items)  # every page is everything
    found = client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert len(found) == 8  # none dropped by a page cut at our limit
    assert len(script.calls("/dw/studies")) == 2  # the second page brought nothing new: done


def test_paging_is_bounded(web: tuple[DicomwebClient, Script], monkeypatch) -> None:
    client, script = web
    monkeypatch.setattr(dw, "PAGE", 4)
    monkeypatch.setattr(dw, "MAX_SCANNED", 10)
    items = [study_item(i) for i in range(30)]
    script.routes["GET", "/dw/studies"] = paged(items, cap=4, warn=False)
    with pytest.raises(PacsRequestError, match="over 10 studies match"):
        client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert len(script.calls("/dw/studies")) == 3


def test_a_qido_answer_that_is_not_a_list_is_an_error(web: tuple[DicomwebClient, Script]) -> None:
    client, script = web
    script.routes["GET", "/dw/studies"] = lambda req: js({"error": "quota exceeded"})
    with pytest.raises(PacsRequestError, match="not a JSON array"):
        client.find_studies(StudyQuery(patient_ids=["P1"]))


def test_a_get_is_retried_on_503_then_succeeds(web: tuple[DicomwebClient, Script]) -> None:
    client, script = web
    answers = [js([], 503), js([], 502), js([study_item(1)])]
    script.routes["GET", "/dw/studies"] = lambda req: answers.pop(0)
    (m,) = client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert m.accession == "ACC1" and len(script.calls("/dw/studies")) == 3


def test_a_post_is_never_retried(web: tuple[DicomwebClient, Script], tmp_path: Path) -> None:
    client, script = web
    script.routes["POST", "/dw/studies"] = lambda req: js({}, 503)
    ds = pydicom.dcmread(make_study(tmp_path, ("T1",), n_slices=1).files[0])
    with pytest.raises(PacsRequestError, match="HTTP 503"):
        client.store([ds])
    assert len(script.calls("/dw/studies")) == 1


# ----------------------------------------------------------------- WADO-RS


def multipart(files: list[Path], boundary: str = "b0und4ry") -> tuple[dict[str, str], bytes]:
    body = b"".join(
        f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + f.read_bytes()
        + b"\r\n" for f in files
    ) + f"--{boundary}--\r\n".encode()  # fmt: skip
    ct = f'multipart/related; type="application/dicom"; boundary={boundary}'
    return {"Content-Type": ct}, body


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> SynthStudy:
    return make_study(tmp_path_factory.mktemp("s"), ("FLAIR", "T2"), n_slices=2, patient_id="P1")


def series_of(study: SynthStudy) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for f in study.files:
        out.setdefault(str(pydicom.dcmread(f).SeriesInstanceUID), []).append(f)
    return out


def serve_study(script: Script, study: SynthStudy, with_patient: bool = True) -> dict[str, str]:
    """QIDO-RS series and WADO-RS per series; the paths of the series answers."""
    series = series_of(study)
    items = [
        {"0020000E": {"vr": "UI", "Value": [s]}}
        | ({"00100020": {"vr": "LO", "Value": ["P1"]}} if with_patient else {})
        for s in series
    ]
    script.routes["GET", f"/dw/studies/{study.study_uid}/series"] = lambda req: js(items)
    paths = {}
    for uid, files in series.items():
        path = f"/dw/studies/{study.study_uid}/series/{uid}"
        headers, body = multipart(files)
        script.routes["GET", path] = lambda req, h=headers, b=body: (200, h, [b])
        paths[uid] = path
    return paths


def match_of(study: SynthStudy, n: int | None = 4) -> StudyMatch:
    return StudyMatch(pacs="scripted", study_uid=study.study_uid, patient_id="P1", n_instances=n)


def test_series_listed_without_their_patient_are_pulled(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    # PS3.18 does not ask a study's series answer to carry PatientID; keep_the_study checks
    # every file anyway, so a series is skipped only when it names another patient
    client, script = web
    serve_study(script, study, with_patient=False)
    got = client.retrieve(match_of(study), tmp_path / "w")
    assert got.n_files == 4 and not got.failed and not got.rejected
    (listing,) = script.calls(f"/dw/studies/{study.study_uid}/series")
    assert ("includefield", "00100020") in listing.params


def test_wado_asks_for_the_stored_transfer_syntax_and_falls_back(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    client, script = web
    paths = serve_study(script, study)
    first = next(iter(paths.values()))
    ok = script.routes["GET", first]
    script.routes["GET", first] = lambda req: (
        ok(req) if "transfer-syntax" not in req.headers["accept"] else (406, {}, [b"no"])
    )
    got = client.retrieve(match_of(study), tmp_path / "w")
    assert got.n_files == 4 and not got.failed
    accepts = [r.headers["accept"] for r in script.requests if r.path in paths.values()]
    assert accepts[0].endswith("transfer-syntax=*")
    assert "transfer-syntax" not in accepts[1] and "transfer-syntax" not in accepts[-1]


def test_a_wado_answer_cut_mid_part_keeps_only_whole_instances(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    client, script = web
    paths = serve_study(script, study)
    first = next(iter(paths.values()))
    status, headers, (body,) = script.routes["GET", first](None)  # type: ignore[arg-type]
    cut = body[: body.index(b"--b0und4ry", 20) + 300]  # the first part whole, the second cut
    script.routes["GET", first] = lambda req: (status, headers, [cut])
    seen: list[tuple[int, int | None]] = []
    got = client.retrieve(match_of(study), tmp_path / "w", lambda d, t: seen.append((d, t)))
    assert got.n_files == 3, got  # 1 of the cut series, 2 of the other
    assert len(got.failed) == 1 and "cut or malformed" in got.failed[0]
    assert "before the closing boundary" in got.failed[0]
    assert not list((tmp_path / "w").glob(".*"))  # nothing half written stays
    assert seen[-1] == (3, 4)


def test_a_wado_answer_of_another_type_is_a_failed_series(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    client, script = web
    paths = serve_study(script, study)
    first = next(iter(paths.values()))
    script.routes["GET", first] = lambda req: (200, {"Content-Type": "text/html"}, [b"<login>"])
    got = client.retrieve(match_of(study), tmp_path / "w")
    assert got.n_files == 2 and len(got.failed) == 1 and "text/html" in got.failed[0]


def test_a_wado_series_is_retried_on_503(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    client, script = web
    paths = serve_study(script, study)
    first = next(iter(paths.values()))
    ok, tries = script.routes["GET", first], []
    script.routes["GET", first] = lambda req: (
        ok(req) if tries.append(1) or len(tries) > 1 else js([], 503)
    )
    got = client.retrieve(match_of(study), tmp_path / "w")
    assert got.n_files == 4 and not got.failed and len(tries) == 2


def test_a_series_of_another_patient_is_not_asked_for(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path
) -> None:
    client, script = web
    paths = serve_study(script, study)
    other = next(iter(paths))
    items = [
        {"0020000E": {"vr": "UI", "Value": [s]}, "00100020": {"vr": "LO",
         "Value": ["P2" if s == other else "P1"]}} for s in paths
    ]  # fmt: skip
    script.routes["GET", f"/dw/studies/{study.study_uid}/series"] = lambda req: js(items)
    got = client.retrieve(match_of(study), tmp_path / "w")
    assert got.n_files == 2 and not script.calls(paths[other])


# ----------------------------------------------------------------- STOW-RS and auth


def stow_answer(ok: list[str], bad: dict[str, int], status: int) -> Callable[[Request], Answer]:
    data = {
        "00081199": {"vr": "SQ", "Value": [{"00081155": {"vr": "UI", "Value": [u]}} for u in ok]},
        "00081198": {"vr": "SQ", "Value": [
            {"00081155": {"vr": "UI", "Value": [u]}, "00081197": {"vr": "US", "Value": [c]}}
            for u, c in bad.items()]},
    }  # fmt: skip
    return lambda req: js(data, status)


def _objects(tmp_path: Path, n: int) -> list[pydicom.Dataset]:
    out = []
    for f in make_study(tmp_path, ("T1",), n_slices=n).files:
        ds = pydicom.dcmread(f)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        out.append(ds)
    return out


def test_stow_202_with_failures_gives_one_result_per_object(
    web: tuple[DicomwebClient, Script], tmp_path: Path
) -> None:
    client, script = web
    a, b, c = _objects(tmp_path, 3)
    script.routes["POST", "/dw/studies"] = stow_answer(
        [a.SOPInstanceUID], {b.SOPInstanceUID: 0xA700}, 202
    )
    res = client.store([a, b, c])
    assert [r.stored for r in res] == [True, False, False]
    assert "0xA700" in res[1].detail and "not in the STOW-RS answer" in res[2].detail
    (post,) = script.calls("/dw/studies")
    assert post.headers["content-type"].startswith('multipart/related; type="application/dicom"')
    assert post.body.count(b"Content-Type: application/dicom\r\n") == 3
    script.routes["POST", "/dw/studies"] = stow_answer([], {a.SOPInstanceUID: 0x0111}, 409)
    (r409,) = client.store([a])
    assert not r409.stored and "0x0111" in r409.detail


def test_a_bearer_token_is_sent(server: tuple[str, Script], monkeypatch) -> None:
    url, script = server
    script.requests.clear()
    script.routes["GET", "/dw/studies"] = lambda req: js([])
    monkeypatch.setenv("TEST_PACS_TOKEN", "t0k3n")
    cfg = DicomwebPacs(kind="dicomweb", url=url, token_env="TEST_PACS_TOKEN")
    DicomwebClient("tok", cfg).find_studies(StudyQuery(patient_ids=["P1"]))
    assert script.requests[-1].headers["authorization"] == "Bearer t0k3n"


def test_a_named_credential_that_is_not_set_is_said(server: tuple[str, Script], monkeypatch):
    url, _ = server
    monkeypatch.delenv("TEST_PACS_TOKEN", raising=False)
    with pytest.raises(PacsConfigError, match="TEST_PACS_TOKEN is not set"):
        DicomwebClient("tok", DicomwebPacs(kind="dicomweb", url=url, token_env="TEST_PACS_TOKEN"))


def test_a_long_uid_list_is_asked_in_batches_short_urls(web: tuple[DicomwebClient, Script]):
    client, script = web
    uids = [f"1.2.826.0.1.3680043.8.498.{10**30 + i}" for i in range(200)]  # 12 KB joined

    def answer(req: Request) -> Answer:
        asked = dict(req.params)["StudyInstanceUID"]
        if len(asked) > 4096:  # what a proxy with 4-8 KB header buffers answers
            return 414, {}, [b"URI Too Long"]
        return js([study_item(0, uid=u) for u in asked.split(",")])

    script.routes["GET", "/dw/studies"] = answer
    found = client.find_studies(StudyQuery(study_uids=uids))
    assert sorted(m.study_uid for m in found) == sorted(uids)
    assert all(len(dict(r.params)["StudyInstanceUID"]) <= 1800 for r in script.requests)


def test_stow_warnings_and_refusals_are_said_plainly(
    web: tuple[DicomwebClient, Script], tmp_path: Path
) -> None:
    client, script = web
    (a,) = _objects(tmp_path, 1)
    ref = {"00081155": {"vr": "UI", "Value": [a.SOPInstanceUID]},
           "00081196": {"vr": "US", "Value": [0xB000]}}  # fmt: skip
    script.routes["POST", "/dw/studies"] = lambda req: js({"00081199": {"Value": [ref]}}, 202)
    (r,) = client.store([a])
    assert r.stored and r.detail == "stored with warning 0xB000"
    hostile = b"<html>\x1b[31mbad\x00 request" + b"x" * 5000
    script.routes["POST", "/dw/studies"] = lambda req: (400, {"Content-Type": "text/html"},
                                                        [hostile])  # fmt: skip
    (r,) = client.store([a])
    assert not r.stored and r.detail.startswith("STOW-RS: HTTP 400 <html>")
    assert "\x1b" not in r.detail and "\x00" not in r.detail and len(r.detail) < 260


def test_a_redirect_is_not_followed_and_is_said(web: tuple[DicomwebClient, Script]) -> None:
    client, script = web
    script.routes["GET", "/dw/studies"] = lambda req: (
        302,
        {"Location": "https://sso.hospital.example/login"},
        [b""],
    )
    with pytest.raises(PacsRequestError, match=r"redirected to 'https://sso\.hospital\.example"):
        client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert len(script.requests) == 1


@pytest.mark.parametrize("token", ["s3cret\r\nX-Injected: 1", "s3cret\n", "s3cr\u00e9t", "s3 cret"])
def test_a_token_that_cannot_be_a_header_is_refused_without_showing_it(
    server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    # was: an error quoting the header (the secret) into logs, or a UnicodeEncodeError
    url, _ = server
    monkeypatch.setenv("TEST_PACS_TOKEN", token)
    with pytest.raises(PacsConfigError, match="TEST_PACS_TOKEN") as err:
        c = DicomwebClient(
            "tok", DicomwebPacs(kind="dicomweb", url=url, token_env="TEST_PACS_TOKEN")
        )
        c.find_studies(StudyQuery(patient_ids=["P1"]))
    assert "s3" not in str(err.value)


def test_objects_built_in_memory_are_stored_and_an_unusable_one_is_a_result(
    web: tuple[DicomwebClient, Script], tmp_path: Path
) -> None:
    # was: a dataset without file meta (an SR built in memory) raised ValueError out of store()
    client, script = web
    a, b = _objects(tmp_path, 2)
    del a.file_meta  # as a dataset built in memory has none
    broken = pydicom.Dataset()
    broken.SOPInstanceUID = generate_uid()  # no SOPClassUID: cannot be a DICOM file
    script.routes["POST", "/dw/studies"] = stow_answer(
        [a.SOPInstanceUID, b.SOPInstanceUID], {}, 200
    )
    res = client.store([a, broken, b])
    assert [r.stored for r in res] == [True, False, True]
    assert res[1].sop_instance_uid == broken.SOPInstanceUID and "not sent" in res[1].detail
    assert not hasattr(a, "file_meta") or "TransferSyntaxUID" not in a.file_meta  # unchanged
    (post,) = script.calls("/dw/studies")
    assert post.body.count(b"Content-Type: application/dicom\r\n") == 2
    assert b"1.2.840.10008.1.2.1" in post.body  # written as Explicit VR Little Endian


def test_every_value_of_a_study_answer_is_bounded_printable_text(
    web: tuple[DicomwebClient, Script],
) -> None:
    # was: ModalitiesInStudy taken as it came (escape sequences into the cohort's table)
    client, script = web
    item = study_item(1) | {
        "00080061": {"vr": "CS", "Value": ["MR\x1b]0;pwned\x07", {"x": 1}, "CT" * 40, None]},
        "00100010": {"vr": "PN", "Value": [{"Alphabetic": "Doe^\x1b[2JJohn" + "x" * 900}]},
        "00201208": {"vr": "IS", "Value": ["12\n"]},
        "00201206": {"vr": "IS", "Value": [{"nested": "no"}]},
    }
    script.routes["GET", "/dw/studies"] = lambda req: js([item])
    (m,) = client.find_studies(StudyQuery(patient_ids=["P1"]))
    shown = [*m.modalities, m.patient_name]
    assert all(s.isprintable() for s in shown), shown
    assert m.modalities == ["CT" * 8, "MR]0;pwned"] and len(m.patient_name) <= 256
    assert m.n_instances == 12 and m.n_series is None


def test_one_uid_and_patient_id_under_two_issuers_are_two_studies(
    web: tuple[DicomwebClient, Script],
) -> None:
    client, script = web
    uid = "1.2.826.0.1.3680043.99.7"
    items = [
        study_item(7, uid=uid) | {"00100021": {"vr": "LO", "Value": [issuer]}}
        for issuer in ("HOSP-A", "HOSP-B")
    ]
    script.routes["GET", "/dw/studies"] = lambda req: js(items)
    found = client.find_studies(StudyQuery(patient_ids=["P1"]))
    assert sorted(m.issuer for m in found) == ["HOSP-A", "HOSP-B"]


def test_paging_tells_long_answers_apart(
    web: tuple[DicomwebClient, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    # items alike in their first kilobytes (a long value sorted before the UID) are not "the
    # same page again": paging went on only while a page brought something new
    client, script = web
    monkeypatch.setattr(dw, "PAGE", 5)
    items = [study_item(i) | {"00080005": {"vr": "CS", "Value": ["ISO_IR 192" * 600]}}
             for i in range(8)]  # fmt: skip
    script.routes["GET", "/dw/studies"] = paged(items, cap=5, warn=False)
    assert len(client.find_studies(StudyQuery(patient_ids=["P1"]))) == 8


def test_an_endless_wado_answer_is_stopped_and_nothing_of_it_kept(
    web: tuple[DicomwebClient, Script], study: SynthStudy, tmp_path: Path, monkeypatch
) -> None:
    # was: no bound on a study (2 GB a part, 200 000 parts a series): a server streaming
    # parts without end filled the disk
    client, script = web
    serve_study(script, study)
    size = sum(f.stat().st_size for f in study.files)
    monkeypatch.setattr(dw, "MAX_STUDY_BYTES", size - 100)
    with pytest.raises(PacsRequestError, match=r"over \d+ bytes; stopped"):
        client.retrieve(match_of(study), tmp_path / "w")
    assert list((tmp_path / "w").iterdir()) == []
    monkeypatch.setattr(dw, "MAX_STUDY_BYTES", size + 100)
    assert client.retrieve(match_of(study), tmp_path / "w2").n_files == 4
