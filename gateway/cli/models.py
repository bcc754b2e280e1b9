"""``neurosandbox models check NAME``: one tiny request, and what works, before a long run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import cli_console

models_app = typer.Typer(help="Check the models a run will call.", no_args_is_help=True)
console = cli_console()
notes = cli_console(stderr=True)  # notes and errors: stdout stays the report (--json parses)
MARK = {
    "ok": "[green]ok[/green]  ",
    "info": "[dim]info[/dim]",
    "warn": "[yellow]WARN[/yellow]",
    "fail": "[red]FAIL[/red]",
}


@models_app.command("check")
def models_check(
    name: Annotated[str, typer.Argument(help="model name (from the models file) or litellm name")],
    models_file: Annotated[
        Path | None, typer.Option("--models-file", help="YAML/JSON model specs")
    ] = None,
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="endpoint, when NAME is not in a models file")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="environment variable holding the API key")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the call")] = 60.0,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="warnings (JSON mode, an unknown price) fail the check too"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Send one tiny image + JSON-mode request; report reachability, images, JSON, cost, latency.

    Each line is ok, info, WARN (a run works, with less: no JSON mode, an unknown price) or FAIL;
    the command exits 1 exactly when a line says FAIL (with --strict, warnings are failures)."""
    from evaluation import ModelConfigError
    from evaluation.models import check_model, load_models_file, resolve_specs
    from gateway.settings import get_settings

    settings = get_settings()
    models_file = models_file or settings.models_file
    try:
        if models_file and name not in load_models_file(models_file):
            notes.print(
                f"[dim]{escape(name)} is not in {models_file}: used as a litellm name[/dim]"
            )
        (spec,) = resolve_specs(
            [name],
            models_file=models_file,
            api_base=api_base or settings.api_base,
            api_key_env=api_key_env,
        )
    except ModelConfigError as exc:
        notes.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    report = asyncio.run(check_model(spec, timeout_s=timeout, strict=strict))
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        where = report.api_base or "provider default endpoint"
        console.print(
            f"[bold]{escape(report.name)}[/bold]: {escape(report.model)} "
            f"({report.family}, {escape(where)})"
        )
        for item in report.items:
            console.print(
                f"  {MARK[item.level]} {item.name:<11} {escape(item.detail)}", soft_wrap=True
            )
        warned = any(i.level == "warn" for i in report.items)
        verdict = (
            "[red]does not work[/red]"
            if not report.ok
            else "[green]works[/green]" + (", with the warnings above" if warned else "")
        )
        console.print(f"{escape(report.name)} {verdict}")
    if not report.ok:
        raise typer.Exit(1)
