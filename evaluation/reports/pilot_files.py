"""The pilot report's files: ``pilot.json`` (the record), ``pilot.html`` and ``pilot.pdf``
(printed by the same headless Chromium as the other reports)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from evaluation.reports.html import csp, css, data_uri, env
from evaluation.reports.pdf import PdfError, html_file_to_pdf
from evaluation.reports.pilot import PilotReport
from evaluation.reports.plots import leaderboard, metrics_over_time
from evaluation.scores import ErrorCategory
from evaluation.scoring.stats import MIN_PATIENTS


class PilotFiles(BaseModel):
    json_path: str
    html: str
    pdf: str | None = None
    warnings: list[str] = Field(default_factory=list)


def pilot_plots(report: PilotReport) -> dict[str, bytes]:
    """The results plot of each run (the summary's leaderboard plot, ``RUN_ID:leaderboard``),
    and for a dataset two or more of the runs share, each model's figures across them by date
    (the runs catalog's plot, ``over-time:DATASET_HASH``)."""
    plots: dict[str, bytes] = {}
    for run in report.runs:
        png = leaderboard(run.summary)
        if png:
            plots[f"{run.run_id}:leaderboard"] = png
    entries = [run.catalog for run in report.runs if run.catalog is not None]
    for digest in dict.fromkeys(e.dataset_hash for e in entries if e.dataset_hash):
        png = metrics_over_time(entries, digest)  # None: fewer than two runs with figures
        if png:
            plots[f"over-time:{digest}"] = png
    return plots


def render_pilot(
    report: PilotReport, plots: dict[str, bytes] | None = None, *, print_mode: bool = False
) -> str:
    """The report as one self-contained HTML page (autoescaped; no script)."""
    plots = plots or {}
    return (
        env()
        .get_template("pilot.html.j2")
        .render(
            r=report,
            plots={k: data_uri(v) for k, v in plots.items()},
            over_time=[data_uri(v) for k, v in plots.items() if k.startswith("over-time:")],
            categories=[c.value for c in ErrorCategory],
            min_patients=MIN_PATIENTS,
            css=css(),
            csp=csp(),
            rv=None,
            print=print_mode,
            message="",
            message_error=False,
        )
    )


def write_pilot(report: PilotReport, out: Path, *, pdf: bool = True) -> PilotFiles:
    """Write ``pilot.json``, ``pilot.html`` and (``pdf``) ``pilot.pdf`` into ``out``. A PDF
    that cannot be printed is a warning, the HTML stays."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = pilot_plots(report)
    (out / "pilot.json").write_text(report.model_dump_json(indent=2))
    html = out / "pilot.html"
    html.write_text(render_pilot(report, plots))
    files = PilotFiles(json_path=str(out / "pilot.json"), html=str(html))
    if not pdf:
        return files
    printable = out / ".pilot.print.html"
    printable.write_text(render_pilot(report, plots, print_mode=True))
    try:
        files.pdf = str(html_file_to_pdf(printable, out / "pilot.pdf"))
    except PdfError as exc:
        files.warnings.append(f"pilot.pdf: {exc}")
    finally:
        printable.unlink(missing_ok=True)
    return files
