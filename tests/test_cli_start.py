"""The command line imports a command's modules only when that command runs: every process the
gateway, the tests and a user start pays for its own command, not for all of them."""

from __future__ import annotations

import math
import os
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


def _loaded(code: str, modules: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """A new interpreter runs ``code``, then prints which of ``modules`` it imported."""
    probe = f"import sys\n{code}print(sorted(m for m in {modules!r} if m in sys.modules))\n"
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )


def test_a_command_imports_its_own_modules_only() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Commands" in done.stdout  # pacs's help was drawn
    assert "heavy: []" in done.stderr, done.stderr


def test_a_leaderboards_intervals_do_not_import_scipy_stats() -> None:
    """Every run summary and `runs show` computes Wilson intervals: scipy.stats (0.5 s of CPU)
    is imported only by what needs it (McNemar's test), and each interval is what it was, to
    the bit."""
    from scipy import stats as st

    from evaluation.scoring.stats import wilson

    for successes, n, confidence in [(3, 10, 0.95), (0, 7, 0.95), (41, 50, 0.9), (5, 9, 0.99)]:
        z = float(st.norm.ppf(0.5 + confidence / 2))  # the quantile as it was computed
        p = successes / n
        denom = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / denom
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
        got = wilson(successes, n, confidence)
        assert got.high == min(1.0, centre + half), (successes, n, confidence)
        assert got.low == (0.0 if successes == 0 else max(0.0, centre - half))
    done = _loaded(
        "import evaluation.scoring, evaluation.parsing\n"
        "from evaluation.scoring.stats import wilson\n"
        "wilson(3, 10)\n",
        ("scipy.stats", "scipy.optimize"),
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_service_starts_without_the_plotting_and_statistics_libraries() -> None:
    """`neurosandbox serve` and every gateway a test starts: matplotlib (drawn only when a run
    summary or the runs page's trend is asked for) and scipy.stats are not imported with it."""
    done = _loaded("import gateway.cli.serve, gateway.serve\n", ("matplotlib", "scipy.stats"))
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_what_every_command_runs_first_reads_no_dicom_library() -> None:
    """The root callback (settings, then each library's start-time configuration) runs before
    every command: it imports neither pydicom nor numpy, which a command that reads no DICOM
    (`pacs status`, `runs show`, `db upgrade`) would otherwise pay for."""
    probe = (
        "import sys\n"
        "from gateway.settings import get_settings\n"
        "from gateway.startup import configure_libraries\n"
        "configure_libraries(get_settings())\n"
        "print(sorted(m for m in ('pydicom', 'numpy') if m in sys.modules))\n"
        "from dicom.headers.cache import default_cache_dir\n"  # the read sees the folder set
        "assert default_cache_dir() == get_settings().header_cache, default_cache_dir()\n"
    )
    env = {**os.environ, "NEUROSANDBOX_HEADER_CACHE": "/nonexistent/header-cache"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
