"""Checklists, summaries and the review log, on a small hand-made run (real rendered images,
real scorers), without a browser."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
from html import unescape
from pathlib import Path

import jsonschema
import pytest
from report_fixtures import BAD, GOOD, XSS_MODEL, build_run, dump
from typer.testing import CliRunner

from evaluation.log.rundata import RunData
from evaluation.reports.checklist import answer_key, build_checklist
from evaluation.reports.checklist_view import SCHEMA_FILE, FlagKind, Mark, checklist_schema
from evaluation.reports.html import render_checklist
from evaluation.reports.loader import RunLoadError, load_run
from evaluation.reports.summary import build_summary, case_slug
from evaluation.review.agreement import review_stats
from evaluation.review.review_log import (
    Action,
    ReviewError,
    ReviewEvent,
    ReviewStore,
    Verdict,
    export_csv,
)
from evaluation.scores import ErrorCategory
from gateway.cli import app


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunData:
    return build_run(tmp_path_factory.mktemp("run"))


def _checklist(run: RunData, case_id: str):  # type: ignore[no-untyped-def]
    return build_checklist(run.case(case_id), run.samples_of(case_id), run_id=run.run_id)


def _answer(cl, model: str, ablation: str = "both"):  # type: ignore[no-untyped-def]
    return next(a for a in cl.answers if a.model == model and a.ablation == ablation)


def test_findings_are_marked_against_the_true_lesions(run: RunData) -> None:
    a = _answer(_checklist(run, "ms-1"), BAD)
    assert [f.mark for f in a.findings][:2] == [Mark.MATCHED, Mark.MATCHED]
    lesions = {x.id: x.mark for x in a.lesions}
    assert lesions["L1"] is Mark.MATCHED and lesions["L4"] is Mark.MISSED
    assert [s.mark for s in a.sequences] == [Mark.CORRECT, Mark.WRONG]  # "T1" for a T2 image
    assert a.sequences[1].header_class == "T2"
    assert a.final_diagnosis is not None and a.final_diagnosis.mark is Mark.WRONG
    kinds = {f.kind for f in a.flags}
    assert {
        FlagKind.MISSED_LESION,
        FlagKind.SEQUENCE_MISIDENTIFIED,
        FlagKind.LOW_CONFIDENCE,
    } <= kinds
    good = _answer(_checklist(run, "ms-1"), GOOD)
    assert good.differential[0].mark is Mark.CORRECT and good.samples is not None
    assert (good.samples.n, good.samples.n_correct) == (3, 3)


def test_findings_on_a_normal_control_are_flagged_as_hallucination(run: RunData) -> None:
    cl = _checklist(run, "normal-1")
    bad = _answer(cl, BAD)
    assert [f.mark for f in bad.findings] == [Mark.HALLUCINATED]
    assert FlagKind.FINDINGS_ON_NORMAL_CONTROL in {f.kind for f in bad.flags}
    assert bad.error is not None and bad.error.category is ErrorCategory.VISUAL_HALLUCINATION
    assert not _answer(cl, GOOD).flags
    assert cl.truth is not None and cl.truth.normal_control


def test_format_failure_is_flagged_and_unscored(run: RunData) -> None:
    bad = _answer(_checklist(run, "stroke-1"), BAD)
    assert FlagKind.FORMAT_FAILURE in {f.kind for f in bad.flags}
    assert bad.final_diagnosis is None and "not json" in bad.raw_text


def test_images_are_checked_against_their_recorded_hash(run: RunData, tmp_path: Path) -> None:
    cl = _checklist(run, "ms-1")
    assert all(i.verified for i in cl.images) and all(i.sent for i in cl.images)
    case = run.case("ms-1")
    tampered = tmp_path / "x.png"
    tampered.write_bytes(Path(case.images[0].path).read_bytes() + b"\0")
    images = [case.images[0].model_copy(update={"path": str(tampered)}), *case.images[1:]]
    cl2 = build_checklist(case.model_copy(update={"images": images}), [], run_id="r")
    assert cl2.images[0].verified is False and cl2.images[1].verified is True


def test_the_case_record_is_not_shown_as_what_the_model_saw(run: RunData) -> None:
    # what the model saw comes from the recorded requests (tests/test_model_saw.py), never
    # from the case's note or record: without a recorded request, the page says so
    case = run.case("ms-1").model_copy(update={"note": "Jane Doe, MRN: 12345678, seen today."})
    cl = build_checklist(case, [], run_id="r")
    assert not cl.model_saw and not cl.model_saw_recorded
    page = render_checklist(cl, lambda i: None)
    assert "12345678" not in page and 'id="not-recorded"' in page


def test_schema_file_is_current_and_checklists_validate(run: RunData) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema == checklist_schema(), "run evaluation.reports.checklist_view.write_schema()"
    for case in run.cases:
        jsonschema.validate(json.loads(_checklist(run, case.case_id).model_dump_json()), schema)


def test_checklist_html_escapes_hostile_strings_and_allows_no_script(run: RunData) -> None:
    case = run.case("ms-1")
    html = render_checklist(
        _checklist(run, "ms-1"), lambda i: Path(case.images[i - 1].path).read_bytes()
    )
    assert re.search(r"<script", html, re.I) is None
    assert re.search(r"<img src=x", html, re.I) is None
    assert "&lt;script&gt;alert(&#34;model&#34;)&lt;/script&gt;" in html
    assert "MySeries&lt;script&gt;" in html
    found = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert found is not None
    csp = unescape(found.group(1))  # the attribute as the browser reads it
    assert "script-src 'none'" in csp and "default-src 'none'" in csp
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp  # the stylesheet the browser will allow
    assert 'href="#img-1"' in html and 'id="img-1"' in html  # enlarge on click, no script


def _review(store: ReviewStore, who: str, case: str, **kw: object) -> ReviewEvent:
    return store.append(ReviewEvent(reviewer=who, run_id="test-run", case_id=case, **kw))  # type: ignore[arg-type]


def test_summary_counts_signed_off_overrides_only(run: RunData, tmp_path: Path) -> None:
    store = ReviewStore(tmp_path / "r.sqlite")
    key = answer_key(next(s for s in run.samples_of("normal-1") if s.scored.model == BAD))
    before = build_summary(run, n_boot=200).summary.errors[BAD]["categories"]
    _review(store, "Dr A", "normal-1", action=Action.ERROR, answer_key=key,
            category=ErrorCategory.PERCEPTUAL, text="the mass is not there")  # fmt: skip
    unsigned = build_summary(run, store.reviews("test-run"), n_boot=200)
    assert unsigned.summary.errors[BAD]["categories"] == before
    assert unsigned.reviews.n_in_progress == 1 and unsigned.reviews.n_signed_off == 0
    _review(store, "Dr A", "normal-1", action=Action.SIGNOFF)
    signed = build_summary(run, store.reviews("test-run"), n_boot=200)
    after = signed.summary.errors[BAD]["categories"]
    assert after["perceptual"] == before.get("perceptual", 0) + 1
    assert after.get("visual_hallucination", 0) == before["visual_hallucination"] - 1
    assert signed.reviews.n_overrides == 1
    row = next(c for c in signed.cases if c.case_id == "normal-1")
    assert row.signed_off_by == ["Dr A"]
    assert next(a for a in row.answers if a.model == BAD).error == "perceptual"


def test_reviewer_agreement_and_grader_calibration(run: RunData, tmp_path: Path) -> None:
    store = ReviewStore(tmp_path / "r.sqlite")
    keys = {c.case_id: [answer_key(s) for s in run.samples_of(c.case_id) if s.ablation == "both"
                        and s.scored.sample_index == 0] for c in run.cases}  # fmt: skip
    verdicts = {
        "Dr A": ["accept", "reject", "accept", "accept"],
        "Dr B": ["accept", "reject", "reject", "accept"],
    }
    for who, vs in verdicts.items():
        items = [(c, k) for c in ("ms-1", "normal-1") for k in keys[c]]
        for (case, key), v in zip(items, vs, strict=True):
            _review(
                store,
                who,
                case,
                action=Action.ITEM,
                answer_key=key,
                item_id="final",
                verdict=Verdict(v),
            )
            _review(
                store,
                who,
                case,
                action=Action.RATING,
                answer_key=key,
                rating=5.0 if v == "accept" else 1.0,
            )
        for case in ("ms-1", "normal-1"):
            _review(store, who, case, action=Action.SIGNOFF)
    stats = review_stats(run, store.reviews("test-run"))
    pair = stats.reviewer_agreement[0]
    assert (pair.reviewer_a, pair.reviewer_b, pair.n_items) == ("Dr A", "Dr B", 4)
    # 3 of 4 agree; A: 3 accept 1 reject, B: 2/2 -> pe = 0.5, po = 0.75 -> kappa 0.5
    assert pair.kappa_items == pytest.approx(0.5)
    assert stats.diagnosis_vs_clinician is not None and stats.diagnosis_vs_clinician.n == 8
    assert stats.grader_vs_clinician is not None and stats.grader_vs_clinician.value is not None
    assert stats.grader_source == "diagnosis_credit"
    assert stats.clinician_accuracy[GOOD].n == 4


def test_review_log_is_append_only_and_sign_off_is_final(tmp_path: Path) -> None:
    store = ReviewStore(tmp_path / "r.sqlite")
    _review(store, "Dr A", "c1", action=Action.COMMENT, text="first")
    with pytest.raises(ReviewError, match="signed-off"):
        _review(store, "Dr A", "c1", action=Action.REISSUE, text="1.2.3")
    with pytest.raises(ReviewError, match="correction"):
        _review(store, "Dr A", "c1", action=Action.ITEM, item_id="final", verdict=Verdict.CORRECT)
    _review(store, "Dr A", "c1", action=Action.SIGNOFF)
    with pytest.raises(ReviewError, match="signed off"):
        _review(store, "Dr A", "c1", action=Action.COMMENT, text="late change")
    _review(store, "Dr B", "c1", action=Action.COMMENT, text="another reviewer may still review")
    db = sqlite3.connect(tmp_path / "r.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE review_events SET text='rewritten'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM review_events")
    assert next(e.text for e in store.events()) == "first"


def test_csv_export_neutralises_spreadsheet_formulas(tmp_path: Path) -> None:
    store = ReviewStore(tmp_path / "r.sqlite")
    _review(store, "Dr A", "c1", action=Action.COMMENT, text='=HYPERLINK("http://x","y")')
    csv = export_csv(store.events())
    assert "'=HYPERLINK" in csv and "\n1," in csv


def test_report_command_writes_checklists_and_summary(run: RunData, tmp_path: Path) -> None:
    src = dump(run, tmp_path / "rundata.json")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(src), "--out", str(out), "--no-pdf"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "neurosandbox.run_summary" and summary["n_cases"] == 3
    assert {"ms-1.json", "ms-1.html", "normal-1.html", "stroke-1.json"} <= {
        p.name for p in (out / "cases").iterdir()
    }
    html = (out / "summary.html").read_text()
    assert "published, not measured here" in html and html.count('src="data:image/png;base64,') >= 6
    assert XSS_MODEL not in html
    assert load_run(out).run_id == "test-run"  # a report folder is itself a loadable run


def test_load_run_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(RunLoadError, match=r"no rundata\.json and no evaluation run store"):
        load_run(tmp_path)


def test_case_slugs_are_safe_file_names() -> None:
    assert case_slug("ms-1") == "ms-1"
    for hostile in ("../../etc/passwd", "a/b", "<script>", ".hidden", ""):
        slug = case_slug(hostile)
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", slug), slug
    assert case_slug("a/b") != case_slug("a_b")


def test_the_hostile_series_description_is_the_corpus_files_as_the_imaging_core_reads_it() -> None:
    # The report and browser tests plant XSS_SERIES; it must be the corpus's script-tag
    # SeriesDescription exactly as the header pass hands it on, or they prove nothing about it.
    from conftest import corpus_path
    from report_fixtures import XSS_SERIES

    from dicom.index import index_path

    f = corpus_path() / "hostile" / "Database" / "2017-06-27-XSSInjection.dcm"
    result = index_path(f)
    described = [s.description for s in result.series]
    # No pixel data: the file may be reported as unusable rather than indexed as a series.
    if not described:
        import pydicom

        described = [str(pydicom.dcmread(f, stop_before_pixels=True).SeriesDescription)]
    assert described == [XSS_SERIES]
