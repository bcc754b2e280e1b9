"""The review pages as a radiologist works in them (FastAPI's test client, the gateway's app):
the queue across runs with the hospital's identifiers and filters, failed gateway runs listed,
the case header keeping identifiers apart from what the model saw, an error-category control
that starts empty, readable local timestamps, each answer once with details collapsed, and a
block saved in one go."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from report_fixtures import BAD, GOOD, build_run
from review_server import build_context

from evaluation.case import StudyIdentity
from evaluation.reports import write_report
from gateway.api import create_app
from gateway.auth import Role
from gateway.runs import RunRecord, RunStatus

CASE = "/review/runs/test-run/cases/ms-1"
IDENTITY = StudyIdentity(
    patient_name="Ann <b>O'Brien</b>",
    patient_id="MRN-4417",
    birth_date="1990-02-03",
    sex="F",
    accession_number="ACC-99812",
    study_date="2026-11-20",
    study_description="MRI brain w/wo",
    modalities=["MR"],
    n_series=7,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("review-page")
    run = build_run(d / "src")
    run.cases[0].provenance.identity = IDENTITY  # the MS case came from a hospital study
    write_report(run, d / "reports" / "test-run", pdf=False)
    older = run.model_copy(
        update={"run_id": "older-run", "created_at": "2024-06-01T00:00:00+00:00"}
    )
    write_report(older, d / "reports" / "older-run", pdf=False)
    runs = build_context(d).runs
    rec = runs.create(RunRecord(run_id=runs.new_id(), trigger="dicom", study_uid="1.2.3.4"))
    runs.finish(rec.run_id, RunStatus.FAILED, error="ReportBuildError: '0000' is not a valid sex")
    return d


@pytest.fixture
def client(data: Path) -> Iterator[tuple[TestClient, str]]:
    ctx = build_context(data)
    _, token = ctx.tokens.create(Role.REVIEWER, "Dr Page", "Page^Pat")
    with TestClient(create_app(ctx), base_url="http://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        yield c, token


def _text(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", " ", html))


def _section(html: str, sid: str) -> str:
    m = re.search(rf'<section[^>]*id="{sid}".*?</section>', html, re.S)
    assert m is not None, sid
    return m.group(0)


def test_queue_lists_cases_of_every_run_newest_first_with_the_hospital_identifiers(
    client: tuple[TestClient, str],
) -> None:
    c, _ = client
    page = c.get("/review")
    assert page.status_code == 200
    rows = re.findall(r'<tr class="queue-row[^"]*"[^>]*>.*?</tr>', page.text, re.S)
    assert rows, page.text[:2000]
    text = [_text(r) for r in rows]
    ms = next(t for t in text if "ms-1" in t)
    for shown in ("Ann <b>O'Brien</b>", "MRN-4417", "ACC-99812", "2026-11-20", "MR", "7"):
        assert shown in ms, (shown, ms)
    assert "<b>O'Brien" not in page.text  # escaped, not markup
    assert GOOD in ms and BAD in ms
    assert re.search(r"\b0 of \d+ items\b", ms), ms
    # newest first: the test run (2025) before the older run (2024)
    runs = [re.search(r'data-run="([^"]+)"', r).group(1) for r in rows if "data-run" in r]  # type: ignore[union-attr]
    assert runs.index("test-run") < runs.index("older-run")
    # failed gateway runs are listed with their error
    failed = [t for t in text if "failed" in t]
    assert failed and "'0000' is not a valid sex" in failed[0]


def test_queue_filters_by_status_and_model(client: tuple[TestClient, str]) -> None:
    c, _ = client
    only_failed = c.get("/review", params={"status": "failed"}).text
    assert "0000" in only_failed and 'data-case="ms-1"' not in only_failed
    to_review = c.get("/review", params={"status": "to review"}).text
    assert 'data-case="ms-1"' in to_review and "0000" not in to_review
    by_model = c.get("/review", params={"model": BAD}).text
    assert 'data-case="ms-1"' in by_model
    nobody = c.get("/review", params={"model": "no-such-model"}).text
    assert 'data-case="ms-1"' not in nobody
    assert c.get("/review", params={"status": "<script>"}).status_code in (200, 422)


def test_case_header_keeps_identifiers_apart_from_what_the_model_saw(
    client: tuple[TestClient, str],
) -> None:
    c, _ = client
    html = c.get(CASE).text
    hospital = _section(html, "hospital")
    assert "never sent to a model" in _text(hospital)
    record_at = html.index('id="model-saw"')  # what the model was sent
    outside = html.replace(hospital, "")
    for ident in ("MRN-4417", "ACC-99812", "O&#39;Brien", "1990-02-03"):
        assert ident in hospital or ident.replace("&#39;", "'") in _text(hospital), ident
        assert ident not in outside, f"{ident} shown outside the hospital panel"
    # and nothing identifying in the header above the record: the panel is labelled, apart
    assert html.index('id="hospital"') < record_at
    head = html[: html.index('id="hospital"')]
    assert "MRN-4417" not in head and "patient " not in _text(head).lower().split("case")[-1]


def test_error_category_controls_start_empty(client: tuple[TestClient, str]) -> None:
    c, _ = client
    html = c.get(CASE).text
    selects = re.findall(r'<select name="(?:category|t:[^"]*)"[^>]*>(.*?)</select>', html, re.S)
    cats = [s for s in selects if "hallucination" in s.lower() or "reasoning" in s.lower()]
    assert cats, "no error-category control on the page"
    for s in cats:
        first = re.search(r"<option([^>]*)>([^<]*)</option>", s)
        assert first is not None
        assert 'value=""' in first.group(1) and "not reviewed" in first.group(2), s[:200]
        assert "selected" not in s.replace(first.group(0), "")


def test_timestamps_are_local_with_the_zone_name(
    client: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = client
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        html = c.get(CASE).text + c.get("/review").text
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    text = _text(html)
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), re.findall(
        r".{30}\d{4}-\d\d-\d\dT\d\d:\d\d.{10}", text
    )[:3]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d (CET|CEST)", text)
    assert os.environ.get("TZ") is None


class _Visible(HTMLParser):
    """The text a reader sees without opening anything: the body of a closed <details> is hidden
    (its summary line shows), and so are the elements named by ``skip_ids`` or ``skip_class``."""

    VOID = ("input", "img", "br", "meta", "link", "hr")

    def __init__(self, skip_ids: tuple[str, ...] = (), skip_class: str = "block") -> None:
        super().__init__()
        self.stack: list[bool] = []  # per open element: does it hide its content?
        self.skip_ids, self.skip_class = skip_ids, skip_class
        self.text: list[str] = []
        self.lifted: list[int] = []  # closed <details> whose summary is being read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        hide = (tag == "details" and "open" not in a) or a.get("id", "") in self.skip_ids or (
            tag == "section" and self.skip_class in classes)  # fmt: skip
        if tag == "summary" and self.stack and self.stack[-1]:
            self.lifted.append(len(self.stack) - 1)
            self.stack[-1] = False
        self.stack.append(hide)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID or not self.stack:
            return
        self.stack.pop()
        if tag == "summary" and self.lifted and self.lifted[-1] == len(self.stack) - 1:
            self.stack[self.lifted.pop()] = True

    def handle_data(self, data: str) -> None:
        if not any(self.stack):
            self.text.append(data)


def test_each_answer_once_with_details_collapsed(client: tuple[TestClient, str]) -> None:
    c, _ = client
    html = c.get(CASE).text
    answers = re.findall(r'<section class="answer"', html)
    collapsed = re.findall(r'<details class="answer-detail"(?![^>]*\bopen\b)', html)
    assert answers and len(collapsed) == len(answers)
    # the good model's three samples say "Multiple sclerosis": shown once, in its block; outside
    # the blocks and the reference only the collapsed answers' one-line summaries name it
    parser = _Visible(skip_ids=("reference",))
    parser.feed(html)
    seen = " ".join(parser.text)
    summaries = len(
        re.findall(r"<summary><b>" + re.escape(GOOD) + r"</b>[^<]*Multiple sclerosis", html)
    )
    assert seen.count("Multiple sclerosis") == summaries, seen[-3000:]
    blocks = re.findall(r'<section class="panel block".*?</section>', html, re.S)
    good = next(b for b in blocks if f'data-model="{GOOD}"' in b)
    assert _text(good).count("Multiple sclerosis") == 2  # differential entry, final diagnosis


def test_a_block_is_saved_in_one_go(client: tuple[TestClient, str]) -> None:
    c, _ = client
    html = c.get(CASE).text
    form = re.search(
        rf'<form[^>]*action="{CASE}/block"[^>]*data-model="{GOOD}".*?</form>', html, re.S
    )
    assert form is not None, "no block form"
    items = re.findall(r'name="v:([^"]+)"', form.group(0))
    assert len(set(items)) >= 3
    first, second = sorted(set(items))[:2]
    r = c.post(
        f"{CASE}/block",
        data={"csrf": "", "model": GOOD, "anchor": "block-1-save", f"v:{first}": "reject",
              f"v:{second}": "correct", f"t:{second}": "left frontal plaque", "rest": "accept"},
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 303, r.text[:500]
    assert r.headers["location"].endswith("#block-1-save")
    after = c.get(CASE).text
    block = re.search(
        r'<section class="panel block"[^>]*data-model="' + re.escape(GOOD) + '".*?</section>',
        after,
        re.S,
    )
    assert block is not None
    assert 'value="reject" checked' in block.group(0) and "left frontal plaque" in block.group(0)
    assert "left frontal plaque" in c.get(f"{CASE}/signoff").text
    # every item of the good model's block has a verdict now: only the other block is missing
    other = re.search(
        rf'<form[^>]*action="{CASE}/block"[^>]*data-model="{BAD}".*?</form>', after, re.S
    )
    assert other is not None
    n_other = len(set(re.findall(r'name="v:([^"]+)"', other.group(0))))
    missing = re.search(r'id="missing-count">(\d+) item', after)
    assert missing is not None and int(missing.group(1)) == n_other
    # an unknown item is refused whole: nothing recorded
    bad = c.post(f"{CASE}/block", data={"csrf": "", "model": BAD, "v:nope": "accept"})
    assert bad.status_code == 409 and "nope" in bad.text
