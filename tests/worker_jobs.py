"""Evaluators that a spawned evaluation worker runs in tests (tests/test_run_deadline_worker.py).

The worker imports this module to unpickle its evaluator, so it imports nothing heavy: a test
module importing the pipeline cost the worker seconds (tens on a loaded machine) before it even
started its job, eating into the deadline under test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dicom import IndexResult
    from gateway.routing import Route
    from gateway.runs.results import EvaluationResult


class Stuck:
    """Starts a grandchild (its pid in work_dir/child.pid), then never returns."""

    name = "stuck"

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        child = subprocess.Popen(["sleep", "600"])
        (work_dir / "child.pid").write_text(str(child.pid))
        time.sleep(600)
        raise AssertionError("not reached")


class Broken:
    name = "broken"

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        raise ValueError("no DICOM series in the study folder")


class Warmed:
    """Records in which process and when it was warmed and when it evaluated."""

    name = "warmed"

    def __init__(self, log: Path) -> None:
        self.log = log

    def warm(self) -> None:
        with self.log.open("a") as fh:
            fh.write(f"warm {os.getpid()} {time.time()}\n")

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        with self.log.open("a") as fh:
            fh.write(f"evaluate {os.getpid()} {time.time()}\n")
        raise ValueError(f"evaluated in {os.getpid()}")


class SlowStart:
    """A worker that takes long to start (its warm-up hangs) before it reads its job."""

    name = "slow-start"

    def warm(self) -> None:
        time.sleep(40)

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult:
        raise AssertionError("not reached within the deadline")
