"""``neurosandbox cases``: a hospital case manifest checked before a run, and its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gateway.cli.console import cli_console

cases_app = typer.Typer(
    help="Check a case manifest (your own studies) before a run; print its JSON Schema, or the "
    "answer's (what a model must return).",
    no_args_is_help=True,
)
console = cli_console()  # the report (stdout)


@cases_app.command("check")
def cases_check(
    manifest: Annotated[
        Path, typer.Argument(help="case manifest (YAML or JSON) to check", show_default=False)
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the report as JSON (problems with their paths)")
    ] = False,
) -> None:
    """Name every bad field of a case manifest with its path (cases[1].tasks[0]) and every
    study, record or note file it names that is not there, and a study named on a PACS the
    PACS file does not configure. Reads no pixel data and fetches nothing from a PACS. Exit
    code 0: every case is fine; 1: any problem."""
    from evaluation.datasets import check_manifest
    from gateway.pacs import LOCAL, PacsConfigError, configured
    from gateway.settings import get_settings

    try:  # a case's study on a PACS must name a configured one
        known: set[str] | None = {LOCAL, *configured(get_settings()).pacs}
    except PacsConfigError as exc:
        known = None
        cli_console(stderr=True).print(
            f"[yellow]warning[/yellow] PACS names not checked: {escape(str(exc))}", soft_wrap=True
        )
    report = check_manifest(manifest, known)
    if as_json:
        body = report.model_dump(mode="json", exclude={"problems": {"__all__": {"case"}}})
        typer.echo(json.dumps({"ok": report.ok, **body}, indent=2))
    else:
        for problem in report.problems:
            console.print(f"[red]error[/red] {escape(str(problem))}", soft_wrap=True)
        for note in report.notes:
            console.print(f"[dim]note[/dim]  {escape(note)}", soft_wrap=True)
        if report.ok:
            console.print(
                f"[green]{report.cases} cases ok[/green] in {escape(report.manifest)}",
                soft_wrap=True,
            )
        else:
            n = len(report.problems)
            console.print(
                f"[red]{report.cases_ok} of {report.cases} cases ok; {n} problem"
                f"{'s' if n != 1 else ''}[/red] in {escape(report.manifest)}",
                soft_wrap=True,
            )
    if not report.ok:
        raise typer.Exit(1)


@cases_app.command("schema")
def cases_schema(
    answer: Annotated[
        bool,
        typer.Option(
            "--answer",
            help="print instead the JSON Schema of what a model must return "
            "(docs/answer.schema.json; see docs/answer-format.md)",
        ),
    ] = False,
    classification: Annotated[
        bool,
        typer.Option(
            "--classification",
            help="with --answer: the classification task's answer "
            "(docs/answer-classification.schema.json)",
        ),
    ] = False,
) -> None:
    """Print the JSON Schema of a case manifest (docs/manifest.schema.json is this output), or
    with --answer of a model's answer, with its version."""
    if classification and not answer:
        raise typer.BadParameter("--classification goes with --answer")
    if answer:
        from evaluation import answer_schema

        schema = answer_schema("classification" if classification else "answer")
        typer.echo(json.dumps(schema, indent=2))
        return
    from evaluation.datasets import manifest_schema

    typer.echo(json.dumps(manifest_schema(), indent=2, sort_keys=True))


@cases_app.command("from-pacs")
def cases_from_pacs(
    pacs: Annotated[
        str,
        typer.Option(
            "--pacs",
            help="the PACS by name (NEUROSANDBOX_PACS_FILE; `local`: the sandbox's Orthanc)",
            show_default=False,
        ),
    ],
    accession: Annotated[
        list[str] | None, typer.Option("--accession", help="an accession number (repeatable)")
    ] = None,
    accession_file: Annotated[
        Path | None,
        typer.Option(
            "--accession-file",
            help="accession numbers: one per line, or a CSV's accession_number column",
        ),
    ] = None,
    patient_id: Annotated[
        list[str] | None, typer.Option("--patient-id", help="a patient ID (repeatable)")
    ] = None,
    patient_file: Annotated[
        Path | None,
        typer.Option(
            "--patient-file", help="patient IDs: one per line, or a CSV's patient_id column"
        ),
    ] = None,
    date_from: Annotated[
        str | None, typer.Option("--date-from", help="studies on or after YYYY-MM-DD")
    ] = None,
    date_to: Annotated[
        str | None, typer.Option("--date-to", help="studies on or before YYYY-MM-DD")
    ] = None,
    modality: Annotated[
        list[str] | None, typer.Option("--modality", help="MR, CT... (repeatable)")
    ] = None,
    description: Annotated[
        str | None,
        typer.Option(
            "--description",
            help="study description pattern: * and ? are wildcards, case-insensitive",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many studies")] = 500,
    list_only: Annotated[
        bool, typer.Option("--list-only", help="list the studies; pull nothing, write nothing")
    ] = False,
    diagnoses: Annotated[
        Path | None,
        typer.Option(
            "--diagnoses",
            help="the team's diagnoses CSV to join (columns: "
            "docs/cases.md, 'A cohort from your PACS')",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="the manifest to write (YAML)")] = Path(
        "cohort.yaml"
    ),
    name: Annotated[
        str | None, typer.Option("--name", help="the dataset's name in runs and reports")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="replace --out if it exists")] = False,
    by_uid: Annotated[
        bool,
        typer.Option(
            "--by-uid",
            help="name each case's study on the PACS ({pacs, study_uid, patient_id}, fetched "
            "on first use) rather than its folder in the cache",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print what was found, pulled and joined as JSON")
    ] = False,
) -> None:
    """Find a cohort on a PACS (DICOMweb, DIMSE or Orthanc), pull each study once into the
    cache, join the team's diagnoses, and write a case manifest to edit. Every study found is a
    study of a patient; a file of another study or patient is left out and listed. A diagnosis
    row that matches no study, a study with no row, and a row whose patient ID is not the
    study's are listed, never joined. Exit code 0: done; 1: some studies could not be pulled;
    2: bad usage or configuration (the PACS file, an option, the CSV's columns, an --out that
    exists without --force)."""
    import datetime as dt

    from pydantic import ValidationError

    from gateway.pacs import PacsConfigError, PacsRequestError, StudyQuery, open_client
    from gateway.pacs.cohort import (
        CohortError,
        found_cohort,
        join_diagnoses,
        read_diagnoses,
        read_values,
        write_manifest,
    )
    from gateway.settings import get_settings

    err = cli_console(stderr=True)

    def usage(message: str) -> typer.Exit:
        err.print(f"[red]error[/red] {escape(message)}", soft_wrap=True)
        return typer.Exit(2)

    def values(path: Path | None, column: str) -> list[str]:
        return read_values(path, column) if path is not None else []

    try:
        query = StudyQuery(
            accession_numbers=[*(accession or []), *values(accession_file, "accession_number")],
            patient_ids=[*(patient_id or []), *values(patient_file, "patient_id")],
            date_from=dt.date.fromisoformat(date_from) if date_from else None,
            date_to=dt.date.fromisoformat(date_to) if date_to else None,
            modalities=[m.upper() for m in modality or []],
            description=description,
            limit=limit,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise usage(f"{where or 'query'}: {first['msg']}") from None
    except CohortError as exc:  # a query file that cannot be read
        raise usage(str(exc)) from None
    except ValueError as exc:  # a date that is not YYYY-MM-DD
        raise usage(f"a date must be YYYY-MM-DD: {exc}") from None
    if query == StudyQuery(limit=limit):
        raise usage(
            "give at least one of --accession(-file), --patient-id/--patient-file, --date-from/"
            "--date-to, --modality, --description: an empty query would list the whole archive"
        )
    if not list_only and out.exists() and not force:  # said before anything is pulled
        raise usage(f"{out} exists: give --force to replace it, or another --out")
    settings = get_settings()
    rows: list[Any] = []
    issues: list[Any] = []
    try:
        if diagnoses is not None:
            rows, issues = read_diagnoses(diagnoses)
        client = open_client(pacs, settings)
    except (PacsConfigError, CohortError) as exc:
        raise usage(str(exc)) from None
    try:
        try:
            matches = client.find_studies(query)
        except PacsRequestError as exc:
            err.print(f"[red]error[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(1) from None
        cohort = found_cohort(pacs, matches, name or "case", query.limit)
        if cohort.limit_reached:
            err.print(
                f"[yellow]warning[/yellow] the archive listed {query.limit} studies, the "
                "--limit: there may be more; narrow the query or raise --limit",
                soft_wrap=True,
            )
        if not as_json:
            _print_matches(cohort)
        if not list_only and matches:
            _pull(client, cohort, Path(settings.data_dir) / "cache", quiet=as_json)
    finally:
        client.close()
    if diagnoses is not None:
        # every study found, pulled or not: a row of a study that failed is not "no study"
        cohort.issues = issues + join_diagnoses(cohort.studies, rows)
    if not list_only and matches:
        try:
            write_manifest(out, cohort, name, force, by_uid)
            cohort.manifest = out
        except CohortError as exc:
            err.print(f"[red]error[/red] {escape(str(exc))}", soft_wrap=True)
    if as_json:
        typer.echo(cohort.model_dump_json(indent=2))
    else:
        _print_outcome(cohort, list_only)
    if cohort.failed or (not list_only and matches and cohort.manifest is None):
        raise typer.Exit(1)


def _print_matches(cohort: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{len(cohort.studies)} studies on {escape(cohort.pacs)}")
    # ids, dates and counts whole; the description (and the accession) wrap
    table.add_column("case", no_wrap=True)
    table.add_column("accession", overflow="fold")
    table.add_column("date", no_wrap=True)
    table.add_column("modalities", no_wrap=True)
    table.add_column("description", overflow="fold", ratio=1)
    table.add_column("series", no_wrap=True, justify="right")
    table.add_column("instances", no_wrap=True, justify="right")
    for s in cohort.studies:
        m = s.match
        table.add_row(
            escape(s.case_id),
            escape(m.accession),
            str(m.study_date or ""),
            escape("/".join(m.modalities)),
            escape(m.description[:60]),
            str(m.n_series if m.n_series is not None else "?"),
            str(m.n_instances if m.n_instances is not None else "?"),
        )
    # wide enough for whole case ids and descriptions when the output is a pipe or a log
    import sys

    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 140).print(table)


def _pull(client: Any, cohort: Any, cache_root: Path, quiet: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from gateway.pacs.cohort import retrieve_cohort

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=cli_console(stderr=True),
        disable=quiet,
    )
    tasks: dict[str, Any] = {}

    def on_study(s: Any, done: int, total: int | None) -> None:
        if s.case_id not in tasks:
            tasks[s.case_id] = bar.add_task(f"pulling {s.case_id}", total=total)
        bar.update(tasks[s.case_id], completed=done, total=total)

    with bar:
        retrieve_cohort(client, cohort.studies, cache_root, on_study)


def _print_outcome(cohort: Any, list_only: bool) -> None:
    err = cli_console(stderr=True)
    if not cohort.studies:
        err.print("no study on the PACS matches the query: nothing pulled, no manifest written")
    for s in cohort.studies:
        r = s.retrieved
        if s.error:
            err.print(
                f"[red]not pulled[/red] {escape(s.case_id)}: {escape(s.error)}", soft_wrap=True
            )
        elif r is not None:
            how = "already in the cache" if r.cached else f"{r.n_files} files in {r.seconds:.1f} s"
            console.print(f"{escape(s.case_id)}: {how}", soft_wrap=True)
            for line in [*r.failed, *r.rejected][:20]:
                console.print(f"  [yellow]left out[/yellow] {escape(line)}", soft_wrap=True)
    for issue in cohort.issues:
        console.print(f"[yellow]diagnoses[/yellow] {escape(str(issue))}", soft_wrap=True)
    if cohort.manifest is not None:
        joined = sum(1 for s in cohort.studies if s.truth)
        console.print(
            f"[green]wrote {escape(str(cohort.manifest))}[/green]: "
            f"{sum(1 for s in cohort.studies if not s.error)} cases, {joined} with a diagnosis; "
            f"next: neurosandbox cases check {escape(str(cohort.manifest))}",
            soft_wrap=True,
        )
    elif list_only:
        console.print("--list-only: nothing pulled, nothing written")
