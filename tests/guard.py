"""Run a command as a guarded child: its wall time and peak memory, measured by the kernel.

The guards of issue 22 (every hostile input answered within 30 s, peak RSS under the memory
cap plus 300 MB) are bounds on behaviour, not performance targets."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / ".venv" / "bin" / "neurosandbox")
ANSWER_S = 30.0
RSS_MARGIN = 300 << 20


@dataclass
class Guarded:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int  # bytes, the child's (and its waited-for children's) high-water mark


def run_guarded(
    args: list[str], *, timeout: float = ANSWER_S, env: dict[str, str] | None = None
) -> Guarded:
    """Run ``args``; kill it (and fail) past ``timeout`` seconds."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"guard-{os.getpid()}-{time.monotonic_ns()}"
    t0 = time.monotonic()
    with open(f"{out_path}.out", "w+") as out, open(f"{out_path}.err", "w+") as err:
        proc = subprocess.Popen(
            args, stdout=out, stderr=err, env={**os.environ, **(env or {})},
            start_new_session=True,
        )  # fmt: skip
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                raise AssertionError(f"{args} not answered within {timeout:.0f} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        result = Guarded(proc.returncode, out.read(), err.read(), seconds, usage.ru_maxrss * 1024)
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink(missing_ok=True)
    return result
