"""A study of many one-file series: every series the model was not shown is recorded with why
(on the case, so in the run's record), listed on the checklist page (grouped by reason, bounded)
and counted in its printed form; the SR cites only the series shown."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from dicom import NotShownReason, SeriesNotShown, UnshownSeries
from evaluation import TaskFamily
from evaluation.reports import load_run
from evaluation.reports.checklist import build_checklist
from evaluation.reports.html import render_checklist
from gateway.cli import app
from gateway.routing import Route
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

_spec = importlib.util.spec_from_file_location(
    "many_series", Path(__file__).parents[1] / "bench" / "many_series.py"
)
assert _spec is not None and _spec.loader is not None
many_series = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(many_series)

N_SERIES = 40  # kinds cycle T2, FLAIR, T1, localizer: 10 of each


def test_every_series_not_shown_is_recorded_listed_and_counted(tmp_path: Path) -> None:
    study_uid, uids = many_series.make_many_series(tmp_path / "spool", N_SERIES)
    route = Route(
        rule="t",
        models=["reference/image-rules"],
        tasks=[TaskFamily.LESION],
        series_classes=["T2", "FLAIR"],  # T1 is not routed
    )
    work = tmp_path / "runs" / ("0" * 32)
    result = DefaultEvaluator(Settings(data_dir=tmp_path)).evaluate(
        tmp_path / "spool" / study_uid, route, work
    )
    case = result.run.cases[0]
    record = case.provenance.series_not_shown
    assert record is not None
    shown = {i.series_uid for i in case.images}
    assert len(shown) == record.n_shown == 8 and record.n_series == N_SERIES
    assert record.counts == {
        NotShownReason.LOCALIZER: 10,
        NotShownReason.NOT_ROUTED: 10,
        NotShownReason.OVER_LIMIT: 12,
    }
    # every series is either shown or named with its reason, never both
    named = {s.series_uid: s.reason.value for s in record.series}
    assert set(named) | shown == set(uids) and not set(named) & shown
    assert any("32 not shown" in w for w in result.warnings)
    # the SR cites what the model was shown, not every routed series
    assert set(result.evaluated_series_uids) == shown
    # the run's record holds it (`neurosandbox report RUNDIR`, the review pages)
    again = load_run(work).cases[0].provenance.series_not_shown
    assert again is not None and again.counts == record.counts
    cli = CliRunner()
    shown_cli = cli.invoke(app, ["runs", "show", str(work)])
    assert shown_cli.exit_code == 0, shown_cli.output
    assert "8 of 40 series shown; 32 not shown" in " ".join(shown_cli.output.split())
    as_json = cli.invoke(app, ["runs", "show", str(work), "--json"])
    listed = json.loads(as_json.output)["series_not_shown"][case.case_id]["series"]
    assert {x["series_uid"]: x["reason"] for x in listed} == named

    checklist = build_checklist(case, result.run.samples, run_id="r", case_root=work)
    assert checklist.series_not_shown is not None
    page = render_checklist(checklist, lambda i: None)
    for uid, reason in named.items():
        row = re.search(rf'data-reason="{reason}".*?{re.escape(uid)}', page, re.S)
        assert row is not None, f"{uid} not listed under {reason}"
    assert "32 not shown" in page and "over the limit of 8 series per case" in page
    printed = render_checklist(checklist, lambda i: None, print_mode=True)
    assert not any(uid in printed for uid in named)  # the PDF: counts and reasons, no rows
    for reason, n in record.counts.items():
        cell = re.search(rf'data-reason="{reason}"><td>[^<]+</td><td class="num">(\d+)<', printed)
        assert cell is not None and int(cell.group(1)) == n


def test_the_page_lists_a_bounded_number_per_reason_and_says_how_many_more() -> None:
    from evaluation.reports.checklist_view import CaseChecklist
    from evaluation.reports.html import MAX_NOT_SHOWN_ROWS

    record = SeriesNotShown(n_series=MAX_NOT_SHOWN_ROWS + 258, n_shown=8, limit=8)
    for k in range(MAX_NOT_SHOWN_ROWS + 250):
        record.add(
            UnshownSeries(
                series_uid=f"1.2.3.{k}",
                series_number=k,
                description="<b>x</b>",
                reason=NotShownReason.OVER_LIMIT,
            )
        )
    page = render_checklist(
        CaseChecklist(run_id="r", case_id="c", generated_at="now", series_not_shown=record),
        lambda i: None,
    )
    assert page.count('<td class="mono">1.2.3.') == MAX_NOT_SHOWN_ROWS
    assert "and 250 more" in page and "<b>x</b>" not in page  # escaped
