"""The run summary's "over time" section (evaluation/reports/over_time.py): each of the run's
models across the earlier runs of its dataset in the runs catalog, by date, with CI bars; a
sentence when the catalog holds none (or was not read).

- three `neurosandbox eval` runs of one dataset and one of another: `neurosandbox report` of the
  newest plots the two earlier runs of its dataset (not the other dataset's), each figure its
  run's leaderboard's as `runs index` lists it; the report of the first run, written after the
  others, finds no earlier run and says so (a later run is not its history);
- `build_summary` without a catalog says none was read; with hostile run ids and model names in
  the catalog, the page escapes them and the figures of a model this run did not ask are left out.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from typer.testing import CliRunner

from evaluation.log import CatalogEntry, ModelMetrics
from evaluation.reports import build_summary, load_run, render_summary
from evaluation.reports.over_time import MAX_EARLIER, run_history, this_run_entry
from evaluation.reports.plots import all_plots, plot_gaps
from evaluation.scoring.stats import Estimate
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
MODELS = ["reference/text-prior", "reference/image-rules"]


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("NEUROSANDBOX_DATABASE_URL", raising=False)


def _eval(tmp_path: Path, data: tuple[Path, Path], name: str, models: list[str]) -> Path:
    out = tmp_path / "runs" / name
    args = ["eval", "--suite", str(data[0]), "--answers", str(data[1]), "--samples", "1",
            "--no-bertscore", "--out", str(out)]  # fmt: skip
    for m in models:
        args += ["--model", m]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return out


def _report(run: Path, out: Path) -> dict[str, object]:
    res = CliRunner().invoke(app, ["report", str(run), "--no-pdf", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return dict(json.loads((out / "summary.json").read_text()))


def _section(html: str) -> str:
    """The over-time section of a summary page (up to the next section's heading)."""
    at = html.index('id="over-time"')
    return html[at : html.index("<h2", at + 1)]


def test_the_summary_plots_each_model_over_the_earlier_runs_of_its_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, tmp_path)
    data = write_nmb(tmp_path / "d3", 3)
    other = write_nmb(tmp_path / "d2", 2)
    first = _eval(tmp_path, data, "r1", MODELS)
    _eval(tmp_path, other, "x1", MODELS)  # another dataset: never in this history
    second = _eval(tmp_path, data, "r2", MODELS[:1])
    third = _eval(tmp_path, data, "r3", MODELS)

    index = CliRunner().invoke(app, ["runs", "index", "--json"])
    catalog = {
        r["run_id"]: CatalogEntry.model_validate(r) for r in json.loads(index.stdout)["runs"]
    }
    by_dir = {Path(e.run_dir or "").name: e for e in catalog.values()}

    summary = _report(third, tmp_path / "rep3")
    h = summary["history"]
    assert isinstance(h, dict)
    assert h["dataset_hash"] == by_dir["r3"].dataset_hash and h["earlier"] == 2
    runs = [CatalogEntry.model_validate(r) for r in h["runs"]]
    # oldest first, this run last; the other dataset's run is not among them
    assert [e.run_id for e in runs] == [by_dir[n].run_id for n in ("r1", "r2", "r3")]
    for e in runs[:-1]:  # each earlier figure is its run's, as the catalog lists it
        listed = catalog[e.run_id]
        assert e.source == "cli" and e.created_at == listed.created_at
        for m in e.metrics:
            assert m.accuracy == listed.metric(m.model).accuracy  # type: ignore[union-attr]
    assert [m.model for m in runs[1].metrics] == MODELS[:1]  # r2 asked one model
    html = (tmp_path / "rep3" / "summary.html").read_text()
    section = _section(html)
    assert re.search(r'<img class="plot" src="data:image/png;base64,[A-Za-z0-9+/=]{500,}"', section)
    assert "2 earlier runs of dataset" in section and "(this run)" in section
    for e in runs:
        assert e.run_id in section
    assert by_dir["x1"].run_id not in section

    # the first run's report, written now: the later runs are not its history
    summary = _report(first, tmp_path / "rep1")
    h = summary["history"]
    assert isinstance(h, dict) and h["earlier"] == 0
    section = _section((tmp_path / "rep1" / "summary.html").read_text())
    assert "No earlier run of dataset" in section and "<img" not in section
    assert by_dir["r2"].run_id not in section
    del second


def _est(v: float) -> Estimate:
    return Estimate(value=v, low=max(0.0, v - 0.2), high=min(1.0, v + 0.2), n=10)


def test_no_catalog_says_so_and_a_hostile_catalog_is_escaped_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, tmp_path)
    run_dir = _eval(tmp_path, write_nmb(tmp_path / "d", 2), "r1", MODELS[:1])
    run = load_run(run_dir)
    report = build_summary(run)
    assert report.history is None
    assert "no runs catalog was read" in plot_gaps(report)["over_time"]
    assert "over_time" not in all_plots(report)

    hostile = "<script>alert(1)</script>"
    earlier = [
        CatalogEntry(
            run_id=f"{hostile}-{i}",
            created_at=f"2026-0{1 + i % 9}-1{i % 10}T10:00:00+00:00",
            dataset_hash=run.dataset_hash,
            models=[MODELS[0], hostile],
            metrics=[
                ModelMetrics(model=MODELS[0], accuracy=_est(0.1 * (i % 10)), n_scored=10),
                ModelMetrics(model=hostile, accuracy=_est(0.5), n_scored=10),
            ],
        )
        for i in range(MAX_EARLIER + 5)
    ]
    unreadable = CatalogEntry(run_id="broken", dataset_hash=run.dataset_hash, error="no")
    report = build_summary(run, catalog=[*earlier, unreadable])
    h = report.history
    assert h is not None and h.earlier == MAX_EARLIER + 5 and h.left_out == 5
    assert len(h.runs) == MAX_EARLIER + 1 and h.runs[-1].run_id == run.run_id
    # a model this run did not ask is not in its history
    assert all(m.model == MODELS[0] for e in h.runs for m in e.metrics)
    plots = all_plots(report)
    assert plots["over_time"].startswith(b"\x89PNG")
    html = render_summary(report, plots)
    section = _section(html)
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;-" in section
    assert "the 5 oldest not shown" in section and "broken" not in section


def test_a_run_without_a_dataset_hash_says_nothing_can_be_matched() -> None:
    this = this_run_entry("r", "2026-01-01T00:00:00+00:00", "", "", [])
    h = run_history(this, [CatalogEntry(run_id="other", dataset_hash="")])
    assert h.earlier == 0 and [e.run_id for e in h.runs] == ["r"]
