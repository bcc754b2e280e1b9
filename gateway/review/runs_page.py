"""The review app's runs page (``/review/runs``): every run of the install from the runs
catalog (``gateway.runs.index``), filtered as `runs index` filters, a link to each run's summary
where the review app has one, two picks to compare, and each model's metrics over the runs of
one dataset (a plot, or a sentence when there is nothing to plot)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from evaluation.log import CatalogEntry, figures_text
from gateway.review.service import ReportNotFoundError, ReviewService
from gateway.runs.index import install_runs
from gateway.settings import Settings


def summary_link(svc: ReviewService, base: str, e: CatalogEntry) -> str:
    """The run's live summary in the review app: a gateway run's, or the report of a run
    folder handed in under its name (`neurosandbox report`); "" when it has none."""
    if e.error:
        return ""
    for name in (e.run_id, Path(e.run_dir).name if e.run_dir else ""):
        if not name:
            continue
        try:
            svc.folder(name)
        except ReportNotFoundError:
            continue
        return f"{base}/runs/{name}/summary"
    return ""


def runs_index_page(
    settings: Settings, svc: ReviewService, base: str, dataset: str, model: str
) -> dict[str, Any]:
    """The runs page's context."""
    every = install_runs(settings)
    shown = [e for e in every if e.matches(dataset or None, model or None)]
    hashes = {e.dataset_hash for e in shown if e.dataset_hash}
    trend_png, trend_note, trend_hash = "", "", ""
    if len(hashes) == 1:
        # matplotlib is imported when a trend is drawn, not with the service
        from evaluation.reports import metrics_over_time, runs_of_dataset

        trend_hash = hashes.pop()
        png = metrics_over_time(shown, trend_hash)
        if png is not None:
            trend_png = "data:image/png;base64," + base64.b64encode(png).decode()
        else:
            n = len(runs_of_dataset(shown, trend_hash))
            trend_note = (
                f"Metrics over time: {n} run{'s' if n != 1 else ''} of dataset "
                f"{trend_hash[:12]} with figures here; a plot needs two or more."
            )
    elif shown:
        trend_note = (
            "Metrics over time: filter by one dataset (its name or hash) to plot each model's "
            "figures across its runs."
        )
    return {
        "base": base,
        "entries": [(e, summary_link(svc, base, e)) for e in shown],
        "models": sorted({m for e in every for m in e.models}),
        "dataset": dataset,
        "model": model,
        "figures": figures_text,
        "trend_png": trend_png,
        "trend_note": trend_note,
        "trend_hash": trend_hash,
    }
