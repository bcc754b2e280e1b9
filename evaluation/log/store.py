"""The run store: one SQLite file (WAL) per run, the single source of truth of the run.

Tables: ``run`` (config, dataset hash, code and package versions, status), ``requests`` (every
model call: cache key, case, task, model, sample, turn, image hashes, prompt hash, the request
without image bytes), ``responses`` (raw text and the ModelOutput, committed as soon as the call
returns and before anything parses or scores it), ``failures`` (calls that failed after their
retries; resume tries them again), ``samples`` (parse status and parsed answer per case x task x
model x sample), ``scores`` and ``error_labels``, ``audit`` (every outbound payload) and
``cases`` (each case as the scorers see it: ground truth and image hashes, no image bytes, so a
run can be re-scored from its folder alone), ``skipped_cases`` (every case of the dataset the run
does not evaluate, and why; with ``meta.cases_evaluated`` the "n of m cases evaluated"),
``notes`` (what the program that started the run keeps about it: the gateway's trigger, stage,
progress and write-back, so its run has one record; a store may hold notes before its run).

Older stores are brought up to date when opened (columns and tables added since; their rows read
as "not recorded"); a store opened read-only is read as it is.

Every write is its own committed transaction, so a ``kill -9`` loses at most the call that was
in flight. ``synchronous=NORMAL`` survives a killed process (the commit is in the WAL); pass
``durable=True`` for ``FULL`` (also survives power loss, at an fsync per commit).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evaluation.case import Case
from evaluation.coverage import CaseCoverage, SkippedCase
from evaluation.errors import StoreError
from evaluation.log.records import CallErrors, RunRow, SampleRow, StoreCounts
from evaluation.log.writes import (
    GroupCommitter,
    Statements,
    failure_statements,
    now,
    request_statements,
    response_statements,
    sample_id,  # noqa: F401 (re-exported: the id of a case x task x model x sample)
    sample_statements,
    score_statements,
)
from evaluation.modelio import ModelOutput
from evaluation.phi import AuditRecord
from evaluation.scores import ErrorLabel, Score

STORE_VERSION = 1
STORE_FILE = "run.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS run (
    run_id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    status TEXT NOT NULL,
    config_json TEXT NOT NULL,
    dataset_name TEXT,
    dataset_kind TEXT,
    dataset_hash TEXT NOT NULL,
    prompt_version TEXT,
    code_version TEXT,
    packages_json TEXT
);
CREATE TABLE IF NOT EXISTS requests (
    cache_key TEXT PRIMARY KEY,
    case_id TEXT NOT NULL,
    task TEXT NOT NULL,
    family TEXT NOT NULL,
    model TEXT NOT NULL,
    sample INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    image_hashes TEXT NOT NULL,
    prompt_hash TEXT NOT NULL,
    request_json TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS responses (
    cache_key TEXT PRIMARY KEY REFERENCES requests(cache_key),
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    output_json TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY,
    cache_key TEXT NOT NULL,
    model TEXT NOT NULL,
    error TEXT NOT NULL,
    output_json TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    sample_id TEXT PRIMARY KEY,
    case_id TEXT NOT NULL,
    task TEXT NOT NULL,
    family TEXT NOT NULL,
    model TEXT NOT NULL,
    sample INTEGER NOT NULL,
    status TEXT NOT NULL,
    turns_json TEXT NOT NULL,
    parsed_json TEXT,
    parse_error TEXT,
    image_hashes TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scores (
    sample_id TEXT NOT NULL REFERENCES samples(sample_id),
    scorer TEXT NOT NULL,
    value REAL,
    explanation TEXT NOT NULL,
    details_json TEXT NOT NULL,
    scored_at TEXT NOT NULL,
    scoring_version TEXT,
    PRIMARY KEY (sample_id, scorer)
);
CREATE TABLE IF NOT EXISTS error_labels (
    sample_id TEXT PRIMARY KEY REFERENCES samples(sample_id),
    label_json TEXT NOT NULL,
    scored_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scored_samples (
    sample_id TEXT PRIMARY KEY REFERENCES samples(sample_id),
    scored_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    case_id TEXT NOT NULL,
    cache_key TEXT NOT NULL,
    remote INTEGER NOT NULL,
    deidentified INTEGER NOT NULL,
    record_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cases (
    case_id TEXT PRIMARY KEY,
    case_json TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_model ON samples(model);
CREATE INDEX IF NOT EXISTS failures_key ON failures(cache_key);
"""
# Added after version 1 stores existed: created on opening (see RunStore._migrate).
_SKIPPED_CASES = """
CREATE TABLE IF NOT EXISTS skipped_cases (
    n INTEGER PRIMARY KEY,
    entry TEXT NOT NULL,
    position INTEGER,
    case_id TEXT,
    reason TEXT NOT NULL,
    recorded_at TEXT NOT NULL
)
"""
# What the program that started the run records about it, by key (the gateway: its trigger,
# stage, progress and write-back, ``gateway``); a store can hold notes before its run starts.
_NOTES = """
CREATE TABLE IF NOT EXISTS notes (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
"""
_CASES_EVALUATED = "cases_evaluated"  # meta key: set once a run recorded its coverage


class RunStore:
    """One run's SQLite file. Thread-safe (one connection, one lock); writes commit at once."""

    def __init__(self, path: Path, *, create: bool = False, durable: bool = False) -> None:
        path = Path(path)
        if path.is_dir() or path.suffix != ".sqlite":
            path = path / STORE_FILE
        if not path.exists() and not create:
            raise StoreError(f"no run store at {path} (is this a run folder?)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._committer: GroupCommitter | None = None
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: not a usable run store: {exc}") from exc
        self._migrate()
        version = self._one("SELECT value FROM meta WHERE key='store_version'")
        if version is None:
            # OR IGNORE: another process may be creating the same store right now
            self._exec(
                "INSERT OR IGNORE INTO meta VALUES ('store_version', ?)", (str(STORE_VERSION),)
            )
        elif int(version[0]) != STORE_VERSION:
            raise StoreError(f"{path}: store version {version[0]}, this code reads {STORE_VERSION}")

    def _migrate(self) -> None:
        """Columns and tables added since a store was created (the store version stays 1: code
        that predates them reads a newer store as before). Old rows read as "not recorded"."""
        cols = {r[1] for r in self._all("PRAGMA table_info(scores)")}
        self._versioned = "scoring_version" in cols or self._try_write(
            "ALTER TABLE scores ADD COLUMN scoring_version TEXT"
        )
        tables = {r[0] for r in self._all("SELECT name FROM sqlite_master WHERE type='table'")}
        self._has_skipped = "skipped_cases" in tables or self._try_write(_SKIPPED_CASES)
        self._has_notes = "notes" in tables or self._try_write(_NOTES)

    def _try_write(self, sql: str) -> bool:
        """Run a migration statement; False when the file is read-only (read it as it is)."""
        try:
            self._exec(sql)
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc).replace("-", "").lower():
                raise
            return False
        return True

    # ------------------------------------------------------------------ plumbing

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _tx(self, statements: Statements) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        with self._lock:
            row: tuple[Any, ...] | None = self._db.execute(sql, args).fetchone()
            return row

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def connection(self) -> sqlite3.Connection:
        return self._db

    def committer(self) -> GroupCommitter:
        """The group-commit writer (started on first use, stopped by ``close``)."""
        if self._committer is None:
            self._committer = GroupCommitter(self)
        return self._committer

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
            self._committer = None
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ run

    def init_run(
        self,
        run_id: str,
        config: dict[str, Any],
        *,
        dataset_name: str,
        dataset_kind: str,
        dataset_hash: str,
        prompt_version: str,
        code_version: str,
        packages: dict[str, str],
    ) -> None:
        if self._one("SELECT run_id FROM run") is not None:
            raise StoreError(f"{self.path} already holds a run: use `runs resume`")
        t = now()
        self._exec(
            "INSERT INTO run VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id,
                t,
                t,
                "running",
                json.dumps(config),
                dataset_name,
                dataset_kind,
                dataset_hash,
                prompt_version,
                code_version,
                json.dumps(packages),
            ),
        )

    def has_run(self) -> bool:
        """Whether a run was started in this store (a store may hold only notes so far)."""
        return self._one("SELECT run_id FROM run") is not None

    def set_note(self, key: str, value: str) -> None:
        """Record (or replace) what the caller keeps about the run under ``key``."""
        if not self._has_notes:
            raise StoreError(f"{self.path}: a read-only store of an older version takes no notes")
        self._exec(
            "INSERT INTO notes VALUES (?,?,?) ON CONFLICT(key) DO UPDATE SET "
            "value=excluded.value, updated_at=excluded.updated_at",
            (key, value, now()),
        )

    def note(self, key: str) -> str | None:
        """What was recorded under ``key``; None when nothing was (or the store predates notes)."""
        if not self._has_notes:
            return None
        row = self._one("SELECT value FROM notes WHERE key=?", (key,))
        return str(row[0]) if row is not None else None

    def run_row(self) -> RunRow:
        with self._lock:
            cur = self._db.execute("SELECT * FROM run")
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        if row is None:
            raise StoreError(f"{self.path}: no run recorded")
        out = dict(zip(names, row, strict=True))
        out["config"] = json.loads(out.pop("config_json"))
        out["packages"] = json.loads(out.pop("packages_json") or "{}")
        return RunRow.model_validate(out)

    def set_status(self, status: str) -> None:
        self._exec("UPDATE run SET status=?, updated_at=?", (status, now()))

    # ------------------------------------------------------------------ writes

    def commit(self, statements: Statements) -> None:
        """Run statements in one committed transaction (see ``store_writer`` for group commit)."""
        self._tx(statements)

    def record_request(self, cache_key: str, **kw: Any) -> None:
        self._tx(request_statements(cache_key, **kw))

    def record_response(self, cache_key: str, model: str, output: ModelOutput) -> None:
        self._tx(response_statements(cache_key, model, output))

    def record_failure(self, cache_key: str, model: str, output: ModelOutput) -> None:
        self._tx(failure_statements(cache_key, model, output))

    def record_sample(self, **kw: Any) -> str:
        sid, statements = sample_statements(**kw)
        self._tx(statements)
        return sid

    def record_cases(self, cases: list[Case]) -> int:
        """Snapshot cases the run does not hold yet (one transaction); returns how many were new.

        A snapshot is never replaced: it is the truth the run was scored against.
        """
        t = now()
        rows = [(c.case_id, c.model_dump_json(), t) for c in cases]
        with self._lock:
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR IGNORE INTO cases VALUES (?,?,?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return self._db.total_changes - before

    def record_coverage(self, evaluated: int, skipped: list[SkippedCase]) -> None:
        """How many cases the run evaluates and the ones it skipped (replacing what a previous
        start or resume recorded: the dataset as loaded now is what the run evaluates)."""
        t = now()
        statements: Statements = [("DELETE FROM skipped_cases", ())]
        statements += [
            (
                "INSERT INTO skipped_cases (entry, position, case_id, reason, recorded_at) "
                "VALUES (?,?,?,?,?)",
                (s.entry, s.position, s.case_id, s.reason, t),
            )
            for s in skipped
        ]
        statements.append(
            ("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_CASES_EVALUATED, str(evaluated)))
        )
        self._tx(statements)

    def record_scores(
        self,
        sid: str,
        scores: list[Score],
        label: ErrorLabel | None,
        scored_json: str | None = None,
        scoring_version: str | None = None,
    ) -> None:
        """Scores and error label of a sample, replacing earlier ones (one transaction)."""
        self._tx(score_statements(sid, scores, label, scored_json, scoring_version))

    # ------------------------------------------------------------------ reads

    def responses(self) -> dict[str, ModelOutput]:
        """Every stored response by cache key (what resume and rescore reuse)."""
        return {
            k: ModelOutput.model_validate_json(v)
            for k, v in self._all("SELECT cache_key, output_json FROM responses")
        }

    def samples(self) -> list[SampleRow]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM samples ORDER BY case_id, task, model, sample")
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        out = []
        for row in rows:
            r = dict(zip(names, row, strict=True))
            r["turns"] = json.loads(r.pop("turns_json"))
            r["parsed"] = json.loads(r.pop("parsed_json")) if r["parsed_json"] else None
            r["image_hashes"] = json.loads(r["image_hashes"])
            out.append(SampleRow.model_validate(r))
        return out

    def scores(self) -> dict[str, list[Score]]:
        out: dict[str, list[Score]] = {}
        for sid, scorer, value, expl, details in self._all(
            "SELECT sample_id, scorer, value, explanation, details_json FROM scores"
        ):
            out.setdefault(sid, []).append(
                Score(scorer=scorer, value=value, explanation=expl, details=json.loads(details))
            )
        return out

    def scoring_versions(self) -> dict[str | None, int]:
        """Scored samples per scoring version (None: scored before versions were recorded)."""
        if not self._versioned:
            n = self._one("SELECT COUNT(DISTINCT sample_id) FROM scores")
            return {None: n[0]} if n and n[0] else {}
        return {
            v: n
            for v, n in self._all(
                "SELECT scoring_version, COUNT(DISTINCT sample_id) FROM scores "
                "GROUP BY scoring_version ORDER BY scoring_version"
            )
        }

    def sample_scoring_versions(self) -> dict[str, str | None]:
        """The scoring version of every scored sample."""
        if not self._versioned:
            return dict.fromkeys(r[0] for r in self._all("SELECT DISTINCT sample_id FROM scores"))
        return dict(
            self._all("SELECT sample_id, MAX(scoring_version) FROM scores GROUP BY sample_id")
        )

    def error_labels(self) -> dict[str, ErrorLabel]:
        return {
            sid: ErrorLabel.model_validate_json(j)
            for sid, j in self._all("SELECT sample_id, label_json FROM error_labels")
        }

    def cases(self) -> dict[str, Case]:
        """The run's case snapshots by case id (empty for runs recorded before snapshots)."""
        return {
            cid: Case.model_validate_json(j)
            for cid, j in self._all("SELECT case_id, case_json FROM cases ORDER BY case_id")
        }

    def scored_samples(self) -> list[str]:
        """ScoredSample JSON of every scored sample (what summaries are built from)."""
        return [
            j for (j,) in self._all("SELECT scored_json FROM scored_samples ORDER BY sample_id")
        ]

    def coverage(self) -> CaseCoverage:
        """The cases evaluated out of those the dataset lists, and every skipped one with why.

        A run stored before this was recorded: ``recorded`` is False and ``evaluated`` counts the
        cases its samples answer."""
        evaluated = self._one("SELECT value FROM meta WHERE key=?", (_CASES_EVALUATED,))
        if evaluated is None or not self._has_skipped:
            n = self._one("SELECT COUNT(DISTINCT case_id) FROM samples")
            return CaseCoverage(evaluated=int(n[0]) if n else 0, recorded=False)
        rows = self._all("SELECT entry, position, case_id, reason FROM skipped_cases ORDER BY n")
        skipped = [SkippedCase(entry=e, position=p, case_id=c, reason=r) for e, p, c, r in rows]
        return CaseCoverage(evaluated=int(evaluated[0]), skipped=skipped)

    def call_errors(self, retries: dict[str, int] | None = None) -> list[CallErrors]:
        """Per model, the samples that ended in an error: how many, the first message and how
        many distinct ones, and the retries its calls took (the stored responses' and
        failures': ``retries()``, or the result of it a caller already holds). Models without a
        failed sample are left out."""
        retries = self.retries() if retries is None else retries
        groups: list[CallErrors] = []
        for model, n, distinct in self._all(
            "SELECT model, COUNT(*), COUNT(DISTINCT parse_error) FROM samples "
            "WHERE status='error' GROUP BY model ORDER BY model"
        ):
            first = self._one(
                "SELECT parse_error FROM samples WHERE status='error' AND model=? "
                "ORDER BY updated_at, sample_id LIMIT 1",
                (model,),
            )
            groups.append(
                CallErrors(
                    model=model,
                    samples=int(n),
                    reasons=int(distinct),
                    first_error=str(first[0] or "") if first else "",
                    retries=retries.get(model, 0),
                )
            )
        return groups

    def retries(self) -> dict[str, int]:
        """Retries per model: the extra attempts its calls took, answered or failed in the end
        (each call's ``ModelOutput.retries``)."""
        out: dict[str, int] = {}
        for table in ("responses", "failures"):
            for model, n in self._all(
                f"SELECT model, SUM(COALESCE(json_extract(output_json, '$.retries'), 0)) "
                f"FROM {table} GROUP BY model"
            ):
                if n:
                    out[model] = out.get(model, 0) + int(n)
        return out

    def counts(self) -> StoreCounts:
        keys = ("requests", "responses", "failures", "samples", "scores", "audit")
        tables = {k: int(self._one(f"SELECT COUNT(*) FROM {k}")[0]) for k in keys}  # type: ignore[index]
        by_status = {
            str(status): int(n)
            for status, n in self._all("SELECT status, COUNT(*) FROM samples GROUP BY status")
        }
        return StoreCounts(**tables, by_status=by_status)

    def audit(self) -> Iterator[AuditRecord]:
        for (j,) in self._all("SELECT record_json FROM audit ORDER BY id"):
            yield AuditRecord.model_validate_json(j)
