"""``neurosandbox report RUNDIR``: checklists and the run summary of a run, as files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import cli_console, show_coverage

console = cli_console(stderr=True)


# the review log both reports feed back (one option, one help text)
ReviewsFedBack = Annotated[
    Path | None,
    typer.Option(
        "--reviews",
        help="review log (reviews.sqlite) to feed back; default DATA_DIR/reviews.sqlite if present",
    ),
]


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
    reviews: ReviewsFedBack = None,
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
    from gateway.runs.index import summary_catalog

    index = write_report(
        run, target, pdf=pdf, reviews=feedback, workers=workers, catalog=summary_catalog(settings)
    )
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


def pilot_report_command(
    rundirs: Annotated[
        list[Path],
        typer.Argument(
            help="the pilot's run folders (1 to 8), in the order the report shows them",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option(help="output folder (pilot.json, pilot.html, pilot.pdf)")],
    intended_use: Annotated[
        Path | None,
        typer.Option(
            help="the pilot's intended use: a YAML or Markdown file (docs/review.md, Pilot "
            "report); without it the report says none was given"
        ),
    ] = None,
    pdf: Annotated[
        bool, typer.Option("--pdf/--no-pdf", help="also print pilot.pdf with Chromium")
    ] = True,
    reviews: ReviewsFedBack = None,
) -> None:
    """Write one pilot report for an AI governance board over the pilot's runs (HTML and PDF).

    Intended use, the dataset, each model's passport, the results with 95% intervals and by
    subgroup, the failure modes, reviewer agreement, cost, the versions, and the limits of the
    evidence; every figure is the run summary's (the same numbers as `neurosandbox report`).
    Exit codes: 0 written; 1 written but the PDF could not be printed; 2 a run or the
    intended-use file could not be read."""
    from evaluation import EvaluationError
    from evaluation.reports import (
        IntendedUseError,
        PilotError,
        RunLoadError,
        build_pilot,
        check_run_count,
        load_intended_use,
        load_run,
        not_given,
        pilot_run,
        run_catalog_entry,
        run_passports,
        write_pilot,
    )
    from evaluation.review import ReviewStore
    from gateway.settings import get_settings

    settings = get_settings()
    url = settings.database_url
    try:
        use = load_intended_use(intended_use) if intended_use is not None else not_given()
        check_run_count(len(rundirs))
        loaded = [
            (load_run(d, url), run_passports(d, url), run_catalog_entry(d, url)) for d in rundirs
        ]
    except (
        IntendedUseError,
        PilotError,
        RunLoadError,
        EvaluationError,
        OSError,
        NotImplementedError,
    ) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    log = reviews or settings.data_dir / "reviews.sqlite"
    store = ReviewStore(log) if log.is_file() else None
    runs = [
        pilot_run(run, store.reviews(run.run_id) if store else [], passports, catalog=entry)
        for run, passports, entry in loaded
    ]
    try:
        report = build_pilot(runs, use)
    except PilotError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    files = write_pilot(report, out, pdf=pdf)
    for w in files.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if not use.given:
        console.print(
            "[yellow]note:[/yellow] no --intended-use FILE: the report says none was given"
        )
    console.print(
        f"pilot report over {len(runs)} run{'s' if len(runs) != 1 else ''}: "
        f"{escape(files.html)}" + (f", {escape(files.pdf)}" if files.pdf else "")
    )
    if pdf and files.warnings:
        raise typer.Exit(1)
