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
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import CHROMIUM, launch, sign_in
from gateway_process import Gateway, running_gateway
from orthanc_fixture import OrthancServer
from phantom_fixture import PhantomSuite
from viewer_fixture import StoredStudy, centre_std, needs_viewer, stored

from dicom import RenderOptions, render_path
from gateway.auth import Role, TokenStore
from gateway.viewer import viewer_open_url

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
    t0 = time.monotonic()
    try:
        sign_in(page, site.gw.api, site.gw.reviewer)
        page.goto(site.link)
        page.wait_for_url(re.compile(r"/review/viewer/viewer\?"))
        page.locator("canvas.cornerstone-canvas").first.wait_for()
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
