"""``neurosandbox cases``: a hospital case manifest checked before a run, and its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

cases_app = typer.Typer(
    help="Check a case manifest (your own studies) before a run; print its JSON Schema.",
    no_args_is_help=True,
)
console = Console()  # the report (stdout)


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
    from evaluation import check_manifest

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
def cases_schema() -> None:
    """Print the JSON Schema of a case manifest (docs/manifest.schema.json is this output)."""
    from evaluation import manifest_schema

    typer.echo(json.dumps(manifest_schema(), indent=2, sort_keys=True))
