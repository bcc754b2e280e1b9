"""The `neurosandbox` command line: the composition root, one module per command group.

Commands read the settings (gateway.settings) and call the libraries with explicit arguments.
"""

from __future__ import annotations

import typer

from gateway.cli.canary import canary_command
from gateway.cli.cases import cases_app
from gateway.cli.db import db_app
from gateway.cli.demo import demo_command
from gateway.cli.eval import eval_command
from gateway.cli.export import export_case_command
from gateway.cli.help_format import flags_take_no_value
from gateway.cli.imaging import inspect, render
from gateway.cli.models import models_app
from gateway.cli.pacs import pacs_app
from gateway.cli.phantoms import phantoms_command
from gateway.cli.purge import purge_command
from gateway.cli.report import pilot_report_command, report_command
from gateway.cli.runs import runs_app
from gateway.cli.serve import serve_command
from gateway.cli.tokens import tokens_app
from gateway.cli.worker import worker_command

flags_take_no_value()
app = typer.Typer(
    help="NeuroSandbox: evaluate vision-language models on neuro MRI/CT from a PACS.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _start() -> None:
    """Before any command: the libraries get their start-time settings (gateway/startup.py)."""
    from pydantic import ValidationError

    from gateway.settings import get_settings
    from gateway.startup import configure_libraries

    try:
        settings = get_settings()
    except ValidationError:
        return  # a command that reads the settings says what is wrong with them
    configure_libraries(settings)


app.command("inspect")(inspect)
app.command("render")(render)
app.command("demo")(demo_command)
app.add_typer(pacs_app, name="pacs")
app.add_typer(tokens_app, name="tokens")
app.command("serve")(serve_command)
app.command("report")(report_command)
app.command("pilot-report")(pilot_report_command)
app.command("phantoms")(phantoms_command)
app.command("eval")(eval_command)
app.command("canary")(canary_command)
app.command("export-case")(export_case_command)
app.add_typer(runs_app, name="runs")
app.add_typer(models_app, name="models")
app.add_typer(cases_app, name="cases")
app.command("purge")(purge_command)
app.add_typer(db_app, name="db")
app.command("worker")(worker_command)


def main() -> None:  # pragma: no cover
    app()
