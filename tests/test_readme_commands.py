"""Every `neurosandbox ...` command the README and its docs pages show is one the CLI has.

The commands are read from the pages (fenced blocks and inline code) and resolved against the
real command tree (typer's click commands): each subcommand must exist, and each --option must be
one that command takes. Relative links of those pages must name files that exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from gateway.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
PROGRAM = re.compile(r"(?:^|\s)(?:\.venv/bin/)?neurosandbox(\s.*)?$")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _command_lines(text: str) -> list[str]:
    """Command lines in fenced blocks (continuations joined) and in inline code spans."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines += [line.split(" #", 1)[0] for line in joined.splitlines()]
    prose = FENCE.sub("", text)
    lines += [span.replace("\n", " ") for span in INLINE.findall(prose)]
    found = []
    for line in lines:
        m = PROGRAM.search(line.strip())
        if m:
            found.append("neurosandbox" + (m.group(1) or ""))
    return found


def _options(cmd: Any) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        names.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return names


def _check(line: str, root: Any) -> list[str]:
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        words = line.split()[1:]
    cmd = root
    problems: list[str] = []
    i = 0
    # typer's commands are its own click classes: a group is what has subcommands
    while hasattr(cmd, "commands") and i < len(words) and not words[i].startswith("-"):
        names = words[i].split("|")
        unknown = [n for n in names if n not in cmd.commands]
        if unknown:
            # a placeholder such as COMMAND or NAME ends the walk; a lowercase word is a typo
            if all(n.isupper() for n in names):
                return problems
            return [f"{line!r}: no command {unknown} under {cmd.name!r}"]
        if len(names) > 1:
            return problems
        cmd = cmd.commands[names[0]]
        i += 1
    known = _options(cmd)
    for word in words[i:]:
        if word.startswith("--"):
            opt = word.split("=", 1)[0]
            if opt not in known:
                problems.append(f"{line!r}: {cmd.name!r} has no option {opt}")
    return problems


def test_the_pages_show_commands() -> None:
    # the walk below would pass on pages with no commands at all
    assert len(_command_lines((ROOT / "README.md").read_text(encoding="utf-8"))) >= 15


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_shown_exists_with_its_options(page: Path) -> None:
    root = typer.main.get_command(app)
    problems = [
        p for line in _command_lines(page.read_text(encoding="utf-8")) for p in _check(line, root)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_a_file(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name}: links to missing files {missing}"
