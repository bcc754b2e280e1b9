"""The `neurosandbox` command line: the composition root, one module per command group.

Commands read the settings (gateway.settings) and call the libraries with explicit arguments.
Each command's module is imported when that command runs (or its help is drawn), not at start:
`neurosandbox runs list` does not import the scoring statistics, the engine or the server.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer import _click as click  # typer 0.29 carries its own click: its types
from typer.core import TyperGroup
from typer.models import CommandInfo, TyperInfo

from gateway.cli.help_format import flags_take_no_value

# name -> (module, attribute): a typer.Typer is a command group, a function a command.
# In this order in `neurosandbox --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("gateway.cli.imaging", "inspect"),
    "render": ("gateway.cli.imaging", "render"),
    "demo": ("gateway.cli.demo", "demo_command"),
    "pacs": ("gateway.cli.pacs", "pacs_app"),
    "tokens": ("gateway.cli.tokens", "tokens_app"),
    "serve": ("gateway.cli.serve", "serve_command"),
    "report": ("gateway.cli.report", "report_command"),
    "pilot-report": ("gateway.cli.report", "pilot_report_command"),
    "phantoms": ("gateway.cli.phantoms", "phantoms_command"),
    "eval": ("gateway.cli.eval", "eval_command"),
    "canary": ("gateway.cli.canary", "canary_command"),
    "export-case": ("gateway.cli.export", "export_case_command"),
    "runs": ("gateway.cli.runs", "runs_app"),
    "models": ("gateway.cli.models", "models_app"),
    "cases": ("gateway.cli.cases", "cases_app"),
    "purge": ("gateway.cli.purge", "purge_command"),
    "db": ("gateway.cli.db", "db_app"),
    "worker": ("gateway.cli.worker", "worker_command"),
}


def _build(name: str) -> click.Command:
    """The click command for ``name``, built from its module as `app.command`/`add_typer` would."""
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer()
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
        info: TyperInfo = holder.registered_groups[0]
        group: click.Command = typer.main.get_group_from_info(
            info,
            pretty_exceptions_short=app.pretty_exceptions_short,
            suggest_commands=app.suggest_commands,
            rich_markup_mode=app.rich_markup_mode,
        )
        return group
    holder.command(name)(target)
    command: CommandInfo = holder.registered_commands[0]
    return typer.main.get_command_from_info(
        command,
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
    )


class _Commands(MutableMapping[str, click.Command]):
    """The root group's commands: every name listed, each built the first time it is looked up."""

    def __init__(self, built: MutableMapping[str, click.Command]) -> None:
        self._built = dict(built)

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = _build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._built.keys())


class _LazyGroup(TyperGroup):
    """The root group, its commands imported on first use (see ``COMMANDS``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # the names, without importing a command


flags_take_no_value()
app = typer.Typer(
    cls=_LazyGroup,
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


def main() -> None:  # pragma: no cover
    app()
