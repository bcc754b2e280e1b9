"""The web DICOM viewer in a real browser (Debian's Chromium, headless, driven by Playwright)
against `neurosandbox serve` and the session's real Orthanc holding a phantom study: the link
the review page gives for a montage tile opens OHIF through the gateway on that slice, pixels
render, the reviewer scrolls through the series; without a reviewer session the same link
lands on the sign-in page and no image is shown. The screenshot goes to docs/screenshots/."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
import pytest
from browser import CHROMIUM, launch, sign_in
from gateway_process import Gateway, running_gateway
from orthanc_fixture import OrthancServer
from phantom_fixture import PhantomSuite
from phantom_fixture import Study as PhantomStudy
from viewer_fixture import StoredStudy, centre_std, needs_viewer, read_series, stored

from dicom import RenderOptions, render_path
from evaluation.case import TaskFamily
from gateway.auth import Role, TokenStore
from gateway.orthanc import OrthancClient
from gateway.routing import Route
from gateway.settings import Settings
from gateway.sr import encode
from gateway.study_run import DefaultEvaluator
from gateway.viewer import viewer_open_url, viewer_url
from gateway.writeback import build_unverified

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(240)]
playwright = pytest.importorskip("playwright.sync_api")
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
SCREENSHOTS = ROOT / "docs" / "screenshots"
TIMEOUT_MS = 60_000


@dataclass
class Site:
    gw: Gateway
    study: StoredStudy
    link: str  # what the review page links to for one montage tile
    tile_z: float


def orthanc_server_client(server: OrthancServer) -> OrthancClient:
    ep = server.endpoints
    return OrthancClient(ep.orthanc_url, ep.username, server.password, timeout_s=60)


@pytest.fixture(scope="module")
def site(
    orthanc_server: OrthancServer,
    phantom_suite: PhantomSuite,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    needs_viewer()
    tmp = tmp_path_factory.mktemp("viewer-browser")
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    reviewer = tokens.create(Role.REVIEWER, "Dr Scroll", "Scroll^Sam")[1]
    admin = tokens.create(Role.ADMIN, "ops")[1]
    # The AI SR series is one per study (gateway.sr.series_uid_for): a copy of this study left
    # in the session's Orthanc by an earlier module (tests/test_review_verified_e2e.py) holds
    # another model's SR, without points, in the series the SR test opens, and OHIF then shows
    # whichever SR of the series comes first: a black viewport in CI. The study starts clean.
    orthanc = orthanc_server_client(orthanc_server)
    left = orthanc.find_study(read_series(phantom_suite.case_dir("gbm")).study_uid)
    if left is not None:
        orthanc.api.delete(f"{orthanc.url}/studies/{left}")
    orthanc.close()
    with (
        running_gateway(orthanc_server, tmp / "serve.log", reviewer, admin) as gw,
        stored(gw.orthanc, phantom_suite.case_dir("gbm")) as study,
    ):
        # A tile of the montage dicom renders for this series (what the model saw), off-centre.
        manifest = render_path(study.series_dir, tmp / "render", RenderOptions(),
                               series_uid=study.series_uid)  # fmt: skip
        montage = next(i for i in manifest.images if i.kind == "montage")
        z = montage.slice_positions_mm[len(montage.slice_positions_mm) // 3]
        link = gw.api + viewer_open_url(study.study_uid, study.series_uid, z, "axial")
        yield Site(gw, study, link, z)


@pytest.fixture(scope="module")
def chromium(site: Site) -> Iterator[Callable[..., object]]:
    """Headless Chromium, launched once per set of extra flags."""
    with playwright.sync_playwright() as p:
        launched: dict[tuple[str, ...], object] = {}

        def launched_with(*extra: str) -> object:
            if extra not in launched:
                launched[extra] = launch(p, *extra)
            return launched[extra]

        try:
            yield launched_with
        finally:
            for b in launched.values():
                b.close()  # type: ignore[attr-defined]


def _page(browser: object, console: list[str]):  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    return ctx, page


def _instance_number(page) -> int:  # type: ignore[no-untyped-def]
    """The instance number OHIF's viewport overlay shows ("I:11 (16/26)")."""
    label = page.get_by_text(re.compile(r"^I:$")).first.locator("xpath=..")
    match = re.match(r"I:\s*(\d+)", label.inner_text())
    assert match, label.inner_text()
    return int(match.group(1))


def _failed_dicomweb(page) -> list[str]:  # type: ignore[no-untyped-def]
    """The page's DICOMweb reads that failed (HTTP status >= 400, or no answer other than OHIF
    cancelling the request), as they come; metadata reads are marked 'metadata'."""
    failed: list[str] = []

    def note(what: str, url: str) -> None:
        if "/dicom-web/" in url and "ERR_ABORTED" not in what:
            failed.append(f"{'metadata ' if url.endswith('/metadata') else ''}{what} {url}")

    page.on("response", lambda r: note(str(r.status), r.url) if r.status >= 400 else None)
    page.on("requestfailed", lambda r: note(str(r.failure), r.url))
    return failed


def _viewport_image(page, console: list[str], failed: list[str], gw: Gateway, name: str) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    """Wait for the image viewport's own canvas. Not any ``canvas.cornerstone-canvas``: while
    OHIF renders a series' thumbnail it adds a hidden 256 x 256 one to the page (Cornerstone's
    renderToCanvasGPU), so a viewport that never mounts read as 'the canvas stays hidden'.
    OHIF never retries a failed metadata read (the SR's viewport then stays empty for good),
    so a failed metadata read ends the wait at once. On failure the screenshot, the DOM and
    the console go to tests/artifacts/<name>-failed.*, and the message names the reads that
    failed and the gateway's answers other than 200."""
    canvas = page.locator("[data-cy='viewport-pane'] canvas.cornerstone-canvas").first
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while time.monotonic() < deadline and not any(f.startswith("metadata") for f in failed):
        try:
            canvas.wait_for(timeout=1000)
            return
        except playwright.TimeoutError:
            pass
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-failed.png"))
    (ARTIFACTS / f"{name}-failed.html").write_text(page.content(), encoding="utf-8")
    (ARTIFACTS / f"{name}-failed.console.txt").write_text("\n".join(console), encoding="utf-8")
    answers = [line for line in gw.log.read_text(errors="replace").splitlines()
               if "gateway.api: GET" in line and "-> 200 " not in line]  # fmt: skip
    errors = [m for m in console if m.startswith(("error", "pageerror"))]
    why = "a metadata read failed" if deadline > time.monotonic() else f"{TIMEOUT_MS // 1000} s"
    pytest.fail(
        f"OHIF showed no image in its viewport ({why}); failed reads: {failed[:10]}; "
        f"gateway answers other than 200: {answers[-10:]}; console errors: {errors[-10:]}; "
        f"see tests/artifacts/{name}-failed.*"
    )


def test_without_a_session_the_link_lands_on_sign_in_and_shows_no_image(chromium, site: Site) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    console: list[str] = []
    ctx, page = _page(chromium(), console)
    try:
        page.goto(site.link)
        assert page.url == f"{site.gw.api}/review/login"
        assert page.locator("canvas").count() == 0
        # The browser context's own requests (its cookies, none of them a session).
        metadata = f"{site.gw.api}/review/viewer/dicom-web/studies/{site.study.study_uid}/metadata"
        assert page.request.get(metadata).status == 401
        page.goto(f"{site.gw.api}/review/viewer/viewer?StudyInstanceUIDs={site.study.study_uid}")
        assert page.url == f"{site.gw.api}/review/login"
    finally:
        ctx.close()


# Headless Chromium usually has WebGL (SwiftShader); without it Cornerstone renders on the CPU.
@pytest.mark.parametrize("webgl", [True, False], ids=["webgl", "no-webgl"])
def test_a_reviewer_opens_the_tiles_slice_and_scrolls_the_series(chromium, site: Site, webgl: bool) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    console: list[str] = []
    ctx, page = _page(chromium() if webgl else chromium("--disable-3d-apis"), console)
    failed = _failed_dicomweb(page)
    t0 = time.monotonic()
    try:
        sign_in(page, site.gw.api, site.gw.reviewer)
        page.goto(site.link)
        page.wait_for_url(re.compile(r"/review/viewer/viewer\?"))
        _viewport_image(page, console, failed, site.gw, "viewer-" + ("gpu" if webgl else "cpu"))
        page.get_by_text(re.compile(r"^I:$")).first.wait_for()
        # The slice the tile names (nearest position, read from the files), not the middle one.
        expected = site.study.nearest(site.tile_z)
        assert expected.number != site.study.slices[len(site.study.slices) // 2].number
        deadline = time.monotonic() + 30
        while centre_std(page) < 20 and time.monotonic() < deadline:
            time.sleep(0.25)  # frames still arriving / rendering
        spread = centre_std(page)
        assert spread >= 20, f"the viewport's centre is uniform (std {spread:.1f})"
        assert _instance_number(page) == expected.number
        loaded_s = time.monotonic() - t0
        rendering = "GPU" if webgl else "CPU"
        assert any(f"using {rendering} rendering" in m for m in console), console
        name = "viewer.png" if webgl else "viewer-cpu.png"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / name))
        if webgl:  # the README's picture
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ARTIFACTS / name, SCREENSHOTS / name)
        # Scrolling moves through the series (the point of a viewer next to the montages).
        box = page.locator("canvas.cornerstone-canvas").first.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        for _ in range(3):
            page.mouse.wheel(0, 120)
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while _instance_number(page) == expected.number and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _instance_number(page) != expected.number
        assert centre_std(page) >= 20
        csp = [m for m in console if "Content Security Policy" in m or "Refused to" in m]
        assert not csp, csp
        assert not [m for m in console if m.startswith("pageerror")], console
        assert loaded_s < 60
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def model_sr(site: Site, tmp_path_factory: pytest.TempPathFactory) -> pydicom.Dataset:
    """The UNVERIFIED SR the gateway writes back for reference/image-rules on the phantom's T2
    (DefaultEvaluator, build_unverified), stored in Orthanc with the study."""
    tmp = tmp_path_factory.mktemp("model-sr")
    case_dicom = site.study.series_dir.parent
    route = Route(rule="viewer", models=["reference/image-rules"], tasks=[TaskFamily.LESION],
                  series_classes=["T2"])  # fmt: skip

    def evaluate() -> pydicom.Dataset:  # in a thread: Playwright's loop may run in this one
        run = (
            DefaultEvaluator(Settings(data_dir=tmp))
            .evaluate(case_dicom, route, tmp / "runs" / ("0" * 32))
            .run
        )
        files = sorted(p for p in case_dicom.rglob("*") if p.is_file())
        headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in files]
        return build_unverified(run, route.models, headers, 1, "v").srs["reference/image-rules"]

    with ThreadPoolExecutor(1) as pool:
        sr = pool.submit(evaluate).result()
    site.gw.orthanc.upload(encode(sr))  # removed with the study
    return sr


def _pointed(sr: pydicom.Dataset) -> list[tuple[str, pydicom.Dataset]]:
    """(finding site, SCOORD) of each measurement group of the SR that has a point, in order."""
    out = []
    for group in sr.ContentSequence[-1].ContentSequence:  # Imaging Measurements' groups
        items = list(group.get("ContentSequence", []))
        scoord = next((it for it in items if it.ValueType == "SCOORD"), None)
        site = next(it for it in items if it.ConceptNameCodeSequence[0].CodeValue == "363698007")
        if scoord is not None:
            out.append((str(site.ConceptCodeSequence[0].CodeMeaning), scoord))
    return out


def _ras(header: pydicom.Dataset, col: float, row: float) -> np.ndarray:
    """The patient position (RAS mm) of SCOORD image coordinates on ``header``'s slice."""
    iop = np.array(header.ImageOrientationPatient, float)
    dr, dc = (float(v) for v in header.PixelSpacing)  # row spacing, column spacing
    lps = (np.array(header.ImagePositionPatient, float)
           + iop[:3] * dc * (col - 0.5) + iop[3:] * dr * (row - 0.5))  # fmt: skip
    return lps * np.array([-1.0, -1.0, 1.0])


def test_the_models_sr_shows_its_finding_on_the_slice(chromium, site: Site, model_sr: pydicom.Dataset, phantom_suite: PhantomSuite) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    """The study opened in OHIF at the model's SR: its measurements panel lists the pointed
    findings, and the row of the finding on the glioblastoma opens the slice the SR names
    with the point drawn there (OHIF's SR display draws a TID 1500 group's SCOORD)."""
    # What the SR says, read here from its tags: the first pointed finding (the mass) is in
    # the phantom's lesion mask on the slice it references.
    (site_name, scoord), *_ = _pointed(model_sr)
    uid = scoord.ContentSequence[0].ReferencedSOPSequence[0].ReferencedSOPInstanceUID
    (target,) = [s for s in site.study.slices if s.sop_uid == uid]
    header = pydicom.dcmread(
        next(p for p in site.study.series_dir.iterdir()
             if pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID == uid),
        stop_before_pixels=True,
    )  # fmt: skip
    phantom = PhantomStudy(phantom_suite.case_dir("gbm"))
    ok, vox = phantom.voxels(_ras(header, *map(float, scoord.GraphicData))[None, :])
    assert ok[0] and phantom.mask[tuple(vox[0])] > 0, "the SR's point is not on the lesion"
    expected_row = ["Lesion", site_name, f"S: {header.SeriesNumber} I: {target.number}"]
    console: list[str] = []
    ctx, page = _page(chromium(), console)
    failed = _failed_dicomweb(page)
    try:
        sign_in(page, site.gw.api, site.gw.reviewer)
        page.goto(site.gw.api + viewer_url(site.study.study_uid, str(model_sr.SeriesInstanceUID),
                                           whole_study=True))  # fmt: skip
        _viewport_image(page, console, failed, site.gw, "viewer-sr-point")
        page.locator("[data-cy='side-panel-header-right']").first.click()
        page.locator("[data-cy='trackedMeasurements-btn']").first.click()
        rows = page.locator("[data-cy^='measurement-table-row-']")
        rows.first.wait_for()
        texts = [" ".join(r.inner_text().split()) for r in rows.all()]
        assert len(texts) == len(_pointed(model_sr)), texts  # one row per pointed finding
        row = rows.first
        assert all(part in texts[0] for part in expected_row), (texts[0], expected_row)
        row.locator("[data-cy='data-row-title']").click()  # jump to the finding
        deadline = time.monotonic() + 20
        while _instance_number(page) != target.number and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _instance_number(page) == target.number
        # the point drawn on the slice: Cornerstone's annotation layer holds its marker
        marker = page.locator("[data-cy='viewport-pane'] svg circle")
        marker.first.wait_for()
        while centre_std(page) < 20 and time.monotonic() < deadline:
            time.sleep(0.25)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "viewer-sr-point.png"))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACTS / "viewer-sr-point.png", SCREENSHOTS / "viewer-sr-point.png")
        assert not [m for m in console if m.startswith("pageerror")], console
        assert not failed, failed  # every DICOMweb read of the study was answered
    finally:
        ctx.close()
