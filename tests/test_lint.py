"""The packages type-check: mypy as `make lint` runs it (its settings in pyproject.toml).

Measured on the 2-core development machine: about 16 s with an empty cache (the model libraries
are not followed: pyproject.toml), about 4 s with the
warm ``.mypy_cache`` a previous run (or ``make lint``) leaves in the checkout.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_packages_type_check() -> None:
    mypy = Path(sys.executable).with_name("mypy")
    out = subprocess.run(
        [str(mypy)], cwd=ROOT, capture_output=True, text=True, check=False, timeout=600
    )
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    # it checked the packages pyproject.toml names, not an empty selection
    checked = re.search(r"no issues found in (\d+) source files", out.stdout)
    assert checked and int(checked.group(1)) > 100, out.stdout[-2000:]
