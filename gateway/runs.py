"""Gateway runs on disk: one folder per run (record, report JSON/HTML/PDF, images, SR copies)
and one state file per study (what was uploaded and evaluated, the report version).

Interim store until the evaluation engine's SQLite run store exists; records are pydantic and
every write is atomic (temp file, rename).
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from gateway.cache import atomic_writer
from gateway.routing import Route

if TYPE_CHECKING:
    from gateway.results import EvaluationResult

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


class RunRecord(BaseModel):
    run_id: str
    trigger: str  # dicom | orthanc | api
    status: RunStatus = RunStatus.QUEUED
    stage: str = "queued"
    progress: float = 0.0
    study_uid: str | None = None
    orthanc_study_id: str | None = None
    route: Route | None = None
    requested_by: str | None = None  # token id (never the token)
    n_instances: int = 0
    version: int | None = None
    sr_sop_uids: list[str] = Field(default_factory=list)
    pdf_sop_uid: str | None = None
    created_at: str = Field(default_factory=now_iso)
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    timings_s: dict[str, float] = Field(default_factory=dict)  # stage -> seconds since start


class StudyState(BaseModel):
    study_uid: str
    version: int = 0
    evaluated_digest: str | None = None  # the instances and the rule last evaluated
    evaluated_instances: str | None = None  # the instances alone (sop_digest)
    uploaded: list[str] = Field(default_factory=list)  # SOP Instance UIDs stored in Orthanc
    sr_paths: list[str] = Field(default_factory=list)  # local copies of the latest SRs
    last_run_id: str | None = None


class RunNotFoundError(KeyError):
    """No run with this id."""


class StudyRunStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs_dir = root / "runs"
        self.state_dir = root / "state" / "studies"
        self._lock = threading.Lock()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise RunNotFoundError(run_id)
        return self.runs_dir / run_id

    def _write(self, path: Path, text: str) -> None:
        with atomic_writer(path, fsync=False) as fh:
            fh.write(text.encode())

    # ----------------------------------------------------------------- runs

    def create(self, record: RunRecord) -> RunRecord:
        d = self.run_dir(record.run_id)
        d.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._write(d / "run.json", record.model_dump_json(indent=2))
        return record

    def get(self, run_id: str) -> RunRecord:
        try:
            path = self.run_dir(run_id) / "run.json"
            return RunRecord.model_validate_json(path.read_text())
        except (OSError, RunNotFoundError):
            raise RunNotFoundError(run_id) from None

    def update(self, run_id: str, **changes: Any) -> RunRecord:
        with self._lock:
            rec = self.get(run_id)
            if changes.get("status") is RunStatus.RUNNING and rec.started_at is None:
                changes["started_at"] = now_iso()
            rec = rec.model_copy(update=changes)
            RunRecord.model_validate(rec.model_dump())
            self._write(self.run_dir(run_id) / "run.json", rec.model_dump_json(indent=2))
        return rec

    def finish(self, run_id: str, status: RunStatus, **changes: Any) -> RunRecord:
        progress = 1.0 if status is RunStatus.DONE else self.get(run_id).progress
        return self.update(
            run_id,
            status=status,
            stage=status.value,
            progress=progress,
            finished_at=now_iso(),
            **changes,
        )

    def list(self, limit: int = 100, study_uid: str | None = None) -> list[RunRecord]:
        paths = sorted(
            self.runs_dir.glob("*/run.json"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        out = []
        for p in paths:
            try:
                rec = RunRecord.model_validate_json(p.read_text())
            except (OSError, ValueError):
                continue
            if study_uid is None or rec.study_uid == study_uid:
                out.append(rec)
            if len(out) >= limit:
                break
        return out

    def write_report(
        self, run_id: str, result: EvaluationResult, html: str = "", pdf: bytes | None = None
    ) -> None:
        """The run's result, and its checklist page and print (when there are)."""
        d = self.run_dir(run_id)
        self._write(d / "report.json", result.model_dump_json(indent=2))
        if html:
            self._write(d / "report.html", html)
        if pdf:
            with atomic_writer(d / "report.pdf", fsync=False) as fh:
                fh.write(pdf)

    def report_path(self, run_id: str, kind: str) -> Path:
        path = self.run_dir(run_id) / f"report.{kind}"
        if kind not in ("json", "html", "pdf") or not path.exists():
            raise RunNotFoundError(f"{run_id}/report.{kind}")
        return path

    # ----------------------------------------------------------------- study state

    def _state_path(self, study_uid: str) -> Path:
        return self.state_dir / f"{hashlib.sha256(study_uid.encode()).hexdigest()[:32]}.json"

    def study_state(self, study_uid: str) -> StudyState:
        path = self._state_path(study_uid)
        if path.exists():
            return StudyState.model_validate_json(path.read_text())
        return StudyState(study_uid=study_uid)

    def save_study_state(self, state: StudyState) -> None:
        with self._lock:
            self._write(self._state_path(state.study_uid), state.model_dump_json(indent=2))
