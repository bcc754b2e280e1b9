"""``neurosandbox report RUNDIR``: checklists and the run summary of a run, as files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import cli_console, show_coverage

console = cli_console(stderr=True)


def report_command(
    rundir: Annotated[
        Path, typer.Argument(help="a run folder (or a rundata.json exported from one)")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="output folder; default REPORTS_DIR (else DATA_DIR/reports)/<run id>, where the gateway's review pages find it"
        ),
    ] = None,
    pdf: Annotated[
        bool, typer.Option("--pdf/--no-pdf", help="also print PDFs with Chromium")
    ] = True,
    reviews: Annotated[
        Path | None,
        typer.Option(
            help="review log (reviews.sqlite) to feed back; default DATA_DIR/reviews.sqlite if present"
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=8, help="Chromium processes at once")] = 2,
) -> None:
    """Write per-case checklists (JSON, HTML, PDF) and the run summary (JSON, HTML, PDF).

    The summary says how many of the dataset's cases the run evaluated and lists the skipped
    ones with why; so does this command. The run is read from its run store; a folder holding
    only a ``rundata.json`` (an older report, a bundle from elsewhere) is read from that export,
    as handed in. Written into the reports folder, a run that is not one of the gateway's is
    shown by the review pages as written here (write it again after a ``rescore``)."""
    from evaluation import EvaluationError
    from evaluation.reports import RunLoadError, case_slug, load_run, write_report
    from evaluation.review import ReviewStore
    from gateway.settings import get_settings

    settings = get_settings()
    try:
        run = load_run(rundir, settings.database_url)
    except (RunLoadError, EvaluationError, OSError, NotImplementedError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    target = out or settings.reports_root / case_slug(run.run_id)
    log = reviews or settings.data_dir / "reviews.sqlite"
    feedback = ReviewStore(log).reviews(run.run_id) if log.is_file() else []
    index = write_report(run, target, pdf=pdf, reviews=feedback, workers=workers)
    for w in index.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    console.print(
        f"{len(index.cases)} checklists, summary: {escape(index.summary_html)}"
        + (f", {len(index.pdfs)} PDFs" if pdf else "")
        + (f"; {len(feedback)} reviews fed back" if feedback else "")
    )
    if run.coverage is not None:
        show_coverage(run.coverage)
    if pdf and index.warnings:
        raise typer.Exit(1)
