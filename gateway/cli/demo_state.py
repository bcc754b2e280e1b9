"""What a second ``neurosandbox demo`` may reuse from the first: the gateway's runs, the report.

A case's gateway run is reused when the demo's inputs are the same (the suite manifest, the
models, the samples, and the project's own source code: a digest of its files, so an edited
scorer or template evaluates again), the run is done, its report bundle is on disk and its SRs
are still in Orthanc. The report is reused when it was written from those runs. Each is
recorded in a small JSON file next to what it describes, written after the step succeeded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

GATEWAY_MARK = "demo-runs.json"  # in the demo's folder: its inputs and each case's gateway run
REPORT_MARK = ".demo-report.json"
_PACKAGES = ("dicom", "evaluation", "gateway")
_SOURCE_SUFFIXES = (".py", ".j2", ".json", ".yaml", ".css", ".js")


def source_digest() -> str:
    """SHA-256 over the project's source files (code, templates, schemas), by relative path."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        for f in sorted((root / pkg).rglob("*")):
            if f.suffix in _SOURCE_SUFFIXES and f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(root)).encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def run_inputs(suite: Path, models: list[str], samples: int) -> dict[str, Any]:
    manifest = suite / "suite.json"
    return {
        "suite": hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.exists() else None,
        "models": models,
        "samples": samples,
        "source": source_digest(),
    }


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_mark(path: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """The gateway runs an earlier demo recorded (case id -> run id), if made from ``inputs``."""
    mark = _read(path)
    if (
        isinstance(mark, dict)
        and mark.get("inputs") == inputs
        and isinstance(mark.get("cases"), dict)
    ):
        return mark
    return {}


def write_mark(path: Path, inputs: dict[str, Any], runs: dict[str, str]) -> None:
    path.write_text(json.dumps({"inputs": inputs, "cases": runs}, indent=2))


def report_is_current(report_dir: Path, run_id: str) -> bool:
    mark = _read(report_dir / REPORT_MARK)
    return (
        isinstance(mark, dict)
        and mark.get("run") == run_id
        and (report_dir / "summary.html").exists()
    )


def mark_report(report_dir: Path, run_id: str) -> None:
    (report_dir / REPORT_MARK).write_text(json.dumps({"run": run_id}))
