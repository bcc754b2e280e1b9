"""Run a command as a guarded child: its wall time and peak memory, measured by the kernel;
and a server child started for a test: waited for until healthy, stopped by PID.

The guards of issue 22 (every hostile input answered within 30 s, peak RSS under the memory
cap plus 300 MB) are bounds on behaviour, not performance targets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

CLI = str(Path(sys.executable).with_name("neurosandbox"))
ANSWER_S = 30.0
RSS_MARGIN = 300 << 20


@dataclass
class Guarded:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int  # bytes: the highest VmHWM of the command or any process it started


class Proc(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    cmd: str  # the command line, arguments joined by spaces


def procs() -> list[Proc]:
    """Every live (not zombie) process, from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state ppid pgrp ...
        if fields[0] != "Z":
            out.append(Proc(int(d.name), int(fields[1]), int(fields[2]), cmd))
    return out


def spawned_workers(parent: int) -> set[int]:
    """The evaluation worker processes of ``parent`` (its spawned children)."""
    return {pid for pid, ppid, _, cmd in procs() if ppid == parent and "spawn_main" in cmd}


def await_spawned_workers(parent: int, count: int, timeout_s: float = 60) -> set[int]:
    """The workers once ``count`` are seen. A spawned child shows the parent's command line
    between fork and exec, so a worker just started may not be recognisable yet."""
    until = time.monotonic() + timeout_s
    while len(seen := spawned_workers(parent)) < count and time.monotonic() < until:
        time.sleep(0.05)
    return seen


def _group_hwm(pgid: int) -> int:
    """The largest resident high-water mark (VmHWM) among the processes of group ``pgid``.

    Read from /proc rather than the kernel's ru_maxrss, which for a child forked from a large
    process (pytest, late in a session) counts the parent's pages it held before exec."""
    peak = 0
    for p in procs():
        if p.pgid != pgid:
            continue
        try:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except (OSError, ValueError, IndexError):
            continue
    return peak


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
        peak = 0
        while True:
            peak = max(peak, _group_hwm(proc.pid))  # start_new_session: its own group
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                raise AssertionError(f"{args} not answered within {timeout:.0f} s")
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        result = Guarded(proc.returncode, out.read(), err.read(), seconds, peak)
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink(missing_ok=True)
    return result


def wait_healthy(
    base: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path | None = None
) -> None:
    """Wait for ``base``/health to answer 200; raise if ``proc`` exits first (with the end of
    its ``log``) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # refused, not yet listening, or an HTTP error status
            pass
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}) before healthy\n{tail}")
        time.sleep(0.1)
    raise RuntimeError(f"{base} not healthy within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM ``proc``; SIGKILL it if it has not exited within ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
