"""Every command's help, walked through click's command tree: a flag takes no value, so it
shows no value type (typer 0.29's rich help printed `--keep <bool>` and `--help <bool>`); every
option says what it does; every group lists all its commands."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from gateway.cli import app


def commands() -> Iterator[tuple[list[str], Any]]:
    """(path, command) for the root, every group and every command, depth first."""
    root = typer.main.get_command(app)

    def walk(path: list[str], cmd: Any) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk([*path, name], sub)

    return walk([], root)


ALL = list(commands())


def help_text(path: list[str], columns: int = 80) -> str:
    r = CliRunner().invoke(
        app, [*path, "--help"], env={"COLUMNS": str(columns)}, terminal_width=columns
    )
    assert r.exit_code == 0, (path, r.output)
    return r.output


def test_the_walk_reaches_every_command() -> None:
    names = {" ".join(p) for p, _ in ALL}
    assert {
        "",
        "inspect",
        "render",
        "demo",
        "runs",
        "runs show",
        "pacs up",
        "tokens create",
    } <= names


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(p) or "neurosandbox")
def test_no_flag_shows_a_value_type(path: list[str]) -> None:
    text = help_text(path)
    assert "<bool>" not in text, text
    assert "--help" in text


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(p) or "neurosandbox")
def test_value_options_still_show_their_type(path: list[str]) -> None:
    """The fix hides the type of flags only: an option taking a value still says which."""
    cmd = dict((tuple(p), c) for p, c in ALL)[tuple(path)]
    text = help_text(path, columns=200)
    for p in cmd.params:
        if p.param_type_name == "option" and not p.is_flag and not p.hidden:
            entry = re.compile(r"^[│\s*]*" + re.escape(p.opts[0]) + r"(?=[\s,])")
            line = next(line for line in text.splitlines() if entry.match(line))
            assert re.search(r"<[^>]+>", line), line


def test_every_option_has_help() -> None:
    missing = []
    for path, cmd in ALL:
        ctx = typer.main._click.Context(cmd) if hasattr(typer.main, "_click") else None
        for p in cmd.get_params(ctx):
            if p.param_type_name != "option" or p.hidden:
                continue
            if not (p.help or "").strip():
                missing.append(f"{' '.join(path) or 'neurosandbox'} {p.opts[0]}")
    assert not missing, "options without help: " + ", ".join(missing)


def test_every_group_lists_all_its_commands() -> None:
    for path, cmd in ALL:
        subs = getattr(cmd, "commands", None)
        if not subs:
            continue
        text = help_text(path)
        listed = commands_panel(text)
        shown = {name for name, sub in subs.items() if not sub.hidden}
        assert shown <= listed, (path, shown - listed)


def commands_panel(text: str) -> set[str]:
    """The command names in the help's Commands panel (first word of each entry)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Commands" in line)
    names = set()
    for line in lines[start + 1 :]:
        body = line.strip("│ ").strip()
        if line.lstrip().startswith("╰"):
            break
        if line.startswith("│ ") and not line.startswith("│  ") and body:
            names.add(body.split()[0])
    return names
