"""``neurosandbox cases``: a hospital case manifest checked before a run, and its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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
    study, record or note file it names that is not there. Reads no pixel data and fetches
    nothing from Orthanc. Exit code 0: every case is fine; 1: any problem."""
    from evaluation.datasets import check_manifest

    report = check_manifest(manifest)
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
