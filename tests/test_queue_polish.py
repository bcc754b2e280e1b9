"""The review queue and the checklist page as a reviewer reads them (issue 35, "Queue"): which
dataset a row's run read (name and short hash: two runs of one dataset that changed differ), why a
case has nothing to review (every answer failed the answer format: the format's reason), a legend
of the rule codes an error's evidence starts with, and a tile's viewer link readable on its dark
bar (Chromium's computed colours, WCAG contrast; a screenshot in tests/artifacts/)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
from browser import CHROMIUM, launch
from fastapi.testclient import TestClient
from report_fixtures import BAD, GOOD, build_run
from review_server import build_context

from evaluation.log import RunData
from evaluation.reports import write_report
from evaluation.scores import ParseStatus
from gateway.api import create_app
from gateway.auth import Role

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
HASH_A = "3f9a1c0b7d2e4f6a8b1c3d5e7f9a0b2c4d6e8f0a1b3c5d7e9f1a2b4c6d8e0f1a"
HASH_B = "a07c55e2d94b1f3a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2c"
# what evaluation.format_reason recorded, and a hostile variant from an edited bundle
REASON = "answer.final_diagnosis: Field required"
HOSTILE_REASON = "answer.findings.0\x1b[31m: <b>Input</b>\u202e should be a valid list " + "x" * 400


def _all_format_failures(run: RunData, case_id: str) -> RunData:
    """Every answer to ``case_id`` an unusable one (no parsed answer), with a format reason."""
    samples = []
    for s in run.samples:
        if s.scored.case_id == case_id:
            why = REASON if s.scored.model == GOOD else HOSTILE_REASON
            scored = s.scored.model_copy(
                update={"status": ParseStatus.FORMAT_FAILURE, "error": None}
            )
            s = s.model_copy(update={"scored": scored, "answer": None, "parse_error": why})
        samples.append(s)
    return run.model_copy(update={"samples": samples})


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("queue-polish")
    run = build_run(d / "src")
    study_uid = (d / "src" / "study_uid.txt").read_text()
    for case in run.cases:  # a hospital study: the tiles link into the viewer
        case.provenance.study_uids = [study_uid]
    run = _all_format_failures(run, "stroke-1")
    week = run.model_copy(update={"dataset_name": "stroke-pilot", "dataset_hash": HASH_A})
    write_report(week, d / "reports" / "week-1", pdf=False)
    later = week.model_copy(
        update={
            "run_id": "week-2",
            "created_at": "2025-01-08T00:00:00+00:00",
            "dataset_hash": HASH_B,
        }
    )
    write_report(later, d / "reports" / "week-2", pdf=False)
    return d


@pytest.fixture(scope="module")
def client(data: Path) -> Iterator[TestClient]:
    ctx = build_context(data)
    _, token = ctx.tokens.create(Role.REVIEWER, "Dr Queue", "Queue^Quinn")
    with TestClient(create_app(ctx), base_url="http://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


def _rows(html: str) -> dict[tuple[str, str], str]:
    """(run, case) -> the row's text."""
    out = {}
    for m in re.finditer(r'<tr class="queue-row[^"]*" data-run="([^"]+)" data-case="([^"]+)">(.*?)</tr>', html, re.S):  # fmt: skip
        out[(m.group(1), m.group(2))] = " ".join(
            unescape(re.sub(r"<[^>]+>", " ", m.group(3))).split()
        )
    return out


def test_each_row_names_its_dataset_and_a_short_hash_that_tells_two_weeks_apart(client: TestClient) -> None:  # fmt: skip
    html = client.get("/review").text
    assert "<th>Dataset</th>" in html
    rows = _rows(html)
    assert "stroke-pilot" in rows[("week-1", "ms-1")] and HASH_A[:8] in rows[("week-1", "ms-1")]
    assert "stroke-pilot" in rows[("week-2", "ms-1")] and HASH_B[:8] in rows[("week-2", "ms-1")]
    assert HASH_A[:8] not in rows[("week-2", "ms-1")]
    assert f'title="dataset hash {HASH_A}"' in html  # the whole hash on hover


def test_a_case_whose_answers_all_failed_the_format_says_why_in_its_row(client: TestClient) -> None:
    html = client.get("/review").text
    rows = _rows(html)
    stroke = rows[("week-1", "stroke-1")]
    assert "0 of 0 items" not in stroke and "nothing to review" in stroke
    row = re.search(r'data-run="week-1" data-case="stroke-1">.*?</tr>', html, re.S)
    assert row is not None
    lines = [unescape(li) for li in re.findall(r"<li>(.*?)</li>", row.group(0), re.S)]
    assert lines[0] == f"{GOOD}: 1 of 1 failed the answer format: {REASON}"
    # the hostile reason: one line, no escape or bidi characters, bounded, shown as text
    prefix = f"{BAD}: 1 of 1 failed the answer format: "
    assert lines[1].startswith(prefix)
    why = lines[1].removeprefix(prefix)
    assert why.startswith("answer.findings.0 [31m: <b>Input</b> should be a valid list xxx")
    assert "\x1b" not in why and "\u202e" not in why and len(why) <= 200 and why.endswith("\u2026")
    assert "<b>Input</b>" not in html and "&lt;b&gt;Input&lt;/b&gt;" in html
    # a case with usable answers keeps its count and lists no unusable answers
    assert re.search(r"\b0 of \d+ items", rows[("week-1", "ms-1")])
    assert "failed the answer format" not in rows[("week-1", "ms-1")]


def test_the_checklist_explains_the_rule_codes_of_its_evidence(client: TestClient) -> None:
    html = client.get("/review/runs/week-1/cases/normal-1").text
    evidence = " ".join(re.findall(r'<div class="pre small">(.*?)</div>', html, re.S))
    used = set(re.findall(r"\b(R\d+):", evidence))
    assert used, "the fixture's wrong answer has rule evidence"
    legend = re.search(r'<details[^>]*id="rule-legend".*?</details>', html, re.S)
    assert legend is not None
    explained = dict(re.findall(r"<dt>(R\d+)</dt><dd>(.*?)</dd>", legend.group(0)))
    assert used <= set(explained) and {"R4", "R5", "R9"} <= set(explained)
    assert "visual hallucination" in explained["R5"] and "reasoning" in explained["R9"]
    assert 'href="#rule-legend"' in html


def _luminance(rgb: tuple[int, ...]) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _rgb(css: str) -> tuple[int, ...]:
    m = re.match(r"rgba?\((\d+), (\d+), (\d+)(?:, ([\d.]+))?\)", css)
    assert m is not None, css
    assert m.group(4) in (None, "1"), f"a translucent colour: {css}"
    return tuple(int(m.group(i)) for i in (1, 2, 3))


def test_the_tile_link_is_readable_on_its_dark_bar(client: TestClient) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    html = client.get("/review/runs/week-1/cases/ms-1").text
    assert 'class="viewer-link"' in html
    with playwright.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_content(html)  # the page's own stylesheet is inline
            link = page.locator(".thumb a.viewer-link").first
            fg, bg = link.evaluate(
                "a => [getComputedStyle(a).color, getComputedStyle(a).backgroundColor]"
            )
            lf, lb = _luminance(_rgb(fg)), _luminance(_rgb(bg))
            ratio = (max(lf, lb) + 0.05) / (min(lf, lb) + 0.05)
            assert lb < 0.1, f"the bar is not dark: {bg}"
            assert ratio >= 7, f"contrast {ratio:.1f}:1 of {fg} on {bg} (WCAG AAA wants 7:1)"
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            link.evaluate("a => a.closest('.thumbs').scrollIntoView()")
            page.locator(".thumbs").screenshot(path=str(ARTIFACTS / "queue-polish-tiles.png"))
        finally:
            browser.close()
