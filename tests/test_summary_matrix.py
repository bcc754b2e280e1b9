"""The run summary a clinician reads: the case matrix (cases x models, each cell coloured by
outcome with a symbol and a word, a link to the checklist), every bar with its n, a sentence where
a plot would be empty, and the results by subgroup (HTML and ``runs show --json``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from scoring_cases import answer, normal_case, stroke_case

from evaluation.case import Case, StudyIdentity, StudyScanner, TaskFamily
from evaluation.log.rundata import RunData, SampleResult
from evaluation.reports import plots as plots_mod
from evaluation.reports.html import css, render_summary
from evaluation.reports.plots import all_plots, plot_gaps
from evaluation.reports.summary import OUTCOME_LEGEND, CaseOutcome, build_summary
from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample

D = TaskFamily.DIFFERENTIAL
RIGHT = answer("acute ischaemic stroke", differential=["acute ischaemic stroke"])
WRONG = answer("multiple sclerosis", differential=["multiple sclerosis"])


def _case(n: int, **update: Any) -> Case:
    c = stroke_case().model_copy(update={"case_id": f"c{n}", "patient_id": f"p{n}", **update})
    c.provenance = c.provenance.model_copy(
        update={
            "identity": StudyIdentity(
                scanners=[
                    StudyScanner(
                        manufacturer="SIEMENS", model_name="Skyra", field_strength=3.0, n_series=2
                    )
                ]
            )
        }
    )
    return c


def _sample(case: Case, model: str, outcome: object, index: int = 0, **kw: Any) -> SampleResult:
    status = outcome if isinstance(outcome, ParseStatus) else ParseStatus.OK
    parsed = None if isinstance(outcome, ParseStatus) else RIGHT if outcome else WRONG
    sc = make_scored_sample(case, D, model, status, parsed, "", sample_index=index, bertscore=False)
    return SampleResult(scored=sc, answer=parsed, **kw)


def _run(samples: list[SampleResult], cases: list[Case]) -> RunData:
    return RunData(run_id="matrix-run", title="matrix", cases=cases, samples=samples)


def _cells(html: str) -> dict[tuple[str, str], str]:
    """(case, model) -> the cell's HTML, from the matrix."""
    table = html[html.index('id="cases-table"') :]
    table = table[: table.index("</table>")]
    out = {}
    for row in re.findall(r'<tr data-case="([^"]+)">(.*?)</tr>', table, re.S):
        for model, cell in re.findall(
            r'<td class="cell[^"]*" data-model="([^"]+)"(.*?)</td>', row[1], re.S
        ):
            out[(row[0], model)] = cell
    return out


def _colour(style: str, outcome: CaseOutcome) -> str:
    found = re.search(rf"\.cell-{outcome.value}\{{background:(#[0-9a-f]{{6}})", style)
    assert found, outcome
    return found[1]


def test_each_outcome_has_its_colour_symbol_and_word_and_links_to_the_checklist() -> None:
    c1, c2 = _case(1), _case(2)
    no_truth = normal_case().model_copy(
        update={"case_id": "c3", "patient_id": "p3", "ground_truth": None}
    )
    samples = [
        _sample(c1, "m-right", True),
        _sample(c1, "m-wrong", False),
        _sample(c1, "m-format", ParseStatus.FORMAT_FAILURE),
        _sample(c1, "m-refused", ParseStatus.REFUSAL),
        _sample(c1, "m-error", ParseStatus.ERROR),
        _sample(no_truth, "m-right", True),
        _sample(c2, "m-right", True),  # m-wrong ... m-error never asked c2: not run
    ]
    report = build_summary(_run(samples, [c1, c2, no_truth]), n_boot=50)
    html = render_summary(report, {}, case_href=lambda slug: f"/checklists/{slug}")
    cells = _cells(html)
    expected = {
        ("c1", "m-right"): CaseOutcome.RIGHT,
        ("c1", "m-wrong"): CaseOutcome.WRONG,
        ("c1", "m-format"): CaseOutcome.FORMAT_FAILURE,
        ("c1", "m-refused"): CaseOutcome.REFUSED,
        ("c1", "m-error"): CaseOutcome.ERROR,
        ("c3", "m-right"): CaseOutcome.NOT_GRADED,
        ("c2", "m-wrong"): CaseOutcome.NOT_RUN,
    }
    style = css()
    for (case, model), outcome in expected.items():
        cell = cells[(case, model)]
        symbol, word, _ = OUTCOME_LEGEND[outcome]
        assert f'data-outcome="{outcome.value}"' in cell, (case, model, cell)
        assert symbol in cell and word in cell  # never colour alone
        assert f'href="/checklists/{case}"' in cell
    colours = {_colour(style, o) for o in expected.values()}
    assert len(colours) == len(expected)  # seven outcomes, seven colours
    legend = html[html.index('id="outcome-legend"') :].split("</p>")[0]
    for symbol, word, meaning in OUTCOME_LEGEND.values():
        assert symbol in legend and word in legend and meaning in legend


def test_samples_with_different_outcomes_make_a_mixed_cell_with_counts() -> None:
    c1 = _case(1)
    samples = [_sample(c1, "m", o, i) for i, o in enumerate([True, False, True])]
    report = build_summary(_run(samples, [c1]), n_boot=50)
    cell = _cells(render_summary(report, {}))[("c1", "m")]
    # the reviewed answer (first sample) is right; the cell says how the three samples went
    assert 'data-outcome="right"' in cell and "2 of 3 samples right" in cell


def test_a_run_without_plot_data_says_why_instead_of_drawing_empty_plots() -> None:
    c1, c2 = _case(1), _case(2)
    samples = [_sample(c, "m", ParseStatus.ERROR) for c in (c1, c2)]
    samples.append(_sample(c1, "m2", ParseStatus.ERROR))
    report = build_summary(_run(samples, [c1, c2]), n_boot=50)
    drawn = all_plots(report)
    gaps = plot_gaps(report)
    for name in ("leaderboard", "breakdowns", "reliability", "cost"):
        assert name not in drawn and name in gaps, name
    html = " ".join(render_summary(report, drawn).split())
    assert 'id="gap-leaderboard"' in html
    assert "none of the 3 answers could be scored (3 failed calls)" in html
    assert 'id="gap-reliability"' in html and "nothing to calibrate" in html
    assert 'id="gap-cost"' in html and "no token counts" in html
    assert 'id="gap-ablations"' in html


def test_a_run_with_data_draws_its_plots_and_prints_no_gap_sentence() -> None:
    cases = [_case(i) for i in range(4)]
    samples = [_sample(c, "m", i % 2 == 0) for i, c in enumerate(cases)]
    report = build_summary(_run(samples, cases), n_boot=50)
    drawn = all_plots(report)
    assert {"leaderboard", "breakdowns", "errors"} <= set(drawn)
    assert not {"leaderboard", "breakdowns", "errors"} & set(plot_gaps(report))


def _texts_of(plot: Any, report: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text a plot draws (tick labels, bar labels, annotations, legend)."""
    figures = []
    monkeypatch.setattr(plots_mod, "_png", lambda fig: figures.append(fig) or b"png")
    assert plot(report) == b"png"
    fig = figures[0]
    fig.canvas.draw() if fig.canvas else None
    out = [t.get_text() for t in fig.findobj(match=lambda a: hasattr(a, "get_text"))]
    return [t for t in out if t]


def test_every_bar_carries_its_n(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [_case(i) for i in range(5)]
    samples = [_sample(c, "m", i < 3) for i, c in enumerate(cases)]
    samples += [_sample(c, "other", i < 1) for i, c in enumerate(cases[:4])]
    report = build_summary(_run(samples, cases), n_boot=50)
    board = _texts_of(plots_mod.leaderboard, report, monkeypatch)
    assert "n=5" in board and "n=4" in board  # beside each model's point
    bars = _texts_of(plots_mod.breakdowns, report, monkeypatch)
    assert "0.60\nn=5" in bars and "0.25\nn=4" in bars
    errs = _texts_of(plots_mod.errors, report, monkeypatch)
    assert any("(n=5 answers)" in t for t in errs) and any("(n=4 answers)" in t for t in errs)


def test_the_summary_shows_subgroups_with_n_ci_and_too_small() -> None:
    cases = [_case(i) for i in range(12)]
    ge = [
        _case(20 + i).model_copy(
            update={
                "provenance": _case(0).provenance.model_copy(
                    update={
                        "identity": StudyIdentity(
                            scanners=[
                                StudyScanner(
                                    manufacturer="GE MEDICAL SYSTEMS",
                                    field_strength=15000,
                                    n_series=1,
                                )
                            ]
                        )
                    }
                )
            }
        )
        for i in range(3)
    ]
    samples = [_sample(c, "m", i < 9) for i, c in enumerate(cases)]
    samples += [_sample(c, "m", True) for c in ge]
    report = build_summary(_run(samples, cases + ge), n_boot=100)
    assert report.subgroups is not None
    html = " ".join(render_summary(report, {}).split())
    table = html[html.index('id="subgroups-vendor"') :].split("</table>")[0]
    siemens = next(r for r in table.split("<tr>") if r.startswith("<td>Siemens</td>"))
    assert "0.75 <span" in siemens and "n=12" in siemens and "[" in siemens
    ge_row = next(r for r in table.split("<tr>") if r.startswith("<td>GE</td>"))
    assert "too small (n=3)" in ge_row and "1.00" not in ge_row
    field = html[html.index('id="subgroups-field_strength"') :].split("</table>")[0]
    assert "<td>1.5 T</td>" in field and "<td>3 T</td>" in field
    assert "DICOM headers 15 cases" in html


def test_runs_show_json_includes_the_subgroups(
    phantom_suite: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run on phantom studies: vendor, scanner and field strength from the DICOM headers
    the run recorded, age and sex from the record."""
    from engine_helpers import run_phantoms
    from typer.testing import CliRunner

    from gateway.cli import app

    run = run_phantoms(phantom_suite, ("stroke", "ich"), ["reference/text-prior"], tmp_path,
                       monkeypatch)  # fmt: skip
    out = CliRunner().invoke(app, ["runs", "show", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    sub = data["subgroups"]
    vendors = {r["value"] for r in sub["rows"] if r["attribute"] == "vendor"}
    assert vendors == {"NeuroSandbox"}
    fields = {r["value"] for r in sub["rows"] if r["attribute"] == "field_strength"}
    assert fields and all(f.endswith(" T") or f.startswith("not applicable") for f in fields)
    assert sub["sources"]["age_band"].get("record", 0) >= 1
    assert all(r["too_small"] for r in sub["rows"])  # two phantom patients
    assert {"n", "estimate", "ci_low", "ci_high"} <= set(sub["rows"][0])


def test_a_hostile_header_value_is_bounded_and_escaped_in_the_subgroup_table() -> None:
    evil = '<script>alert("vendor")</script>\x00' + "x" * 300
    c = _case(1)
    c.provenance.identity = StudyIdentity(
        scanners=[StudyScanner(manufacturer=evil, model_name=evil, field_strength=1e308)]
    )
    report = build_summary(_run([_sample(c, "m", True)], [c]), n_boot=50)
    html = render_summary(report, {})
    sub = html[html.index('id="subgroups"') :]
    assert "<script>alert" not in sub and "&lt;script&gt;" in sub
    assert "x" * 41 not in sub  # bounded
    assert "<td>not readable</td>" in sub  # 1e308: neither tesla nor gauss
