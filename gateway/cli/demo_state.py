"""What a second ``neurosandbox demo`` may reuse from the first: the run, the report, the write-back.

A run is reused when its inputs are the same: the suite manifest, the models, the samples, and
the project's own source code (a digest of its files, so an edited scorer or template makes a
fresh run). The report is reused when it was written from that run; the write-back when every
instance it stored is still in Orthanc. Each is recorded in a small JSON file next to what it
describes, written after the step succeeded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

RUN_MARK = "demo-inputs.json"
REPORT_MARK = ".demo-report.json"
WRITEBACK_MARK = "demo-writeback.json"
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


def reusable_run(runs: Path, inputs: dict[str, Any]) -> Path | None:
    """The newest complete run made from these inputs, if any."""
    from evaluation import RunStore

    if not runs.is_dir():
        return None
    for run_dir in sorted((d for d in runs.iterdir() if d.is_dir()), reverse=True):
        if _read(run_dir / RUN_MARK) != inputs or not (run_dir / "run.sqlite").exists():
            continue
        store = RunStore(run_dir)
        try:
            row = store.run_row()
        finally:
            store.close()
        if row.status == "complete":
            return run_dir
    return None


def mark_run(run_dir: Path, inputs: dict[str, Any]) -> None:
    (run_dir / RUN_MARK).write_text(json.dumps(inputs, indent=2))


def report_is_current(report_dir: Path, run_dir: Path) -> bool:
    mark = _read(report_dir / REPORT_MARK)
    return (
        isinstance(mark, dict)
        and mark.get("run") == run_dir.resolve().name
        and (report_dir / "summary.html").exists()
    )


def mark_report(report_dir: Path, run_dir: Path) -> None:
    (report_dir / REPORT_MARK).write_text(json.dumps({"run": run_dir.resolve().name}))


def written_back(run_dir: Path, exists: Any) -> int | None:
    """How many instances an earlier write-back of this run stored, if all are still there.

    ``exists(orthanc_id) -> bool`` asks the PACS.
    """
    mark = _read(run_dir / WRITEBACK_MARK)
    ids = mark.get("instances") if isinstance(mark, dict) else None
    if not ids or not all(isinstance(i, str) and exists(i) for i in ids):
        return None
    return len(ids)


def mark_written_back(run_dir: Path, instance_ids: list[str]) -> None:
    (run_dir / WRITEBACK_MARK).write_text(json.dumps({"instances": instance_ids}, indent=2))
