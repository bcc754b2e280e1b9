"""Gateway runs: one folder per run, ``DATA_DIR/runs/<run id>/``, and one record per run, the
run log's ``GatewayRun`` (``evaluation.log``): trigger, status, stage, progress, route, what was
written back (the SR per model, the PDF; pending and done), the study's facts the run evaluated
(its digests, the SR copies the next version names as predecessors) and the SR's evidence (what a
re-issue attaches its VERIFIED SR to). The record lives beside the engine's rows of the run: in
the run folder's ``run.sqlite`` (the default), or, with ``NEUROSANDBOX_DATABASE_URL``, in the
install's PostgreSQL run log keyed by run id (the folder then holds a marker naming the run).
A stage change is one small UPDATE (``set_gateway_stage``); other changes replace the row.

The folder holds the rendered images the API serves, the SR copies and (for a study fetched
from Orthanc) the study. The report bundle in the reports folder (``<reports>/<run id>``) is an
export of the log. One state file per study (``state/studies/``) keeps what spans its runs:
the instances stored in the PACS, their revisions and stored files, and which run last
evaluated it (that run's record says what it evaluated).

A run that has not finished has a marker file, ``state/active/<run id>``; the gateway's next
start marks every run still marked as interrupted (``mark_interrupted``).

Run ids are time-ordered (32 hex digits: nanoseconds, then random), so the newest runs are
listed without opening every store. Older folders are read, and moved into the record when
first read: the ``gateway`` note of the run store (``RunRecord`` before), ``run.json`` (before
the run store), the study state's run facts, the bundle's ``evidence.json`` and
``rundata.json``'s ``config["gateway"]`` (the SR per model).
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, model_validator

from dicom import atomic_write
from evaluation import EvaluationError
from evaluation.log import (
    FINAL_STATUSES,
    GATEWAY_NOTE,
    GATEWAY_NOTE_MOVED,
    STORE_FILE,
    GatewayRun,
    RouteRecord,
    RunStatus,
    RunStore,
    SchemaOutOfDateError,
    SkipKind,
    gateway_run_ids,
    gateway_run_of_note,
    list_gateway_runs,
    open_store,
    store_exists,
    store_file,
)
from evaluation.reports import RUNDATA_FILE
from gateway.routing import Route
from gateway.study_key import StudyKey

log = logging.getLogger(__name__)
T = TypeVar("T")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")

# The gateway's record of a run is the run log's GatewayRun (one record type; the old name kept)
RunRecord = GatewayRun
FINAL = FINAL_STATUSES
RE_EXPORTED = (RunStatus, SkipKind)  # the run log's, under the names the gateway used


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def route_record(route: Route | RouteRecord | None) -> RouteRecord | None:
    """The run log's record of a routing decision."""
    if route is None or isinstance(route, RouteRecord):
        return route
    return RouteRecord.model_validate(route.model_dump(mode="json"))


class Evaluated(BaseModel):
    """What the last evaluation of a study was: its run, report version, what it evaluated
    and its SR copies (read from that run's record)."""

    run_id: str | None = None
    version: int = 0
    evaluated_digest: str | None = None  # the instances and the rule evaluated
    evaluated_instances: str | None = None  # the instances alone (sop_digest)
    sr_paths: list[str] = Field(default_factory=list)


_LEGACY_STATE = ("version", "evaluated_digest", "evaluated_instances", "sr_paths")


class StudyState(BaseModel):
    """What spans a study's runs: the instances stored in the PACS, their revisions and stored
    files, and the run that last evaluated it (whose record says what it evaluated)."""

    study_uid: str
    key: str | None = None  # StudyKey.name (None: a state written before keys had a patient)
    uploaded: list[str] = Field(default_factory=list)  # SOP Instance UIDs stored in Orthanc
    # SOP UID -> how often it was re-sent with other bytes and taken (the PACS overwrites)
    revisions: dict[str, int] = Field(default_factory=dict)
    # SOP UID -> the PACS's id of its stored file when last seen (Orthanc's attachment UUID)
    files: dict[str, str] = Field(default_factory=dict)
    last_run_id: str | None = None  # the run that last evaluated the study (a DONE run)
    # a state of before the run log kept its last evaluation's facts here: moved into that
    # run's record when read (kept here only while that run cannot be read)
    legacy: Evaluated | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_layout(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(k in data for k in _LEGACY_STATE):
            data = dict(data)
            old = {k: data.pop(k) for k in _LEGACY_STATE if k in data}
            if data.get("legacy") is None and (old.get("version") or old.get("evaluated_digest")):
                data["legacy"] = {**old, "run_id": data.get("last_run_id")}
        return data


class RunNotFoundError(KeyError):
    """No run with this id."""


# the run store's note where versions before GatewayRun kept it, and what replaces it once moved
GATEWAY_NOTE, _MOVED = GATEWAY_NOTE, GATEWAY_NOTE_MOVED
_LEGACY_RECORD = "run.json"  # where versions before the run store kept it
_SMALL = frozenset({"stage", "progress", "status", "started_at", "finished_at", "error",
                    "timings_s"})  # fmt: skip
MAX_LEGACY_BYTES = 16 << 20  # an old bundle's rundata.json read for its SR per model


def record_of(store: RunStore) -> GatewayRun | None:
    """The gateway's record of a run, from its run store (None: none recorded). Raises
    ``ValueError`` for a record that does not validate. (A store of before GatewayRun: the
    record it kept as its note, not yet moved.)"""
    return store.gateway_record()


def _changed(rec: GatewayRun, changes: dict[str, Any]) -> GatewayRun:
    return GatewayRun.model_validate({**rec.model_dump(), **changes})


def _normalised(changes: dict[str, Any]) -> dict[str, Any]:
    if "route" in changes:
        changes["route"] = route_record(changes["route"])
    if changes.get("status") is RunStatus.RUNNING and "started_at" not in changes:
        changes["started_at"] = now_iso()
    return changes


class StudyRunStore:
    def __init__(
        self,
        root: Path,
        reports_dir: Path | None = None,
        database_url: str | None = None,
        source: Literal["gateway", "demo"] = "gateway",
    ) -> None:
        self.root = root
        self.source = source  # recorded in every run this store creates (Settings.run_source)
        self.runs_dir = root / "runs"
        self.state_dir = root / "state" / "studies"
        self.active_dir = root / "state" / "active"  # a marker per run not yet finished
        # where the run's report bundle is published (Settings.reports_root)
        self.reports_dir = reports_dir or root / "reports"
        # the install's PostgreSQL run log (Settings.database_url); None: a run.sqlite per run
        self.database_url = database_url or None
        self._lock = threading.RLock()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls, settings: Any) -> StudyRunStore:
        """The install's runs (``Settings``): SHARED_DIR (where workers on other hosts write
        runs too, else DATA_DIR), the report bundles' folder, the run log, the runs' source."""
        return cls(settings.runs_root, settings.reports_root, settings.database_url,
                   settings.run_source)  # fmt: skip

    @staticmethod
    def new_id() -> str:
        """A new run id: the time in nanoseconds, then random (newest sorts last)."""
        return f"{time.time_ns():016x}{secrets.token_hex(8)}"

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise RunNotFoundError(run_id)
        return self.runs_dir / run_id

    def store_path(self, run_id: str) -> Path:
        """The file naming the run's store in its folder: its ``run.sqlite``, or with
        PostgreSQL the marker of its rows in the install's run log (a run made before the
        install switched keeps its ``run.sqlite``: ``evaluation.log.run_database``)."""
        return store_file(self.run_dir(run_id), self.database_url)

    def has_store(self, run_id: str) -> bool:
        """Whether the run has a run store (its file, or its rows in the install's log)."""
        return store_exists(self.run_dir(run_id), self.database_url)

    def open(self, run_id: str, *, create: bool = False) -> RunStore:
        """The run's store (the engine's rows and the gateway's record). Raises
        ``RunNotFoundError`` when there is none."""
        folder = self.run_dir(run_id)
        try:
            return open_store(folder, run_id=run_id, database_url=self.database_url, create=create)
        except SchemaOutOfDateError:
            raise  # the install's log needs `neurosandbox db upgrade`: not a missing run
        except (OSError, EvaluationError, sqlite3.Error):
            raise RunNotFoundError(run_id) from None

    def _write(self, path: Path, text: str) -> None:
        with atomic_write(path, "w", fsync=False) as fh:
            fh.write(text)

    # ----------------------------------------------------------------- runs

    def create(self, record: GatewayRun) -> GatewayRun:
        record = record.model_copy(update={"source": self.source})
        folder = self.run_dir(record.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        if record.status not in FINAL:
            self.active_dir.mkdir(parents=True, exist_ok=True)
            (self.active_dir / record.run_id).touch()
        with self._lock, self.open(record.run_id, create=True) as store:
            store.put_gateway_run(record)
        return record

    def hand_over(
        self, run_id: str, stage: str, progress: float, enqueue: Callable[[Any], object]
    ) -> None:
        """The run leaves this process for a worker: its status queued at ``stage``, and its
        job written by ``enqueue`` on the run log's connection, in one transaction (both or
        neither). Its active marker goes: the worker finishes the run, and this gateway's next
        start does not mark it interrupted."""
        with self._lock, self.open(run_id) as store:
            store.set_gateway_stage(stage, progress, status=RunStatus.QUEUED, also=enqueue)
        (self.active_dir / self.run_dir(run_id).name).unlink(missing_ok=True)

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

    def get(self, run_id: str) -> GatewayRun:
        """The run's record (an older folder's is moved into the run log on this first read)."""
        folder = self.run_dir(run_id)
        try:
            if self.has_store(run_id):  # in the install's log, or the folder's run.sqlite
                with self.open(run_id) as store:
                    rec = self._current(store, run_id)
                if rec is not None:
                    return rec
            return self._with_legacy_facts(
                gateway_run_of_note((folder / _LEGACY_RECORD).read_text()), moving=False
            )
        except (OSError, EvaluationError, ValueError, sqlite3.Error):
            # missing, unreadable, or still being created by the pipeline: not (yet) a run
            raise RunNotFoundError(run_id) from None

    def _current(self, store: RunStore, run_id: str) -> GatewayRun | None:
        """The store's record; one the gateway kept as its note (before GatewayRun) is moved
        into the record, with the facts an old folder kept elsewhere, on the way."""
        note = store.note(GATEWAY_NOTE)
        if note is None or note == _MOVED:
            return store.gateway_run()
        rec = self._with_legacy_facts(gateway_run_of_note(note), moving=True)
        if rec.run_id != run_id:
            raise ValueError(f"the record of run {rec.run_id} in the folder of {run_id}")
        if not store.read_only:
            with self._lock:
                store.put_gateway_run(rec)
                store.set_note(GATEWAY_NOTE, _MOVED)
        return rec

    def _with_legacy_facts(self, rec: GatewayRun, *, moving: bool) -> GatewayRun:
        """An old run's record with what its folder kept elsewhere: the SR per model and the
        evidence (its published bundle), what it evaluated (its study's state)."""
        changes: dict[str, Any] = {}
        bundle = self.report_folder(rec.run_id)
        named = _legacy_sr_models(bundle / RUNDATA_FILE)
        if named and set(named.values()) >= set(rec.sr_sop_uids.values()):
            changes["sr_sop_uids"] = named
        from gateway.writeback import EVIDENCE_FILE, NoEvidenceError, evidence_refs, load_evidence

        if not rec.evidence and (bundle / EVIDENCE_FILE).is_file():
            try:
                changes["evidence"] = evidence_refs(load_evidence(bundle))
            except NoEvidenceError as exc:
                log.warning("run %s: its old evidence file is not taken: %s", rec.run_id, exc)
        if rec.study_key and moving:
            path = self._state_path(rec.study_key)  # the state file is named by the key
            try:
                state = StudyState.model_validate_json(path.read_text()) if path.is_file() else None
            except (ValueError, OSError):
                state = None
            old = state.legacy if state is not None else None
            if old is not None and old.run_id == rec.run_id:
                changes |= {
                    "evaluated_digest": old.evaluated_digest,
                    "evaluated_instances": old.evaluated_instances,
                    "sr_paths": old.sr_paths,
                }
        return _changed(rec, changes) if changes else rec

    def update(self, run_id: str, **changes: Any) -> None:
        """Change the run's record: a stage, progress, status, time or error change is one
        small UPDATE of those columns; anything else replaces the record's row."""
        changes = _normalised(changes)
        legacy = not self.has_store(run_id) and (self.run_dir(run_id) / _LEGACY_RECORD).is_file()
        with self._lock:
            if legacy:  # a run of a version before the run store: its record moves in
                rec = _changed(self.get(run_id), changes)
                with self.open(run_id, create=True) as store:
                    store.put_gateway_run(rec)
                return
        try:
            with self.open(run_id) as store:
                note = store.note(GATEWAY_NOTE)
                if note is not None and note != _MOVED:  # an old store's: moved first
                    self._current(store, run_id)
                with self._lock:
                    if set(changes) <= _SMALL and {"stage", "progress"} <= set(changes):
                        small = dict(changes)
                        store.set_gateway_stage(small.pop("stage"), small.pop("progress"), **small)
                        return
                    if "evidence" in changes:
                        old = store.gateway_run()
                        if old is None:
                            raise RunNotFoundError(run_id)
                        store.put_gateway_run(_changed(old, changes))
                        return
                    # the SR's evidence is neither read nor written again (it is large)
                    old = store.gateway_run(evidence=False)
                    if old is None:
                        raise RunNotFoundError(run_id)
                    store.update_gateway_run(_changed(old, changes))
        except (OSError, EvaluationError, sqlite3.Error):
            raise RunNotFoundError(run_id) from None

    def finish(self, run_id: str, status: RunStatus, **changes: Any) -> None:
        if status is RunStatus.DONE:  # else the progress it reached stays
            changes["progress"] = 1.0
        elif "progress" not in changes and set(changes) <= _SMALL:
            changes["progress"] = self.get(run_id).progress
        self.update(run_id, status=status, stage=status.value, finished_at=now_iso(), **changes)
        (self.active_dir / self.run_dir(run_id).name).unlink(missing_ok=True)

    def _file_ids(self, after: str | None = None) -> list[str]:
        """The runs whose folder keeps its own ``run.sqlite`` (all of them with SQLite; with
        PostgreSQL those made before the install switched), newest first."""
        found = [
            d.name
            for d in (self.runs_dir.iterdir() if self.runs_dir.is_dir() else ())
            if _RUN_ID.match(d.name) and (after is None or d.name > after)
            and (d / STORE_FILE).is_file() and store_file(d, self.database_url).name == STORE_FILE
        ]  # fmt: skip
        return sorted(found, reverse=True)

    def ids(self, after: str | None = None) -> list[str]:
        """The ids of the runs with a run store, newest first (those made after the run id
        ``after`` only, when given): run ids are time-ordered, no record is read. With
        PostgreSQL, the install's run log is asked, and the runs made before the install
        switched to it (each in its folder's ``run.sqlite``) are merged in."""
        files = self._file_ids(after)
        if self.database_url is None:
            return files
        return sorted({*gateway_run_ids(self.database_url, after), *files}, reverse=True)

    def list(self, limit: int = 100, study_uid: str | None = None) -> list[GatewayRun]:
        """The newest runs first (of ``study_uid`` only, when given). With PostgreSQL one query
        of the install's run log (without the SR's evidence: ``get`` reads a run whole), merged
        with the runs made before the install switched to it (read from their folders)."""
        if self.database_url is not None:
            out = list_gateway_runs(self.database_url, limit, study_uid)
            for run_id in self._file_ids():
                if len(out) >= limit and run_id < out[-1].run_id:
                    break  # older than every run kept: no file run below this one is
                try:
                    rec = self.get(run_id)
                except RunNotFoundError:
                    continue
                if study_uid is None or rec.study_uid == study_uid:
                    out.append(rec)
                    out.sort(key=lambda r: r.run_id, reverse=True)
                    del out[limit:]
            return out
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

    def evidence(self, run_id: str) -> builtins.list[Any]:  # `list` here is the method above
        """The SR's evidence the run recorded at write-back (DICOM datasets, validated as
        hostile input; ``NoEvidenceError`` when it recorded none)."""
        from gateway.writeback import evidence_headers

        return evidence_headers(self.get(run_id).evidence, f"run {run_id}")

    def sample_errors(self, run_id: str) -> dict[tuple[str, str], str]:
        """Why a model gave no usable answer (transport, refusal, format), by model and task
        family, from the run store."""
        with self.open(run_id) as store:
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

    def last_evaluation(self, key: StudyKey) -> Evaluated:
        """What the last evaluation of this study of this patient was, from the record of the
        run that made it (its version 0, nothing evaluated: never evaluated)."""
        state = self.study_state(key)
        rec = None
        if state.last_run_id is not None:
            try:
                rec = self.get(state.last_run_id)
            except RunNotFoundError:
                rec = None
        if rec is not None and (rec.evaluated_digest is not None or state.legacy is None):
            if state.legacy is not None:  # moved into the run's record: the state forgets it
                self.update_study_state(key, lambda s: setattr(s, "legacy", None))
            return Evaluated(
                run_id=rec.run_id,
                version=rec.version or 0,
                evaluated_digest=rec.evaluated_digest,
                evaluated_instances=rec.evaluated_instances,
                sr_paths=list(rec.sr_paths),
            )
        return state.legacy or Evaluated()

    def study_state(self, key: StudyKey) -> StudyState:
        """What was uploaded and evaluated of this study of this patient. A state written
        before keys had a patient (keyed by the UID alone) is taken over by the first key
        that asks for it."""
        stored = self._stored(key.name)
        if stored is not None:
            return stored
        if not self._state_path(key.study_uid).exists():
            return StudyState(study_uid=key.study_uid, key=key.name)
        with self.study_state_lock():
            return self._read_state(key)

    def _stored(self, name: str) -> StudyState | None:
        """The state file of the study named ``name``, None when there is none."""
        path = self._state_path(name)
        return StudyState.model_validate_json(path.read_text()) if path.exists() else None

    def _read_state(self, key: StudyKey) -> StudyState:
        """``study_state`` with the state lock held (a legacy state is taken over here)."""
        stored = self._stored(key.name)
        if stored is not None:
            return stored
        path, legacy = self._state_path(key.name), self._state_path(key.study_uid)
        if legacy.exists():
            state = StudyState.model_validate_json(legacy.read_text())
            if state.key is None:
                state.key = key.name
                self._write(path, state.model_dump_json(indent=2))
                legacy.unlink(missing_ok=True)
                return state
        return StudyState(study_uid=key.study_uid, key=key.name)

    def update_study_state(self, key: StudyKey, change: Callable[[StudyState], T]) -> T:
        """Change this study's state as one step: read it, ``change`` it in place, write it,
        with every other change of any study's state held off meanwhile, by the threads of
        this process and by the other processes on this data folder (the gateway's, its
        workers'). What ``change`` returns comes back. Keep ``change`` short: no I/O."""
        with self.study_state_lock():
            state = self._read_state(key)
            result = change(state)
            self._write(self._state_path(key.name), state.model_dump_json(indent=2))
        return result

    def make_last_run(self, key_name: str, run_id: str, version: int) -> bool:
        """Make ``run_id`` (which wrote back ``version``) the last run of the study named
        ``key_name`` (``StudyKey.name``: no PACS needed), unless the study's last run is of
        that version or a later one. Whether it did."""
        parsed = StudyKey.parse_name(key_name)
        if parsed is None:
            return False
        before = self._stored(key_name)
        last = before.last_run_id if before is not None else None
        newer = 0
        if last is not None:
            try:
                newer = self.get(last).version or 0
            except RunNotFoundError:
                newer = 0
        if version <= newer:
            return False
        with self.study_state_lock():  # unless another run moved it meanwhile
            state = self._stored(key_name) or StudyState(study_uid=parsed[0], key=key_name)
            if state.last_run_id != last:
                return False
            state.last_run_id = run_id
            self._write(self._state_path(key_name), state.model_dump_json(indent=2))
        return True

    def save_study_state(self, state: StudyState) -> None:
        """Write a study's state whole (setting one up: a test, a migration). A change of
        a state that may be read meanwhile goes through ``update_study_state``."""
        name = state.key or state.study_uid
        with self.study_state_lock():
            self._write(self._state_path(name), state.model_dump_json(indent=2))

    @contextlib.contextmanager
    def study_state_lock(self) -> Iterator[None]:
        """The study states' lock: an exclusive ``flock`` of ``state/studies/.lock``, taken
        through a descriptor of its own each time, so that it holds off this process's other
        threads as well as other processes (on NFS too, where the server supports it)."""
        fd = os.open(self.state_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)  # also if a forked child still shares the file
        finally:
            os.close(fd)


def _legacy_sr_models(path: Path) -> dict[str, str]:
    """The UNVERIFIED SR per model an old bundle's ``rundata.json`` recorded in
    ``config["gateway"]["unverified_sr"]`` (hostile: anything else gives nothing)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_LEGACY_BYTES:
            return {}
        data = json.loads(path.read_bytes())
        named = data["config"]["gateway"]["unverified_sr"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(named, dict):
        return {}
    return {str(k)[:200]: str(v)[:64] for k, v in named.items() if isinstance(v, str)}
