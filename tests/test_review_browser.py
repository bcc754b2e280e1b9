"""The review pages in a real browser (Debian's Chromium driven by Playwright): a reviewer
signs in, opens a case, corrects an item, overrides the error category, signs off, and the
run summary changes; hostile strings from DICOM, the record and a model show as text and
never run. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import CHROMIUM, launch, sign_in
from report_fixtures import BAD, XSS_MODEL, XSS_NOTE, XSS_SERIES, build_run
from review_server import running

from evaluation.reports.bundle import write_report
from gateway.auth import Role, TokenStore

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]
playwright = pytest.importorskip("playwright.sync_api")
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"


@dataclass
class Server:
    base: str
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    data = tmp_path_factory.mktemp("review-data")
    run = build_run(data / "src")
    write_report(run, data / "reports" / "test-run", pdf=False)
    store = TokenStore(data / "secret" / "tokens.json")
    people = {"Dr Ada": "Lovelace^Ada", "Dr Bo": "Bo^Bea"}
    tokens = {name: store.create(Role.REVIEWER, name, people[name])[1] for name in people}
    with running(data) as (base, _):
        yield Server(base, tokens)


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[object]:
    with playwright.sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


def _signed_in(browser: object, server: Server, name: str, dialogs: list[str]):  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{server.base}/review")
    assert page.url.endswith("/review/login")
    sign_in(page, server.base, server.tokens[name], goto=False)
    assert f"signed in as {name}" in page.inner_text("header")
    return ctx, page


def _save(name: str, page) -> None:  # type: ignore[no-untyped-def]
    """A screenshot for inspection (tests/artifacts). The README's screenshots come from a
    phantom run (tests/test_review_verified_e2e.py), not from this fixture's test strings."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _answer(page, model: str):  # type: ignore[no-untyped-def]
    """A model's differential answer, its collapsed details opened."""
    details = page.locator(
        "details.answer-detail",
        has=page.locator("summary", has_text=f"{model} · differential · sample"),
    ).first
    if details.get_attribute("open") is None:
        details.locator("> summary").click()
    return details.locator("section.answer")


def _block(page, model: str):  # type: ignore[no-untyped-def]
    return page.locator(f'section.block[data-model="{model}"]')


def _choose(page, model: str, item_id: str, verdict: str, text: str = "") -> None:  # type: ignore[no-untyped-def]
    """Set one item's verdict in its block's form (saved with the block)."""
    box = _block(page, model).locator(f'fieldset[data-block-item="{model}/{item_id}"]')
    box.locator(f'input[type=radio][value="{verdict}"]').check()
    if text and box.locator("select").count():
        box.locator("select").select_option(text)
    elif text:
        box.locator("input[type=text]").fill(text)


def _decide(page, model: str, item_id: str, verdict: str, text: str = "") -> None:  # type: ignore[no-untyped-def]
    _choose(page, model, item_id, verdict, text)
    _block(page, model).locator("form.block-form button[name=rest][value='']").click()
    page.wait_for_url("**done=block*")


def _accept_rest(page, model: str) -> None:  # type: ignore[no-untyped-def]
    _block(page, model).locator("form.block-form button.accept-rest").click()
    page.wait_for_url("**done=block*")


def _sign_off(page) -> None:  # type: ignore[no-untyped-def]
    page.click("#signoff a")  # step 1: the VERIFIED content
    page.wait_for_url("**/signoff")
    page.click("#signoff-confirm button")  # step 2: confirm
    page.wait_for_url("**done=signoff")


def test_reviewer_corrects_signs_off_and_summary_follows(browser: object, server: Server) -> None:
    dialogs: list[str] = []
    ctx, page = _signed_in(browser, server, "Dr Ada", dialogs)
    page.click("text=test-run")
    page.goto(f"{server.base}/review/runs/test-run/summary")
    assert page.inner_text("#review-counts").startswith("0 of 3 cases signed off")
    bad_errors_before = page.locator(f'.err-count[data-model="{BAD}"]').all_inner_texts()
    assert any(t.startswith("perceptual") for t in bad_errors_before)

    page.goto(f"{server.base}/review/runs/test-run")
    page.click("a.case-link:text('ms-1')")
    assert page.inner_text("#case-id") == "ms-1"
    # Hostile strings are on the page as text, and nothing ran.
    body = page.inner_text("body")
    # (the note is shown only as the model was sent it: this fixture's run recorded no
    # request, so it is not on the page at all; tests/test_model_saw.py shows a sent one)
    for literal in (XSS_SERIES, XSS_MODEL):
        assert literal in body
    assert XSS_NOTE not in body
    assert page.evaluate("document.querySelectorAll('script, img[src=x]').length") == 0
    # Enlarge on click: the image viewer opens and closes.
    page.click(".thumb a >> nth=0")
    assert page.locator("#img-1").is_visible()
    page.click("#img-1 .close")
    assert not page.locator("#img-1").is_visible()

    # The block says it is what goes into the SR; nothing is accepted by being left alone.
    assert "exactly what goes into" in _block(page, BAD).locator(".block-says").inner_text()
    _decide(page, BAD, "final", "correct", "Multiple sclerosis")
    # Saving keeps the reader where they were: back at the block's save button, not at the top
    # of the page.
    row = _block(page, BAD).locator("p.block-actions")
    assert page.url.endswith(f"#{row.get_attribute('id')}")
    assert page.evaluate("window.scrollY") > 0
    box, height = row.bounding_box(), page.viewport_size["height"]
    assert box is not None and -2 <= box["y"] < height  # the row at the top of the view
    mine = _block(page, BAD).locator('span[data-block-item$="/final"]').inner_text()
    assert mine.startswith("correct")
    _decide(page, BAD, "error.1", "correct", "reasoning")
    rating = _answer(page, BAD).locator("form[action$='/rating']")
    rating.locator("input[name=rating]").fill("1")
    rating.locator("button").click()
    page.wait_for_url("**done=rating")
    page.click("#signoff a")
    page.wait_for_url("**/signoff")
    assert page.locator("#signoff-blocked").count() == 1  # items without a verdict
    assert page.locator("#signoff-confirm").count() == 0
    page.go_back()
    for model in ("ref-good", BAD):
        _accept_rest(page, model)
    _sign_off(page)
    assert "Signed off by Dr Ada" in page.inner_text(".banner")
    assert page.locator("#signoff").count() == 0  # final: no more forms
    _save("review-page.png", page)

    page.goto(f"{server.base}/review/runs/test-run/summary")
    assert page.inner_text("#review-counts").startswith("1 of 3 cases signed off")
    assert page.inner_text("#n-overrides") == "1"
    after = page.locator(f'.err-count[data-model="{BAD}"]').all_inner_texts()
    assert "reasoning: 1" in after and after != bad_errors_before
    ms_row = page.locator("#cases-table tr", has_text="ms-1").inner_text()
    assert "signed off by Dr Ada" in ms_row
    _save("run-summary.png", page)
    assert dialogs == []
    ctx.close()


def test_two_reviewers_give_an_agreement_figure(browser: object, server: Server) -> None:
    dialogs: list[str] = []
    for name, verdict in (("Dr Ada", "accept"), ("Dr Bo", "reject")):
        ctx, page = _signed_in(browser, server, name, dialogs)
        page.goto(f"{server.base}/review/runs/test-run/cases/normal-1")
        _decide(page, BAD, "final", verdict)
        for model in ("ref-good", BAD):
            _accept_rest(page, model)
        _sign_off(page)
        ctx.close()
    ctx, page = _signed_in(browser, server, "Dr Bo", dialogs)
    page.goto(f"{server.base}/review/runs/test-run/cases/normal-1")
    # They disagree on one item: no VERIFIED report until an admin adjudicates.
    assert f"{BAD}: final diagnosis" in page.inner_text("#disputes")
    assert page.locator("#reissue").count() == 0
    page.goto(f"{server.base}/review/runs/test-run/summary")
    table = page.inner_text("#agreement")
    m = re.search(r"Reviewers Dr Ada vs Dr Bo: item verdicts\t(\d+)", table)
    assert m is not None and int(m.group(1)) >= 2
    assert page.inner_text("#review-counts").startswith("2 of 3 cases signed off")
    assert dialogs == []
    ctx.close()
