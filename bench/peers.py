"""A benchmark's peer that cannot live in the project's venv (its pins conflict, or it is no
dependency of the project): a venv of its own under .venv/, made with pip on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peer_python(given: str | None, name: str, packages: list[str]) -> str:
    """``given`` (a python the user named), else the python of ``.venv/<name>``, created with
    ``packages`` installed when it is not there yet."""
    if given:
        return given
    venv = ROOT / ".venv" / name
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"creating the peer venv {venv} (pip: {' '.join(packages)}) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *packages], check=True)
    return str(py)
