"""Gateway runs on disk: one folder per run, ``DATA_DIR/runs/<run id>/``, whose record is the
evaluation engine's run store (``run.sqlite``): the engine records there the run's
configuration, every model call, answer and score, and the gateway its own part under the
note ``gateway`` (``RunRecord``: trigger, status, stage, progress, route, what was written back)
from the moment the study is queued. Beside it: the rendered images the API serves, the SR
copies the next version names as predecessors, and (for a study fetched from Orthanc) the
study. The report of a run is its report bundle in the reports folder (``<reports>/<run id>``,
``rundata.json``: the one result type the review pages, ``neurosandbox report`` and the API's
``/runs/{id}/report.json`` read). One state file per study says what was uploaded and
evaluated and the report version, keyed by the study's UID and patient (``StudyKey``).

A run that has not finished has a marker file, ``state/active/<run id>`` (the run folder holds
its record alone); the gateway's next start marks every run still marked as interrupted
(``mark_interrupted``).

Run ids are time-ordered (32 hex digits: nanoseconds, then random), so the newest runs are
listed without opening every store. Folders of earlier versions (``run.json``) are still read.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sqlite3
import threading
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evaluation import EvaluationError
from evaluation.log import STORE_FILE, RunStore
from evaluation.reports import RUNDATA_FILE
from gateway.cache import atomic_writer
from gateway.routing import Route
from gateway.study_key import StudyKey

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    # not evaluated, on purpose: the study names more than one patient, or is registered as
    # a case of another patient; the reason and the identities say which
    HELD = "held"
    # the gateway stopped (killed, crashed) while this run was queued or running
    INTERRUPTED = "interrupted"


class SkipKind(StrEnum):
    """Why a run was skipped; its text is the run's ``error``."""

    # a study no routing rule selects: never evaluated, listed in the review queue
    NOT_ROUTED = "no routing rule selects this study"
    # the same study again (normal: nothing new to evaluate)
    UNCHANGED = "no new instances since the last evaluation by this rule"
    RESTARTED = "evaluated before the gateway restarted"


FINAL = frozenset(
    {RunStatus.DONE, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.HELD, RunStatus.INTERRUPTED}
)


class RunRecord(BaseModel):
    run_id: str
    trigger: str  # dicom | orthanc | api
    status: RunStatus = RunStatus.QUEUED
    stage: str = "queued"
    progress: float = 0.0
    study_uid: str | None = None
    study_key: str | None = None  # StudyKey.name: the UID with its patient
    orthanc_study_id: str | None = None
    route: Route | None = None
    requested_by: str | None = None  # token id (never the token)
    n_instances: int = 0
    version: int | None = None
    sr_sop_uids: list[str] = Field(default_factory=list)
    pdf_sop_uid: str | None = None
    unverified_sr: dict[str, str] = Field(default_factory=dict)  # model -> its SR's SOP UID
    created_at: str = Field(default_factory=now_iso)
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    skip: SkipKind | None = None  # a skipped run: why (the error says it in words)
    # a held run: every patient identity involved (for the reviewer; never sent to a model)
    identities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    timings_s: dict[str, float] = Field(default_factory=dict)  # stage -> seconds since start


class StudyState(BaseModel):
    study_uid: str
    key: str | None = None  # StudyKey.name (None: a state written before keys had a patient)
    version: int = 0
    evaluated_digest: str | None = None  # the instances and the rule last evaluated
    evaluated_instances: str | None = None  # the instances alone (sop_digest)
    uploaded: list[str] = Field(default_factory=list)  # SOP Instance UIDs stored in Orthanc
    sr_paths: list[str] = Field(default_factory=list)  # local copies of the latest SRs
    # SOP UID -> how often it was re-sent with other bytes and taken (the PACS overwrites)
    revisions: dict[str, int] = Field(default_factory=dict)
    # SOP UID -> the PACS's id of its stored file when last seen (Orthanc's attachment UUID)
    files: dict[str, str] = Field(default_factory=dict)
    last_run_id: str | None = None


class RunNotFoundError(KeyError):
    """No run with this id."""


GATEWAY_NOTE = "gateway"  # the run store's note holding the gateway's RunRecord
_LEGACY_RECORD = "run.json"  # where versions before the run store kept the RunRecord


def record_of(store: RunStore) -> RunRecord | None:
    """The gateway's record of a run, from its run store (None: none recorded). Raises
    ``ValueError`` for a record that does not validate."""
    text = store.note(GATEWAY_NOTE)
    return RunRecord.model_validate_json(text) if text is not None else None


def _changed(rec: RunRecord, changes: dict[str, Any]) -> RunRecord:
    if changes.get("status") is RunStatus.RUNNING and rec.started_at is None:
        changes = {**changes, "started_at": now_iso()}
    out = rec.model_copy(update=changes)
    RunRecord.model_validate(out.model_dump())
    return out


class StudyRunStore:
    def __init__(self, root: Path, reports_dir: Path | None = None) -> None:
        self.root = root
        self.runs_dir = root / "runs"
        self.state_dir = root / "state" / "studies"
        self.active_dir = root / "state" / "active"  # a marker per run not yet finished
        # where the run's report bundle is published (Settings.reports_root)
        self.reports_dir = reports_dir or root / "reports"
        self._lock = threading.Lock()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def new_id() -> str:
        """A new run id: the time in nanoseconds, then random (newest sorts last)."""
        return f"{time.time_ns():016x}{secrets.token_hex(8)}"

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise RunNotFoundError(run_id)
        return self.runs_dir / run_id

    def store_path(self, run_id: str) -> Path:
        """The run's record: the engine's run store."""
        return self.run_dir(run_id) / STORE_FILE

    def _write(self, path: Path, text: str) -> None:
        with atomic_writer(path, fsync=False) as fh:
            fh.write(text.encode())

    # ----------------------------------------------------------------- runs

    def create(self, record: RunRecord) -> RunRecord:
        folder = self.run_dir(record.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        if record.status not in FINAL:
            self.active_dir.mkdir(parents=True, exist_ok=True)
            (self.active_dir / record.run_id).touch()
        with self._lock, RunStore(folder, create=True) as store:
            store.set_note(GATEWAY_NOTE, record.model_dump_json())
        return record

    def mark_interrupted(self) -> list[str]:
        """At start: every run a previous process left queued or running is interrupted (its
        marker says so without opening every run). Returns their ids."""
        done = []
        markers = sorted(self.active_dir.iterdir()) if self.active_dir.is_dir() else []
        for marker in markers:
            run_id = marker.name
            try:
                rec = self.get(run_id)
                if rec.status not in FINAL:
                    self.finish(
                        run_id,
                        RunStatus.INTERRUPTED,
                        error=f"the gateway stopped during this run ({rec.stage}); "
                        "it was not finished and nothing of it was written back after that",
                    )
                    done.append(run_id)
            except RunNotFoundError:
                pass
            marker.unlink(missing_ok=True)
        return done

    def get(self, run_id: str) -> RunRecord:
        folder = self.run_dir(run_id)
        try:
            if (folder / STORE_FILE).is_file():
                with RunStore(folder) as store:
                    rec = record_of(store)
                if rec is not None:
                    return rec
            return RunRecord.model_validate_json((folder / _LEGACY_RECORD).read_text())
        except (OSError, EvaluationError, ValueError, sqlite3.Error):
            # missing, unreadable, or still being created by the pipeline: not (yet) a run
            raise RunNotFoundError(run_id) from None

    def update(self, run_id: str, **changes: Any) -> RunRecord:
        folder = self.run_dir(run_id)
        with self._lock:
            if not (folder / STORE_FILE).is_file():  # a run of an earlier version
                rec = _changed(self.get(run_id), changes)
                self._write(folder / _LEGACY_RECORD, rec.model_dump_json(indent=2))
                return rec
            try:
                with RunStore(folder) as store:
                    old = record_of(store)
                    if old is None:
                        raise RunNotFoundError(run_id)
                    rec = _changed(old, changes)
                    store.set_note(GATEWAY_NOTE, rec.model_dump_json())
            except (OSError, EvaluationError, sqlite3.Error):
                raise RunNotFoundError(run_id) from None
        return rec

    def finish(self, run_id: str, status: RunStatus, **changes: Any) -> RunRecord:
        if status is RunStatus.DONE:  # else the progress it reached stays
            changes["progress"] = 1.0
        rec = self.update(
            run_id, status=status, stage=status.value, finished_at=now_iso(), **changes
        )
        (self.active_dir / self.run_dir(run_id).name).unlink(missing_ok=True)
        return rec

    def ids(self, after: str | None = None) -> list[str]:
        """The ids of the runs with a run store, newest first (those made after the run id
        ``after`` only, when given): run ids are time-ordered, no record is read."""
        found = [
            d.name
            for d in (self.runs_dir.iterdir() if self.runs_dir.is_dir() else ())
            if _RUN_ID.match(d.name) and (after is None or d.name > after)
            and (d / STORE_FILE).is_file()
        ]  # fmt: skip
        return sorted(found, reverse=True)

    def list(self, limit: int = 100, study_uid: str | None = None) -> list[RunRecord]:
        """The newest runs first (of ``study_uid`` only, when given)."""
        legacy = [
            d
            for d in (self.runs_dir.iterdir() if self.runs_dir.is_dir() else ())
            if _RUN_ID.match(d.name)
            and not (d / STORE_FILE).is_file()
            and (d / _LEGACY_RECORD).is_file()
        ]
        legacy.sort(key=lambda d: (d / _LEGACY_RECORD).stat().st_mtime, reverse=True)
        out = []
        for run_id in (*self.ids(), *(d.name for d in legacy)):
            try:
                rec = self.get(run_id)
            except RunNotFoundError:
                continue
            if study_uid is None or rec.study_uid == study_uid:
                out.append(rec)
            if len(out) >= limit:
                break
        return out

    def sample_errors(self, run_id: str) -> dict[tuple[str, str], str]:
        """Why a model gave no usable answer (transport, refusal, format), by model and task
        family, from the run store."""
        with RunStore(self.run_dir(run_id)) as store:
            rows = store.samples()
        return {
            (r.model, r.family): str(r.parse_error)
            for r in rows
            if r.parse_error and r.status != "ok"
        }

    def report_folder(self, run_id: str) -> Path:
        """The run's published report bundle."""
        return self.reports_dir / self.run_dir(run_id).name

    def report_path(self, run_id: str, kind: str) -> Path:
        """The run's report: ``json`` its RunData (``rundata.json``), ``html``/``pdf`` the
        study's checklist page and its print, all from the published bundle."""
        folder = self.report_folder(run_id)
        if kind == "json":
            path = folder / RUNDATA_FILE
        elif kind in ("html", "pdf"):
            pages = sorted(
                p for p in (folder / "cases").glob(f"*.{kind}") if not p.name.startswith(".")
            )
            path = pages[0] if len(pages) == 1 else folder / "none"
        else:
            path = folder / "none"
        if not path.is_file():
            raise RunNotFoundError(f"{run_id}/report.{kind}")
        return path

    # ----------------------------------------------------------------- study state

    def _state_path(self, name: str) -> Path:
        return self.state_dir / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"

    def study_state(self, key: StudyKey) -> StudyState:
        """What was uploaded and evaluated of this study of this patient. A state written
        before keys had a patient (keyed by the UID alone) is taken over by the first key
        that asks for it."""
        path = self._state_path(key.name)
        if path.exists():
            return StudyState.model_validate_json(path.read_text())
        legacy = self._state_path(key.study_uid)
        with self._lock:
            if legacy.exists():
                state = StudyState.model_validate_json(legacy.read_text())
                if state.key is None:
                    state.key = key.name
                    self._write(path, state.model_dump_json(indent=2))
                    legacy.unlink(missing_ok=True)
                    return state
        return StudyState(study_uid=key.study_uid, key=key.name)

    def save_study_state(self, state: StudyState) -> None:
        name = state.key or state.study_uid
        with self._lock:
            self._write(self._state_path(name), state.model_dump_json(indent=2))
