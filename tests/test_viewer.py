"""The web DICOM viewer behind the gateway (OHIF under /review/viewer/): reviewers only, a
read-only DICOMweb proxy of the real Orthanc that never shows the browser Orthanc's password or
address, OHIF's files served under the review cookie's path, and links that open a series at
the slice a montage tile names (the tile's position from dicom's own renderer)."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pydicom
import pytest
from fastapi.testclient import TestClient
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from phantom_fixture import PhantomSuite
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from viewer_fixture import VIEWER_DIST, StoredStudy, needs_viewer, stored

from dicom import InvalidUIDError, RenderOptions, render_path
from gateway.api import GatewayContext, create_app
from gateway.audit import AuditLog
from gateway.auth import Role, TokenStore
from gateway.orthanc import OrthancClient, SeriesSummary
from gateway.pacs_local import free_port
from gateway.runs import StudyRunStore
from gateway.viewer import ViewerFiles, content_security_policy, viewer_open_url
from gateway.viewer_pacs import (
    VIEWER_UID_TTL_S,
    behind_gateway,
    dicomweb_read_path,
    instance_at,
    opening_series,
)

pytestmark = pytest.mark.integration
PAGE = {"Accept": "text/html,application/xhtml+xml"}


@dataclass
class Viewer:
    client: TestClient
    study: StoredStudy
    token: str
    data: Path
    secrets: list[str]  # what must never reach a browser
    seen: list[httpx.Response] = field(default_factory=list)

    def get(self, url: str, token: str | None = "", **kw: object) -> httpx.Response:
        headers = dict(kw.pop("headers", {}) or {})  # type: ignore[call-overload]
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        r = self.client.get(url, headers=headers, follow_redirects=False, **kw)  # type: ignore[arg-type]
        self.seen.append(r)
        return r


def _context(data: Path, orthanc: OrthancClient, server: OrthancServer, **update: object) -> GatewayContext:  # fmt: skip
    settings = server.settings.model_copy(update={"data_dir": data, **update})
    return GatewayContext(
        settings, orthanc, StudyRunStore(data), AuditLog(data / "audit.jsonl"),
        TokenStore(data / "secret" / "tokens.json"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def viewer(
    orthanc_server: OrthancServer,
    phantom_suite: PhantomSuite,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Viewer]:
    data = tmp_path_factory.mktemp("viewer-data")
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=30)
    ctx = _context(data, orthanc, orthanc_server)
    token = ctx.tokens.create(Role.REVIEWER, "Dr Viewer", "Viewer^Vera")[1]
    basic = base64.b64encode(f"{ep.username}:{orthanc_server.password}".encode()).decode()
    secrets = [orthanc_server.password, basic, ep.orthanc_url, f":{urlsplit(ep.orthanc_url).port}"]
    with stored(orthanc, phantom_suite.case_dir("gbm")) as study, TestClient(create_app(ctx)) as client:  # fmt: skip
        yield Viewer(client, study, token, data, secrets)
    orthanc.close()


def _dicomweb(v: Viewer, tail: str) -> str:
    return f"/review/viewer/dicom-web/studies/{v.study.study_uid}{tail}"


def _audit(v: Viewer) -> list[dict[str, str]]:
    path = v.data / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------------------ who may


def test_without_a_reviewer_pages_go_to_sign_in_and_everything_else_is_refused(viewer: Viewer) -> None:  # fmt: skip
    v, st = viewer, viewer.study
    open_url = viewer_open_url(st.study_uid, st.series_uid)
    for url in (open_url, "/review/viewer/viewer?StudyInstanceUIDs=1.2"):
        r = v.get(url, token=None, headers=PAGE)
        assert r.status_code == 303 and r.headers["location"] == "/review/login", url
    for url in (open_url, "/review/viewer/app-config.js", "/review/viewer/app.bundle.css",
                _dicomweb(v, "/series"), "/review/viewer/dicom-web/studies"):  # fmt: skip
        r = v.get(url, token=None)
        assert r.status_code == 401, url
        assert "DICM" not in r.text and "0020000D" not in r.text
    rec, revoked = v.client.app.state.ctx.tokens.create(Role.REVIEWER, "Dr Gone")  # type: ignore[attr-defined]
    assert v.get("/review/viewer/dicom-web/studies", token=revoked).status_code == 200
    v.client.app.state.ctx.tokens.revoke(rec.id)  # type: ignore[attr-defined]
    assert v.get("/review/viewer/dicom-web/studies", token=revoked).status_code == 401


def test_a_signed_in_browser_session_reaches_the_viewer(viewer: Viewer) -> None:
    v = viewer
    with TestClient(v.client.app) as browser:
        form = browser.get("/review/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        r = browser.post("/review/login", data={"token": v.token, "csrf": csrf.group(1)},
                         follow_redirects=False)  # fmt: skip
        assert r.status_code == 303
        qido = browser.get("/review/viewer/dicom-web/studies", params={"StudyInstanceUID": v.study.study_uid})  # fmt: skip
        assert qido.status_code == 200 and len(qido.json()) == 1
        v.seen.append(qido)


# ------------------------------------------------------------------------------ the proxy


def test_the_dicomweb_proxy_answers_qido_and_metadata_with_its_own_urls(viewer: Viewer) -> None:
    v, st = viewer, viewer.study
    r = v.get("/review/viewer/dicom-web/studies", params={"StudyInstanceUID": st.study_uid})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/dicom+json")
    (study,) = r.json()
    assert study["0020000D"]["Value"] == [st.study_uid]
    assert study["00081190"]["Value"] == [f"/review/viewer/dicom-web/studies/{st.study_uid}"]
    r = v.get(_dicomweb(v, "/series"), params={"SeriesInstanceUID": st.series_uid})
    assert [s["0020000E"]["Value"][0] for s in r.json()] == [st.series_uid]
    r = v.get(_dicomweb(v, f"/series/{st.series_uid}/metadata"))
    assert r.status_code == 200
    instances = r.json()
    assert sorted(i["00080018"]["Value"][0] for i in instances) == sorted(
        s.sop_uid for s in st.slices
    )
    bulk = [i["7FE00010"]["BulkDataURI"] for i in instances]
    assert all(b.startswith(_dicomweb(v, f"/series/{st.series_uid}/instances/")) for b in bulk)
    assert r.headers["cache-control"] == "no-store"


def test_frames_stream_through_the_proxy_as_multipart(viewer: Viewer) -> None:
    v, st = viewer, viewer.study
    sop = st.slices[0].sop_uid
    accept = "multipart/related; type=application/octet-stream; transfer-syntax=*"
    r = v.get(_dicomweb(v, f"/series/{st.series_uid}/instances/{sop}/frames/1"),
              headers={"Accept": accept})  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("multipart/related")
    assert len(r.content) > 256 * 256 * 2  # one 256x256 16-bit frame and the part headers
    bulk = v.get(_dicomweb(v, f"/series/{st.series_uid}/instances/{sop}/bulk/7fe00010"))
    assert bulk.status_code == 200 and len(bulk.content) > 256 * 256 * 2


def test_the_proxy_is_read_only_and_only_for_viewer_reads(viewer: Viewer) -> None:
    v, st = viewer, viewer.study
    headers = {"Authorization": f"Bearer {v.token}"}
    for method in ("POST", "DELETE", "PUT", "PATCH"):
        for url in ("/review/viewer/dicom-web/studies", _dicomweb(v, "")):
            r = v.client.request(method, url, headers=headers, content=b"x")
            v.seen.append(r)
            assert r.status_code == 405 and r.headers["allow"] == "GET", (method, url)
    orthanc = v.client.app.state.ctx.orthanc  # type: ignore[attr-defined]
    assert orthanc.find_study(st.study_uid) is not None  # the DELETE did nothing
    for tail in ("", f"/series/{st.series_uid}", "/series/1.2/instances/x"):
        assert v.get(_dicomweb(v, tail)).status_code == 404, tail  # whole-study/series archives
    for path in ("system", "tools/lookup", "instances", "studies/%2e%2e/%2e%2e/system", "wado"):
        assert v.get(f"/review/viewer/dicom-web/{path}").status_code == 404, path
    # HTTP clients resolve dot segments before sending; a raw path must not get through either.
    for raw in ("studies/1.2/rendered/../../../../system", "studies/1.2/../../tools/lookup",
                "studies/1.2/series/1.3/instances/1.4/frames/1/../../../../../../../system"):  # fmt: skip
        assert not dicomweb_read_path(raw), raw


def test_orthanc_down_is_a_clear_502(viewer: Viewer, orthanc_server: OrthancServer) -> None:
    v, st = viewer, viewer.study
    dead = OrthancClient(f"http://127.0.0.1:{free_port()}", "neurosandbox", "x", timeout_s=5, retries=0)  # fmt: skip
    ctx = _context(v.data, dead, orthanc_server)
    with TestClient(create_app(ctx)) as client:
        headers = {"Authorization": f"Bearer {v.token}"}
        r = client.get("/review/viewer/dicom-web/studies", headers=headers)
        assert r.status_code == 502 and "did not answer" in r.json()["detail"]
        r = client.get(viewer_open_url(st.study_uid, st.series_uid), headers=headers)
        assert r.status_code == 502 and "did not answer" in r.text
        v.seen.extend([r])


# ------------------------------------------------------------------------------ opening a series


def test_open_goes_to_the_slice_a_montage_tile_names(viewer: Viewer, tmp_path: Path) -> None:
    v, st = viewer, viewer.study
    manifest = render_path(st.series_dir, tmp_path, RenderOptions(), series_uid=st.series_uid)
    montage = next(i for i in manifest.images if i.kind == "montage")
    assert montage.orientation.startswith("axial")
    for z in (montage.slice_positions_mm[1], montage.slice_positions_mm[-2]):
        r = v.get(viewer_open_url(st.study_uid, st.series_uid, z, "axial"))
        assert r.status_code == 303
        url = urlsplit(r.headers["location"])
        query = parse_qs(url.query)
        assert url.path == "/review/viewer/viewer"
        assert query["StudyInstanceUIDs"] == [st.study_uid]
        assert query["SeriesInstanceUIDs"] == query["initialSeriesInstanceUID"] == [st.series_uid]
        assert query["initialSOPInstanceUID"] == [st.nearest(z).sop_uid], z
    r = v.get(viewer_open_url(st.study_uid, st.series_uid))  # no position: the middle slice
    middle = st.slices[(len(st.slices) - 1) // 2]
    assert parse_qs(urlsplit(r.headers["location"]).query)["initialSOPInstanceUID"] == [middle.sop_uid]  # fmt: skip
    opened = [e for e in _audit(v) if e["action"] == "viewer open" and e["outcome"] == "ok"]
    series_id = v.client.app.state.ctx.orthanc.find_series(st.series_uid)  # type: ignore[attr-defined]
    assert len(opened) >= 3 and {e["target"] for e in opened} == {f"series={series_id}"}


def _tissue(paths: dict[str, Path]) -> dict[str, float]:
    """Per instance, the fraction of its pixels above a tenth of the series' maximum: ~0 in air."""
    pixels = {uid: pydicom.dcmread(p).pixel_array.astype(float) for uid, p in paths.items()}
    top = max(float(a.max()) for a in pixels.values())
    return {uid: float((a > 0.1 * top).mean()) for uid, a in pixels.items()}


def test_the_study_opens_on_a_slice_through_the_brain_with_every_series_loaded(viewer: Viewer) -> None:  # fmt: skip
    """ "Open the study" used to give OHIF the study alone: it showed its first series' first
    image, above the head. Now the gateway chooses the series and its middle slice."""
    v, st = viewer, viewer.study
    r = v.get(viewer_open_url(st.study_uid))
    assert r.status_code == 303
    query = parse_qs(urlsplit(r.headers["location"]).query)
    assert query["StudyInstanceUIDs"] == [st.study_uid]
    assert "SeriesInstanceUIDs" not in query  # the SR and PDF series are in the study panel too
    (series,) = query["initialSeriesInstanceUID"]
    (sop,) = query["initialSOPInstanceUID"]
    files = {}
    study_dir = next(p for p in st.series_dir.parents if p.name == "dicom")  # the case's files
    for path in sorted(study_dir.rglob("*")):
        if path.is_file():
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            if ds.SeriesInstanceUID == series:
                files[str(ds.SOPInstanceUID)] = (float(ds.ImagePositionPatient[2]), path)
    assert sop in files, "the opening instance is one of the chosen series"
    desc = pydicom.dcmread(files[sop][1], stop_before_pixels=True).SeriesDescription
    assert "loc" not in desc.lower()
    by_z = sorted(files, key=lambda u: files[u][0])
    tissue = _tissue({u: files[u][1] for u in by_z})
    assert min(tissue.values()) < 0.05  # the stack reaches above the head: a black slice exists
    assert tissue[sop] >= 0.8 * max(tissue.values()), (by_z.index(sop), tissue[sop], max(tissue.values()))  # fmt: skip
    r = v.get(f"/review/viewer/open?study={st.study_uid}9")  # no such study
    assert r.status_code == 404 and "no study with images" in r.text


def test_the_opening_series_is_an_anatomical_stack_never_a_localiser_or_a_document() -> None:
    def s(uid: str, cls: str, n: int, number: int | None = None) -> SeriesSummary:
        return SeriesSummary(orthanc_id=uid, series_uid=f"1.2.{uid}", series_number=number,
                             series_class=cls, n_instances=n)  # fmt: skip

    loc, sr, pdf = s("1", "LOCALIZER", 9, 1), s("2", "NON_IMAGE", 1, 9901), s("3", "NON_IMAGE", 1, 9902)  # fmt: skip
    dwi, t2, flair = s("4", "DWI", 75, 2), s("5", "T2", 25, 4), s("6", "FLAIR", 25, 5)
    assert opening_series([loc, sr, pdf, dwi, t2, flair]) == flair
    assert opening_series([loc, dwi, t2, s("7", "T2", 25, 3)]).series_uid == "1.2.7"  # type: ignore[union-attr]
    assert opening_series([loc, sr, s("8", "CT", 2, 2), s("9", "CT", 120, 3)]).series_uid == "1.2.9"  # type: ignore[union-attr]  # fmt: skip
    assert opening_series([loc, sr, s("10", "UNKNOWN", 40, 7)]).series_uid == "1.2.10"  # type: ignore[union-attr]  # fmt: skip
    assert opening_series([sr, pdf, loc]) is None


def _directives(csp: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (x.strip() for x in csp.split(";")) if d}


def test_the_viewer_may_embed_the_pdf_series_blob_and_no_other_page_may(viewer: Viewer) -> None:
    """OHIF shows an Encapsulated PDF as <object data="blob:..."> of bytes it read through the
    proxy: the viewer's policy allows blob: objects (nothing else); every other page, none."""
    needs_viewer()
    v = viewer
    page = _directives(v.get("/review/viewer/viewer?StudyInstanceUIDs=1.2", headers=PAGE).headers["content-security-policy"])  # fmt: skip
    assert page["object-src"] == ["blob:"]
    assert page["connect-src"] == ["'self'"]  # the PDF's bytes come through the proxy only
    assert "'unsafe-inline'" not in page["script-src"] and "blob:" not in page["script-src"]
    assert _directives(content_security_policy(()))["object-src"] == ["blob:"]
    elsewhere = [
        v.get("/review/login", token=None),
        v.get("/review", headers=PAGE),
        v.get(f"/review/viewer/open?study={v.study.study_uid}&series=1.2.3.4"),  # its error page
    ]
    for r in elsewhere:
        d = _directives(r.headers["content-security-policy"])
        assert d.get("object-src", d.get("default-src")) == ["'none'"], r.request.url


def test_open_refuses_what_is_not_a_series_of_the_pacs(viewer: Viewer) -> None:
    v, st = viewer, viewer.study
    r = v.get(f"/review/viewer/open?study={st.study_uid}&series=1.2.3.4")
    assert r.status_code == 404 and "no such series" in r.text
    assert v.get(f"/review/viewer/open?study={st.study_uid}&series=1.2;drop").status_code == 422
    assert v.get(f"/review/viewer/open?study={st.study_uid}&series={'1.' * 40}1").status_code == 422  # fmt: skip
    assert v.get(viewer_open_url(st.study_uid, st.series_uid) + "&z=nan").status_code == 422
    with pytest.raises(InvalidUIDError):
        viewer_open_url("1.2.3", "javascript:alert(1)")


def test_a_study_uid_the_pacs_holds_under_two_patients_is_not_shown(
    viewer: Viewer, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """OHIF finds a study by its StudyInstanceUID alone: when the PACS holds the UID under two
    patients, every read of it (and the gateway's open link) is refused, saying why, rather
    than showing one patient's images under the other's study or both together."""
    v, uid = viewer, generate_uid()
    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=2, patient_id="NSBX-VIEW-A",
                   study_uid=uid)  # fmt: skip
    b = make_study(tmp_path / "b", classes=("T2",), n_slices=2, patient_id="NSBX-VIEW-B",
                   study_uid=uid)  # fmt: skip
    ep = orthanc_server.endpoints
    pacs = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=30)
    root = f"/review/viewer/dicom-web/studies/{uid}"
    reads = [
        f"{root}/series",
        f"{root}/metadata",
        f"{root}/series/{a.series_uids['FLAIR']}/metadata",
    ]
    try:
        pacs.upload_many(a.files)
        assert [v.get(r).status_code for r in reads] == [200, 200, 200]  # one patient: shown
        pacs.upload_many(b.files)  # the same UID, another patient
        time.sleep(VIEWER_UID_TTL_S)  # what the proxy remembered of the UID has lapsed
        for r in reads:
            got = v.get(r)
            assert got.status_code == 409 and "more than one patient" in got.json()["detail"], r
        page = v.get(f"/review/viewer/open?study={uid}", headers=PAGE)
        assert page.status_code == 409 and "more than one patient" in page.text
        page = v.get(f"/review/viewer/open?study={uid}&series={a.series_uids['FLAIR']}")
        assert page.status_code == 409
        # a search lists each patient's study apart: that mixes nothing
        found = v.get("/review/viewer/dicom-web/studies", params={"StudyInstanceUID": uid})
        assert found.status_code == 200 and len(found.json()) == 2
    finally:
        for sid in pacs.studies_with_uid(uid):
            pacs.api.delete(f"{pacs.url}/studies/{sid}")
        pacs.close()


def test_orthanc_urls_are_moved_behind_the_gateway_across_chunk_boundaries() -> None:
    orthanc = "http://10.0.0.7:8042/dicom-web/studies/1.2/series/1.3/instances/1.4"
    body = (
        b"--b\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Location: {orthanc}/frames/1\r\n\r\n".encode()
        + bytes(range(256)) * 8
        + f'\r\n--b\r\n{{"00081190": {{"Value": ["{orthanc}"]}},'.encode()
        + b' "7FE00010": {"BulkDataURI": "https://pacs.example/orthanc/dicom-web/studies/1.2/bulk"}}'
        + b"\r\n--b--"
    )
    expected = body.replace(
        b"http://10.0.0.7:8042/dicom-web/", b"/review/viewer/dicom-web/"
    ).replace(b"https://pacs.example/orthanc/dicom-web/", b"/review/viewer/dicom-web/")
    assert expected.count(b"/review/viewer/dicom-web/") == 3 and b"10.0.0.7" not in expected
    for size in (1, 7, 100, 799, 800, 801, 1500, len(body)):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        assert b"".join(behind_gateway(iter(chunks))) == expected, size


def _slice(sop: str, number: int, ipp: list[float], iop: list[float]) -> Dataset:
    ds = Dataset()
    ds.SOPInstanceUID, ds.InstanceNumber, ds.Rows, ds.Columns = sop, number, 64, 64
    ds.ImagePositionPatient, ds.ImageOrientationPatient, ds.PixelSpacing = ipp, iop, [2.0, 2.0]
    return ds


def test_instance_at_follows_the_renderers_rule_for_sagittal_and_resliced_tiles() -> None:
    sagittal = [0.0, 1.0, 0.0, 0.0, 0.0, -1.0]  # rows along A, columns toward I: normal along L
    # LPS x = 10 * k: the slice centres are at R = -10 * k in RAS (the renderer's coordinate)
    series = [_slice(f"1.2.{k}", k + 1, [10.0 * k, -60.0, 60.0], sagittal) for k in range(7)]
    assert instance_at(series, -31.0, "sagittal") == "1.2.3"
    assert instance_at(series, -31.0) == "1.2.3"  # no plane: the series' own axis
    assert instance_at(series, 29.0, "sagittal") == "1.2.0"  # beyond the ends: the nearest end
    assert instance_at(series, -31.0, "axial") == "1.2.3"  # a resliced tile: the middle slice
    assert instance_at(series) == "1.2.3"
    no_geometry = [Dataset() for _ in range(5)]
    for k, ds in enumerate(no_geometry):
        ds.SOPInstanceUID, ds.InstanceNumber, ds.Rows = f"1.3.{k}", 5 - k, 8
    assert instance_at(no_geometry, 12.0) == "1.3.2"
    with pytest.raises(LookupError):
        instance_at([])


# ------------------------------------------------------------------------------ OHIF's files


def test_ohif_is_served_under_the_review_path_with_its_own_config_and_csp(viewer: Viewer) -> None:
    needs_viewer()
    v = viewer
    r = v.get("/review/viewer/viewer?StudyInstanceUIDs=1.2", headers=PAGE)
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    html = r.text
    assert 'window.PUBLIC_URL="/review/viewer/"' in html and "init-service-worker" not in html
    assert not re.search(r'(src|href)="/(?!review/viewer/)', html)
    csp = r.headers["content-security-policy"]
    assert "connect-src 'self';" in csp and "frame-ancestors 'self'" in csp
    assert "'unsafe-eval'" not in csp and "'wasm-unsafe-eval'" in csp
    assert "script-src 'self' 'wasm-unsafe-eval' 'sha256-" in csp and "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]  # fmt: skip
    config = v.get("/review/viewer/app-config.js")
    assert config.headers["cache-control"] == "no-store"
    assert '"routerBasename": "/review/viewer"' in config.text
    assert '"showCPUFallbackMessage": false' in config.text
    assert 'window.location.origin + "/review/viewer/dicom-web"' in config.text
    # an SR measurement group without spatial coordinates is skipped, not a load failure
    assert "onBeforeSRAddMeasurement" in config.text and "m.coords = [{}]" in config.text
    assert "http" not in config.text.replace("httpErrorHandler", "")  # no external URL
    bundle = next(p.name for p in VIEWER_DIST.glob("app.bundle.*.js"))
    r = v.get(f"/review/viewer/{bundle}")
    assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
    assert b'__webpack_require__.p = "/review/viewer/";' in r.content
    assert b'__webpack_require__.p = "/";' not in r.content
    css = v.get("/review/viewer/app.bundle.css")
    assert "url(/review/viewer/" in css.text and "url(/a" not in css.text
    wasm = next(p.name for p in VIEWER_DIST.glob("*.wasm"))
    assert v.get(f"/review/viewer/{wasm}").headers["content-type"] == "application/wasm"
    for withheld in ("sw.js", "init-service-worker.js", "serve.json", "_headers", "index.html",
                     "google.js", "%2e%2e/package.json", ".hidden"):  # fmt: skip
        assert v.get(f"/review/viewer/{withheld}").status_code == 404, withheld
    files = ViewerFiles(VIEWER_DIST)
    for raw in ("../package.json", "assets/../../package.json", "./index.html", "assets",
                "assets//favicon.ico", "/etc/passwd", "assets\\..\\..\\package.json", "a\x00b"):  # fmt: skip
        assert files.asset(raw) is None, raw
    assert files.asset("assets/favicon.ico") is not None


def test_static_files_are_not_audited_one_by_one(viewer: Viewer) -> None:
    needs_viewer()
    v = viewer
    before = len(_audit(v))
    v.get("/review/viewer/app.bundle.css")
    v.get("/review/viewer/dicom-web/studies")
    assert len(_audit(v)) == before
    v.get("/review/viewer/app.bundle.css", token=None)  # a refusal is audited
    assert _audit(v)[-1]["outcome"] == "401"


def test_without_ohif_installed_the_viewer_says_run_make_setup(viewer: Viewer, orthanc_server: OrthancServer) -> None:  # fmt: skip
    v = viewer
    orthanc = v.client.app.state.ctx.orthanc  # type: ignore[attr-defined]
    ctx = _context(v.data, orthanc, orthanc_server, viewer_dir=v.data / "no-ohif")
    with TestClient(create_app(ctx)) as client:
        r = client.get("/review/viewer/viewer", headers={"Authorization": f"Bearer {v.token}"})
        assert r.status_code == 503 and "make setup" in r.text
        v.seen.append(r)


def test_the_orthanc_password_and_address_never_reach_the_browser(viewer: Viewer) -> None:
    """Every answer of this module's tests, and one of each kind of request besides."""
    v, st = viewer, viewer.study
    sop = st.slices[3].sop_uid
    instance = f"/series/{st.series_uid}/instances/{sop}"
    for tail in ("/series", f"/series/{st.series_uid}/instances", "/metadata", f"{instance}/metadata",
                 f"{instance}/frames/1", f"{instance}/frames/1,1", f"{instance}/bulk/7fe00010",
                 f"{instance}/rendered", f"{instance}/thumbnail", instance, "/nope"):  # fmt: skip
        v.get(_dicomweb(v, tail), headers={"Accept": "*/*"})
    v.get(viewer_open_url(st.study_uid, st.series_uid, 0.0))
    v.get("/review/viewer/viewer", headers=PAGE)
    v.get("/review/viewer/app-config.js")
    assert len(v.seen) >= 14
    for r in v.seen:
        text = r.content.decode("latin-1") + "\n".join(f"{k}: {x}" for k, x in r.headers.items())
        for secret in v.secrets:
            assert secret not in text, (r.request.url, secret[:6])
        assert "www-authenticate" not in r.headers or r.status_code == 401
