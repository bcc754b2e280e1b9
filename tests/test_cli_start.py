"""The command line imports a command's modules only when that command runs: every process the
gateway, the tests and a user start pays for its own command, not for all of them."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from gateway.cli import app
try:
    app(["pacs", "--help"])
except SystemExit as stop:
    assert stop.code == 0, stop.code
heavy = [m for m in ("gateway.cli.eval", "gateway.cli.demo", "gateway.cli.serve", "scipy")
         if m in sys.modules]
print("heavy:", heavy, file=sys.stderr)
"""


def test_a_command_imports_its_own_modules_only() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Commands" in done.stdout  # pacs's help was drawn
    assert "heavy: []" in done.stderr, done.stderr
