"""The run store: the single source of truth of a run, on SQLite (one file per run, WAL, the
default) or PostgreSQL (one database for every run of an install, rows keyed by run id).

Tables (``evaluation.log.schema``): ``run`` (config, dataset hash, code and package versions,
status), ``requests`` (every model call: cache key, case, task, model, sample, turn, image
hashes, prompt hash, the request without image bytes), ``responses`` (raw text and the
ModelOutput, committed as soon as the call returns and before anything parses or scores it),
``failures`` (calls that failed after their retries; resume tries them again), ``samples``
(parse status and parsed answer per case x task x model x sample), ``scores`` and
``error_labels``, ``audit`` (every outbound payload), ``cases`` (each case as the scorers see
it, so a run can be re-scored from its store alone), ``skipped_cases`` (with
``meta.cases_evaluated`` the "n of m cases evaluated"), ``notes`` (what the program that started
the run keeps about it), ``gateway_runs`` (the gateway's ``GatewayRun``).

Older SQLite stores are brought up to date when opened (``evaluation.log.db``); one opened
read-only is read as it is. A PostgreSQL database is migrated by ``neurosandbox db upgrade``.

Every write is its own committed transaction (or one group-commit batch), so a ``kill -9`` loses
at most the calls in flight. SQLite ``synchronous=NORMAL`` survives a killed process (the commit
is in the WAL); ``durable=True`` for ``FULL`` (also survives power loss, an fsync per commit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple

import sqlalchemy as sa

from dicom import atomic_write
from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case
from evaluation.coverage import CaseCoverage, SkippedCase
from evaluation.errors import StoreError
from evaluation.log import db as db_
from evaluation.log import passport as passport_
from evaluation.log import schema as t_
from evaluation.log.gateway_index import gateway_run_of_row, gateway_run_row
from evaluation.log.passport import ModelPassport
from evaluation.log.records import (
    STAGE_FIELDS,
    CallErrors,
    GatewayRun,
    GraderCall,
    RunLog,
    RunStatus,
    SampleRecord,
    SampleTurn,
    SentRequest,
    StoreCounts,
    StoredRecordError,
    gateway_run_of_note,
)
from evaluation.log.writes import (
    GroupCommitter,
    Statements,
    compiled,
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

OPEN_WAIT_S = 15.0  # a store opened while PostgreSQL restarts waits this long for it


class RunExistsError(StoreError):
    """The run folder already holds a run (an earlier start of it): resume it instead."""


class DatasetChangedError(StoreError):
    """A run is resumed on a dataset other than the one it started with (its hash)."""


OUTAGE_S = 120.0  # PostgreSQL away this long mid-run (a restart, the network): then StoreError
STORE_VERSION = 2  # 1: before Alembic (code of then refuses a store of this layout)
STORE_FILE = "run.sqlite"
# With PostgreSQL the run folder keeps its images and exports, and this file naming its run id.
PG_MARKER = "run.db.json"
# the note where the gateway kept its record before the gateway_runs table, and what replaces
# it once the record was moved there
GATEWAY_NOTE = "gateway"
GATEWAY_NOTE_MOVED = "moved to the gateway_runs table"
_CASES_EVALUATED = "cases_evaluated"  # meta key: set once a run recorded its coverage
# meta key: a token every committed write of the run replaces (``write_stamp``)
LAST_WRITE = "last_write"
_SQL: dict[str, dict[str, str]] = {}  # dialect -> compiled write statements
_SQL_LOCK = threading.Lock()
_Ts = TypeVarTuple("_Ts")  # a row's column types, as the SELECT names them
_T = TypeVar("_T")
log = logging.getLogger(__name__)


def _sql_for(dialect: sa.Dialect) -> dict[str, str]:
    with _SQL_LOCK:
        if dialect.name not in _SQL:
            _SQL[dialect.name] = compiled(dialect)
        return _SQL[dialect.name]


def _driver(conn: sa.Connection) -> Any:
    """The driver's own connection (sqlite3 or psycopg) under ``conn``, that the store's writes
    go through. SQLAlchemy types it Optional (None once a pooled connection is invalidated);
    one just opened always has it."""
    raw = conn.connection.driver_connection
    if raw is None:
        raise StoreError("the database connection was closed before the run store could use it")
    return raw


def _folder(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    return run_dir.parent if run_dir.suffix == ".sqlite" else run_dir


def run_database(run_dir: Path, database_url: str | None = None) -> str | None:
    """Where the run of ``run_dir`` keeps its rows: the PostgreSQL run log at ``database_url``,
    or None for the folder's own ``run.sqlite``. A run made before the install switched to
    PostgreSQL (a ``run.sqlite`` and no marker) stays in its file: it is read, resumed and
    re-scored there, and listed beside the database's runs."""
    if not db_.is_postgres(database_url):
        return None
    folder = _folder(run_dir)
    if not (folder / PG_MARKER).is_file() and (folder / STORE_FILE).is_file():
        return None
    return database_url


def store_file(run_dir: Path, database_url: str | None = None) -> Path:
    """The file that names the run's store in ``run_dir``: its ``run.sqlite``, or the marker
    of its rows in the PostgreSQL run log (``run_database``); it may not exist yet."""
    folder = _folder(run_dir)
    return folder / (PG_MARKER if run_database(folder, database_url) else STORE_FILE)


def store_exists(run_dir: Path, database_url: str | None = None) -> bool:
    """Whether ``run_dir`` holds a run store (its file, or its PostgreSQL marker)."""
    return store_file(run_dir, database_url).is_file()


def _new_stamp() -> dict[str, Any]:
    return {"key": LAST_WRITE, "value": os.urandom(8).hex()}


def write_stamp(run_dir: Path, database_url: str | None = None) -> str | None:
    """The run's last-write stamp, by one query: a token that every committed write of the
    run's rows (engine, scores, the gateway's record) replaces, on either engine, so a reader
    keeps what it read until the stamp changes. None: no store here, or a store not written
    since stamps were kept (an older file: its modification time says more)."""
    folder = _folder(run_dir)
    url = run_database(folder, database_url)
    marker = folder / PG_MARKER
    if url is None:
        path = folder / STORE_FILE
        if not path.is_file():
            return None
        try:
            con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
            try:
                row = con.execute("SELECT value FROM meta WHERE key = ?", (LAST_WRITE,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error:  # an older layout, a damaged file: no stamp
            return None
        return str(row[0]) if row else None
    if not marker.is_file():
        return None
    try:
        run_id = str(json.loads(marker.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    m = t_.meta
    stmt = sa.select(m.c.value).where(m.c.run_id == run_id, m.c.key == LAST_WRITE)
    try:
        with db_.postgres_engine(url).connect() as conn:
            value = conn.execute(stmt).scalar()
    except sa.exc.DBAPIError as exc:
        raise StoreError(f"run log at {db_.safe_url(url)} could not be read: {exc.orig}") from exc
    return None if value is None else str(value)


def store_change_key(
    store_file: Path, database_url: str | None = None
) -> tuple[object, ...] | None:
    """What changes whenever the run whose store ``store_file`` names is written: its
    last-write stamp (``write_stamp``); for a SQLite file without one (older than stamps), the
    modification time and size of the file and of its write-ahead log (SQLite commits there
    first). None: no store. Raises ``StoreError`` when the database is not reachable."""
    main = _stat(store_file)
    if main is None:
        return None
    stamp = write_stamp(store_file.parent, database_url)
    if stamp is not None:
        return ("stamp", stamp)
    return ("file", main, _stat(store_file.with_name(store_file.name + "-wal")))


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size)


def open_store(
    run_dir: Path,
    *,
    run_id: str | None = None,
    database_url: str | None = None,
    create: bool = False,
    durable: bool = False,
    read_only: bool = False,
) -> RunStore:
    """The store of the run in ``run_dir``: its ``run.sqlite`` (``database_url`` None), or its
    rows in the PostgreSQL database at ``database_url`` (the run id: ``run_id``, else the one
    the folder's marker names, else the folder's name); a run the folder keeps in its own
    ``run.sqlite`` (made before the install's PostgreSQL) is opened there (``run_database``).
    ``read_only``: never written (nor migrated: a SQLite file of an older layout is read as it
    is)."""
    return RunStore(
        run_dir,
        create=create,
        durable=durable,
        run_id=run_id,
        database_url=run_database(run_dir, database_url),
        read_only=read_only,
    )


class RunStore:
    """One run's rows. Thread-safe (one connection, one lock); writes commit at once."""

    def __init__(
        self,
        path: Path,
        *,
        create: bool = False,
        durable: bool = False,
        run_id: str | None = None,
        database_url: str | None = None,
        read_only: bool = False,
    ) -> None:
        path = Path(path)
        self._lock = threading.RLock()
        self._writer = os.urandom(6).hex()  # this store's commit marks (PostgreSQL)
        self._txn = 0
        self._committer: GroupCommitter | None = None
        self._engine: sa.Engine | None = None
        self.read_only = read_only
        if db_.is_postgres(database_url):
            assert database_url is not None
            self._open_postgres(path, database_url, run_id, create)
        else:
            self._open_sqlite(path, run_id, create and not read_only, durable)
        self._sql = _sql_for(self._conn.dialect)
        if not self.read_only and self._one(self._meta_value("store_version")) is None:
            self._tx([("meta_keep", {"key": "store_version", "value": str(STORE_VERSION)})])

    # ------------------------------------------------------------------ opening

    def _open_sqlite(self, path: Path, run_id: str | None, create: bool, durable: bool) -> None:
        if path.is_dir() or path.suffix != ".sqlite":
            path = path / STORE_FILE
        if not path.exists() and not create:
            raise StoreError(f"no run store at {path} (is this a run folder?)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.run_dir = path.parent
        self.database_url: str | None = None
        try:
            self._engine = db_.sqlite_engine(path, durable=durable, read_only=self.read_only)
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._raw: Any = _driver(self._conn)
            revision = db_.current_revision(self._conn)
            empty = revision is None and not sa.inspect(self._conn).has_table("run")
            if empty and self.read_only:
                raise StoreError(f"{path}: an empty file, not a run store")
            if empty:
                with self._lock:
                    self._raw.execute("BEGIN IMMEDIATE")
                    try:
                        if db_.current_revision(self._conn) is None:  # not another process
                            db_.create(self._conn)
                    except BaseException:
                        self._raw.execute("ROLLBACK")
                        raise
                    self._raw.execute("COMMIT")
                revision = t_.HEAD
        except (sa.exc.DatabaseError, sqlite3.DatabaseError) as exc:
            self._dispose()
            raise StoreError(f"{path}: not a usable run store: {exc}") from exc
        bound = run_id or self._bound_id(revision) or path.parent.name
        if revision != t_.HEAD and self.read_only:
            if revision is None:
                db_.legacy_views(self._raw, bound)
        elif revision != t_.HEAD:
            try:
                db_.upgrade(f"sqlite:///{path}", run_id=bound)
            except (sa.exc.OperationalError, sqlite3.OperationalError) as exc:
                if "readonly" not in str(exc).replace("-", "").lower():
                    self._dispose()
                    raise StoreError(f"{path}: could not upgrade the run store: {exc}") from exc
                self.read_only = True  # read it as it is
                if revision is None:
                    db_.legacy_views(self._raw, bound)
        self.run_id = bound

    def _bound_id(self, revision: str | None) -> str | None:
        """The run id an existing SQLite file holds (its run, else its meta rows)."""
        if revision is None or revision == db_.LEGACY:
            row = self._conn.exec_driver_sql("SELECT run_id FROM run LIMIT 1").first()
            return str(row[0]) if row else None
        for sql in (
            "SELECT run_id FROM run LIMIT 1",
            "SELECT run_id FROM meta WHERE key='store_version' LIMIT 1",
        ):
            row = self._conn.exec_driver_sql(sql).first()
            if row:
                return str(row[0])
        return None

    def _open_postgres(self, path: Path, url: str, run_id: str | None, create: bool) -> None:
        run_dir = path.parent if path.suffix == ".sqlite" else path
        marker = run_dir / PG_MARKER
        if run_id is None and marker.is_file():
            try:
                run_id = str(json.loads(marker.read_text())["run_id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(f"{marker}: not a run store marker ({exc})") from exc
        # a run named by its id and only read (the catalog) needs no folder here
        if not marker.is_file() and not create and not (self.read_only and run_id):
            raise StoreError(f"no run store for {run_dir} (is this a run folder?)")
        self.run_dir = run_dir
        self.path = marker
        self.database_url = url
        self.run_id = run_id or run_dir.name
        engine = db_.postgres_engine(url)
        deadline = time.monotonic() + OPEN_WAIT_S  # a server restarting is waited for, briefly
        while True:
            try:
                self._conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                break
            except sa.exc.OperationalError as exc:
                if time.monotonic() >= deadline or not _restarting(exc, url in _REACHED):
                    raise StoreError(
                        f"database {db_.safe_url(url)} not reachable: {exc.orig}"
                    ) from exc
                time.sleep(0.5)
        _REACHED.add(url)
        self._raw = _driver(self._conn)
        revision = db_.current_revision(self._conn)
        if revision is None and create:
            self._conn.close()
            db_.upgrade(url)  # an empty database: the whole schema
            self._conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._raw = _driver(self._conn)
        elif revision != t_.HEAD:
            self._conn.close()
            raise db_.SchemaOutOfDateError(
                f"the run log at {db_.safe_url(url)} is at schema {revision or 'none'}, this "
                f"code needs {t_.HEAD}: run `neurosandbox db upgrade`"
            )
        if create and not marker.is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            self._write_marker()

    def _write_marker(self) -> None:
        if self.database_url is not None:
            with atomic_write(self.path, "w", fsync=False) as fh:
                fh.write(json.dumps({"run_id": self.run_id, "engine": "postgresql"}))

    # ------------------------------------------------------------------ plumbing

    def _params(self, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "run_id": self.run_id}

    def _tx(self, statements: Statements) -> None:
        self._commit_all([statements])

    def _commit_all(self, records: list[Statements]) -> None:
        """Every statement of ``records`` and the run's new last-write stamp in one committed
        transaction (rolled back and raised on any error). On PostgreSQL they are sent in one
        go (psycopg's pipeline mode) rather than a round trip each: a call's records and
        scores are some 25 statements, and waiting for each cost more of our CPU per call than
        all of SQLite's work (bench/engine.py --postgres).

        PostgreSQL going away mid-run (a restart, the network) is waited out for
        ``OUTAGE_S`` on a new connection, and the transaction is sent again unless it was
        committed: each carries this store's own commit mark (a ``meta`` row per writer, its
        transaction number), read back after reconnecting. Nothing is written twice."""
        if self.database_url is None:
            self._commit_once(records, None)
            return
        with self._lock:
            self._txn += 1
            mark = {"key": f"commit:{self._writer}", "value": str(self._txn)}
            deadline: float | None = None
            while True:
                try:
                    self._commit_once(records, mark)
                    return
                except Exception as exc:
                    if not db_.connection_lost(exc):
                        raise
                    deadline = deadline or time.monotonic() + OUTAGE_S
                    self._reconnect(deadline, exc)
                    if self._committed(mark):
                        return

    def _commit_once(self, records: list[Statements], mark: dict[str, str] | None) -> None:
        sql = self._sql
        with self._lock:
            cur = self._raw.cursor()
            try:
                with self._pipelined():
                    cur.execute(self._begin())
                    for name, group in _runs(records):
                        self._send(cur, name, group)
                    cur.execute(sql["meta"], self._params(_new_stamp()))
                    if mark is not None:
                        cur.execute(sql["meta"], self._params(mark))
                    cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # a lost connection cannot roll back
                    self._rollback(cur)
                raise

    def _committed(self, mark: dict[str, str]) -> bool:
        """Whether the transaction carrying ``mark`` was committed (read after a reconnect)."""
        row = self._conn.execute(self._meta_value(mark["key"])).first()
        return row is not None and str(row[0]) == mark["value"]

    def _reconnect(self, deadline: float, cause: BaseException) -> None:
        """A new connection to the run log's PostgreSQL, tried until ``deadline`` (then
        ``StoreError``)."""
        assert self.database_url is not None
        log.warning("run log database connection lost (%s); reconnecting", cause)
        with contextlib.suppress(Exception):
            self._conn.invalidate()
            self._conn.close()
        delay = 0.2
        while True:
            try:
                conn = db_.postgres_engine(self.database_url).connect()
                self._conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                self._raw = _driver(self._conn)
                return
            except sa.exc.DBAPIError as exc:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"run log at {db_.safe_url(self.database_url)} unreachable for "
                        f"{OUTAGE_S:.0f} s: {exc.orig}"
                    ) from exc
            time.sleep(delay)
            delay = min(5.0, delay * 2)

    def _send(self, cur: Any, name: str, group: list[dict[str, Any]]) -> None:
        """Statement ``name`` for each parameter set of ``group``. On PostgreSQL a run of rows
        for one table (a sample's dozen scores, a batch's responses) is one statement reading
        them from one JSON parameter (``_rows_sql``): the driver's work is per statement."""
        if len(group) > 1 and self.database_url is not None and name in _ROWS_OF:
            rows = _json_rows(name, group)
            if rows is not None:
                cur.execute(_rows_sql(name), {"run_id": self.run_id, "rows": rows})
                return
        for args in group:
            cur.execute(self._sql[name], self._params(args))

    def _pipelined(self) -> contextlib.AbstractContextManager[Any]:
        """PostgreSQL: the statements sent without waiting for each result (the first error is
        raised when the block ends, the rest skipped); SQLite: in-process, nothing to save."""
        if self.database_url is None:
            return contextlib.nullcontext()
        return self._raw.pipeline()

    def _rollback(self, cur: Any) -> None:
        """End a failed transaction (PostgreSQL: only if the server still holds one open)."""
        if self.database_url is None:
            if self._raw.in_transaction:
                cur.execute("ROLLBACK")
        else:
            self._raw.rollback()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Any]:
        """One committed transaction on the store's connection (its driver cursor), ending with
        the run's new last-write stamp (``write_stamp``); rolled back on any error."""
        with self._lock:
            cur = self._raw.cursor()
            cur.execute(self._begin())
            try:
                yield cur
                cur.execute(self._sql["meta"], self._params(_new_stamp()))
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _begin(self) -> str:
        return "BEGIN IMMEDIATE" if self.database_url is None else "BEGIN"

    def run_batch(self, records: list[Statements]) -> list[BaseException | None]:
        """Commit ``records`` in one transaction, each in its own savepoint so that one bad
        record fails alone; the error (or None) of each. Used by the group committer."""
        if len(records) == 1:
            try:
                self._tx(records[0])
            except Exception as exc:  # this record fails: nothing of it is kept
                return [exc]
            return [None]
        # Every record of the batch at once first: a savepoint and its release are two more
        # round trips per record to a PostgreSQL server (client CPU and latency per call);
        # only when a record fails is the batch written again, each record in a savepoint.
        try:
            self._commit_all(records)
        except Exception:
            return self._batch_by_record(records)
        return [None] * len(records)

    def _batch_by_record(self, records: list[Statements]) -> list[BaseException | None]:
        """``records`` in one transaction, each in its own savepoint (one bad record fails alone)."""
        results: list[BaseException | None] = []
        sql = self._sql
        with self._lock:
            cur = self._raw.cursor()
            cur.execute(self._begin())
            try:
                for n, statements in enumerate(records):
                    cur.execute(f"SAVEPOINT r{n}")
                    try:
                        for name, args in statements:
                            cur.execute(sql[name], self._params(args))
                    except Exception as exc:  # this record fails, the others are kept
                        cur.execute(f"ROLLBACK TO SAVEPOINT r{n}")
                        results.append(exc)
                    else:
                        results.append(None)
                    cur.execute(f"RELEASE SAVEPOINT r{n}")
                cur.execute(sql["meta"], self._params(_new_stamp()))
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        return results

    def _rows(self, stmt: sa.Select[*_Ts]) -> list[sa.Row[*_Ts]]:
        return self._read(lambda: list(self._conn.execute(stmt).fetchall()))

    def _one(self, stmt: sa.Select[*_Ts]) -> sa.Row[*_Ts] | None:
        return self._read(lambda: self._conn.execute(stmt).first())

    def _read(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` under the store's lock; PostgreSQL going away is waited out on a new
        connection (reads are repeated safely), a failed read raised as ``StoreError``."""
        deadline: float | None = None
        with self._lock:
            while True:
                try:
                    with self._reading():
                        return fn()
                except StoreError as exc:
                    cause = exc.__cause__
                    if self.database_url is None or cause is None or not db_.connection_lost(cause):
                        raise
                    deadline = deadline or time.monotonic() + OUTAGE_S
                    self._reconnect(deadline, cause)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A failed read (the database gone, a damaged file) as a ``StoreError`` naming it."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            where = db_.safe_url(self.database_url) if self.database_url else str(self.path)
            raise StoreError(f"run log at {where} could not be read: {exc.orig}") from exc

    def _mine(self, table: sa.Table) -> Any:
        return table.c.run_id == self.run_id

    def _meta_value(self, key: str) -> sa.Select[Any]:
        return sa.select(t_.meta.c.value).where(self._mine(t_.meta), t_.meta.c.key == key)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def connection(self) -> Any:
        """The driver's connection (sqlite3 or psycopg), for tests and inspection."""
        return self._raw

    def committer(self) -> GroupCommitter:
        """The group-commit writer (started on first use, stopped by ``close``)."""
        if self._committer is None:
            self._committer = GroupCommitter(self)
        return self._committer

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
            self._committer = None
        with self._lock:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                conn.close()
            self._dispose()

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
        if self.has_run():
            raise StoreError(f"{self.path} already holds a run: use `runs resume`")
        if run_id != self.run_id:
            self._rebind(run_id)
        t = now()
        row = {
            "created_at": t,
            "updated_at": t,
            "status": "running",
            "config_json": json.dumps(config),
            "dataset_name": dataset_name,
            "dataset_kind": dataset_kind,
            "dataset_hash": dataset_hash,
            "prompt_version": prompt_version,
            "code_version": code_version,
            "packages_json": json.dumps(packages),
        }
        self._tx([("run", row)])

    def _rebind(self, run_id: str) -> None:
        """Key what the store holds so far (notes, meta) by the run's own id."""
        with self._lock:
            cur = self._raw.cursor()
            cur.execute(self._begin())
            try:
                for table in (t_.meta, t_.notes, t_.gateway_runs):
                    stmt = (
                        sa.update(table)
                        .where(table.c.run_id == self.run_id)
                        .values(run_id=run_id)
                        .compile(dialect=self._conn.dialect)
                    )
                    cur.execute(str(stmt), stmt.params)
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        self.run_id = run_id
        self._write_marker()

    def has_run(self) -> bool:
        """Whether a run was started in this store (a store may hold only notes so far)."""
        return self._one(sa.select(t_.run.c.run_id).where(self._mine(t_.run))) is not None

    def set_note(self, key: str, value: str) -> None:
        """Record (or replace) what the caller keeps about the run under ``key``."""
        if self.read_only:
            raise StoreError(f"{self.path}: a read-only store of an older version takes no notes")
        self._tx([("note", {"key": key, "value": value, "updated_at": now()})])

    def note(self, key: str) -> str | None:
        """What was recorded under ``key``; None when nothing was (or the store predates notes)."""
        n = t_.notes
        row = self._one(sa.select(n.c.value).where(self._mine(n), n.c.key == key))
        return str(row[0]) if row is not None else None

    # ------------------------------------------------------------------ passports

    def record_passport(self, passport: ModelPassport) -> ModelPassport | None:
        """Record what the run knows of a model when it starts (its passport's recorded part,
        a run note), once: a passport recorded earlier (a resumed run) is kept and returned;
        None when this one was recorded."""
        key = passport_.NOTE_PREFIX + passport.model
        earlier = self.note(key)
        if earlier is not None:
            kept = passport_.recorded_passport(earlier, passport.model)
            if kept is not None:
                return kept
        self.set_note(key, passport.model_dump_json(exclude=set(passport_.OBSERVED)))
        return None

    def passports(self) -> dict[str, ModelPassport]:
        """The passport of each model of the run (its models, then its graders), keyed by the
        run's model name: the part recorded when the run started (or, for a run stored before
        passports, rebuilt from its configuration), what the stored responses say answered,
        the digest of the first-turn prompts sent, the scoring versions of its scores."""
        row = self._one(sa.select(t_.run.c.config_json).where(self._mine(t_.run)))
        try:
            config = json.loads(row[0]) if row is not None else {}
        except ValueError:
            config = {}
        config = config if isinstance(config, dict) else {}
        generate = config.get("generate") if isinstance(config.get("generate"), dict) else {}
        graded = config.get("grader_generate")
        decoding = {
            "model": {**(generate or {}), "seed": config.get("seed")},
            "grader": graded if isinstance(graded, dict) else {},
        }
        n = t_.notes
        notes = {
            str(k)[len(passport_.NOTE_PREFIX) :]: str(v)
            for k, v in self._rows(
                sa.select(n.c.key, n.c.value).where(
                    self._mine(n), n.c.key.startswith(passport_.NOTE_PREFIX, autoescape=True)
                )
            )
        }
        out: dict[str, ModelPassport] = {}
        for role in ("models", "graders"):
            for spec in config.get(role) or []:
                name = spec.get("name") if isinstance(spec, dict) else None
                if not isinstance(name, str) or name in out:
                    continue
                kept = passport_.recorded_passport(notes[name], name) if name in notes else None
                out[name] = kept or passport_.configured_passport(
                    spec, role.rstrip("s"), decoding[role.rstrip("s")]
                )
        for name, text in sorted(notes.items()):  # a model the configuration does not name
            if name not in out and (kept := passport_.recorded_passport(text, name)):
                out[name] = kept
        return {name: self._observed(p) for name, p in out.items()}

    def _observed(self, p: ModelPassport) -> ModelPassport:
        """``p`` with what the run's stored rows say of its model."""
        from evaluation.scoring.version import version_name

        r, q, s, sc = t_.responses, t_.requests, t_.samples, t_.scores
        tally = passport_.ObservedTally()
        for (output_json,) in self._rows(
            sa.select(r.c.output_json).where(self._mine(r), r.c.model == p.model)
        ):
            try:
                output = json.loads(output_json)
            except ValueError:
                continue
            if isinstance(output, dict):
                tally.add(output)
        update: dict[str, Any] = {}
        if p.role == "model":  # a grader's prompts carry the answers it grades
            hashes = [
                str(h)
                for (h,) in self._rows(
                    sa.select(q.c.prompt_hash)
                    .distinct()
                    .where(self._mine(q), q.c.model == p.model, q.c.turn == 1)
                )
            ]
            update = {"prompt_digest": passport_.prompt_digest(hashes), "prompts": len(hashes)}
            versions = self._rows(
                sa.select(sc.c.scoring_version)
                .distinct()
                .select_from(
                    sc.join(s, sa.and_(s.c.run_id == sc.c.run_id, s.c.sample_id == sc.c.sample_id))
                )
                .where(self._mine(sc), s.c.model == p.model)
            )
            update["scoring_versions"] = sorted(version_name(v) for (v,) in versions)
        return tally.fill(p.model_copy(update=update))

    # ------------------------------------------------------------------ the gateway's run

    def put_gateway_run(self, run: GatewayRun) -> None:
        """Record (or replace) the gateway's run, whole (its SR's evidence included)."""
        if run.run_id != self.run_id:
            raise StoreError(f"gateway run {run.run_id} put in the store of run {self.run_id}")
        self._tx([("gateway_run", {**gateway_run_row(run), "updated_at": now()})])

    def update_gateway_run(self, run: GatewayRun) -> None:
        """Rewrite the gateway's recorded run except its SR's evidence, which stays as stored
        (written once, by ``put_gateway_run``): ``run`` may come from ``gateway_run(evidence=
        False)``. Raises StoreError when no gateway run is recorded."""
        if run.run_id != self.run_id:
            raise StoreError(f"gateway run {run.run_id} put in the store of run {self.run_id}")
        row = {**gateway_run_row(run, evidence=False), "updated_at": now()}
        with self._writing() as cur:
            cur.execute(self._sql["gateway_run_update"], self._params(row))
            if not cur.rowcount:
                raise StoreError(f"{self.path}: no gateway run recorded for run {self.run_id}")

    def set_gateway_stage(
        self,
        stage: str,
        progress: float,
        *,
        also: Callable[[sa.Connection], object] | None = None,
        **fields: Any,
    ) -> None:
        """One small UPDATE: the run's stage and progress, and any of ``STAGE_FIELDS``
        (status, started_at, finished_at, error, timings_s). ``also`` writes more on the
        store's connection in the same transaction (the gateway's queued job: committed with
        the run's row, or neither). Raises StoreError when no gateway run is recorded."""
        unknown = set(fields) - STAGE_FIELDS
        if unknown:
            raise StoreError(
                f"set_gateway_stage cannot set {sorted(unknown)}: {sorted(STAGE_FIELDS)}"
            )
        values: dict[str, Any] = {"stage": stage, "progress": float(progress), "updated_at": now()}
        for k, v in fields.items():
            if k == "timings_s":
                values["timings_json"] = json.dumps(v)
            else:
                values[k] = v.value if isinstance(v, RunStatus) else v
        g = t_.gateway_runs
        with self._writing():
            n = self._conn.execute(sa.update(g).where(self._mine(g)).values(values)).rowcount
            if not n:
                raise StoreError(f"{self.path}: no gateway run recorded for run {self.run_id}")
            if also is not None:
                also(self._conn)

    def gateway_run(self, *, evidence: bool = True) -> GatewayRun | None:
        """The gateway's run (None: none recorded); ``evidence`` False: without its SR's
        evidence (not read). A store of before the table reads the record the gateway kept as
        its ``gateway`` note."""
        g = t_.gateway_runs
        cols = [c for c in g.c if evidence or c.name != "evidence_json"]
        row = self._one(sa.select(*cols).where(self._mine(g)))
        if row is None:
            return self._gateway_run_from_note()
        return gateway_run_of_row(row._mapping)

    def gateway_record(self, *, evidence: bool = True) -> GatewayRun | None:
        """The gateway's record of the run as the gateway reads it: the record a store of
        before the table kept as its ``gateway`` note (while not yet moved), else the row (None:
        none recorded; ``evidence`` as ``gateway_run``). Raises ``ValueError`` for a record
        that does not validate."""
        note = self.note(GATEWAY_NOTE)
        if note is not None and note != GATEWAY_NOTE_MOVED:
            return gateway_run_of_note(note)
        return self.gateway_run(evidence=evidence)

    def _gateway_run_from_note(self) -> GatewayRun | None:
        text = self.note(GATEWAY_NOTE)
        return None if text is None else gateway_run_of_note(text)

    def run_log(self) -> RunLog:
        """The run's record: config, dataset hash, versions, status, coverage."""
        row = self._one(sa.select(t_.run).where(self._mine(t_.run)))
        if row is None:
            raise StoreError(f"{self.path}: no run recorded")
        out = dict(row._mapping)
        try:
            out["config"] = json.loads(out.pop("config_json"))
            out["packages"] = json.loads(out.pop("packages_json") or "{}")
            out["coverage"] = self.coverage()
            out["scoring_versions"] = self.scoring_versions()
            return RunLog.model_validate(out)
        except (ValueError, TypeError) as exc:  # ValidationError is a ValueError
            raise StoredRecordError(
                f"{self.path}: the run's own row is not readable: {exc}"
            ) from exc

    def set_status(self, status: str) -> None:
        self._tx([("status", {"status": status, "updated_at": now()})])

    def set_config(self, config: dict[str, Any]) -> None:
        """Replace the run's recorded configuration (a resume that raises the budget)."""
        self._tx([("config", {"config_json": json.dumps(config), "updated_at": now()})])

    # ------------------------------------------------------------------ writes

    def commit(self, statements: Statements) -> None:
        """Run statements in one committed transaction (see ``committer`` for group commit)."""
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
        have = set(self._case_ids())
        t = now()
        new = [c for c in cases if c.case_id not in have]
        statements: Statements = []
        for c in new:
            uids = c.provenance.study_uids
            patient = c.patient_id or None
            statements.append(
                (
                    "case",
                    {
                        "case_id": c.case_id,
                        "case_json": c.model_dump_json(),
                        "recorded_at": t,
                        "patient_id": patient,
                        "study_uids": json.dumps(uids) if uids else None,
                    },
                )
            )
        if statements:
            self._tx(statements)
        return len({c.case_id for c in new})

    def _case_ids(self) -> list[str]:
        return [r[0] for r in self._rows(sa.select(t_.cases.c.case_id).where(self._mine(t_.cases)))]

    def record_coverage(self, evaluated: int, skipped: list[SkippedCase]) -> None:
        """How many cases the run evaluates and the ones it skipped (replacing what a previous
        start or resume recorded: the dataset as loaded now is what the run evaluates)."""
        t = now()
        statements: Statements = [("delete_skipped", {})]
        statements += [
            (
                "skipped",
                {
                    "entry": s.entry,
                    "position": s.position,
                    "case_id": s.case_id,
                    "reason": s.reason,
                    "recorded_at": t,
                },
            )
            for s in skipped
        ]
        statements.append(("meta", {"key": _CASES_EVALUATED, "value": str(evaluated)}))
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

    def erase_cases(self, case_ids: list[str]) -> int:
        """Delete every row of these cases (their calls, answers, scores, audit, snapshots);
        the number of rows deleted. For erasure: nothing of the cases is left in the run."""
        ids = sorted(set(case_ids))
        if not ids or self.read_only:
            return 0
        s = t_.samples
        sids = sa.select(s.c.sample_id).where(self._mine(s), s.c.case_id.in_(ids))
        keys = sa.select(t_.requests.c.cache_key).where(
            self._mine(t_.requests), t_.requests.c.case_id.in_(ids)
        )
        stmts: list[sa.Executable] = []
        for table in (t_.scores, t_.error_labels, t_.scored_samples):
            stmts.append(sa.delete(table).where(self._mine(table), table.c.sample_id.in_(sids)))
        for table in (t_.responses, t_.failures):
            stmts.append(sa.delete(table).where(self._mine(table), table.c.cache_key.in_(keys)))
        for table in (t_.audit, t_.samples, t_.requests, t_.cases, t_.skipped_cases):
            stmts.append(sa.delete(table).where(self._mine(table), table.c.case_id.in_(ids)))
        n = 0
        with self._writing():
            for stmt in stmts:
                n += self._conn.execute(stmt).rowcount or 0
        return n

    def erase_run(self) -> int:
        """Delete every row of this run, every table (the gateway's run included), children
        before parents, in one transaction; the number of rows deleted. For erasure: in a
        PostgreSQL run log the run's rows sit beside other runs' and go one run at a time."""
        if self.read_only:
            return 0
        tables = [t for t in reversed(t_.metadata.sorted_tables) if "run_id" in t.c]
        n = 0
        with self._lock:
            self._conn.exec_driver_sql(self._begin())
            try:
                for table in tables:
                    n += self._conn.execute(sa.delete(table).where(self._mine(table))).rowcount or 0
            except BaseException:
                self._conn.exec_driver_sql("ROLLBACK")
                raise
            self._conn.exec_driver_sql("COMMIT")
        return n

    def case_ids_of(
        self, *, patient_id: str | None = None, study_uid: str | None = None
    ) -> list[str]:
        """The run's cases of this patient or study (as their snapshots recorded them)."""
        c = t_.cases
        rows = self._rows(
            sa.select(c.c.case_id, c.c.patient_id, c.c.study_uids, c.c.case_json).where(
                self._mine(c)
            )
        )
        out = []
        for cid, patient, uids, case_json in rows:
            if patient is None and uids is None:  # recorded before these were kept
                snap = Case.model_validate_json(case_json)
                patient = snap.patient_id
                uid_list = snap.provenance.study_uids
            else:
                uid_list = json.loads(uids) if uids else []
            if (patient_id is not None and patient == patient_id) or (
                study_uid is not None and study_uid in uid_list
            ):
                out.append(str(cid))
        return out

    # ------------------------------------------------------------------ reads

    def responses(self) -> dict[str, ModelOutput]:
        """Every stored response by cache key (what resume and rescore reuse)."""
        r = t_.responses
        return {
            k: ModelOutput.model_validate_json(v)
            for k, v in self._rows(sa.select(r.c.cache_key, r.c.output_json).where(self._mine(r)))
        }

    def outputs_by_model(self) -> dict[str, list[ModelOutput]]:
        """Every stored response, by the run's model name (an estimate's latency and answer
        length of the model)."""
        r = t_.responses
        out: dict[str, list[ModelOutput]] = {}
        for m, v in self._rows(sa.select(r.c.model, r.c.output_json).where(self._mine(r))):
            out.setdefault(str(m), []).append(ModelOutput.model_validate_json(v))
        return out

    def requests(self) -> dict[str, str]:
        """Every stored request's JSON by cache key (the request as sent, without image bytes)."""
        r = t_.requests
        return {
            str(k): str(v)
            for k, v in self._rows(sa.select(r.c.cache_key, r.c.request_json).where(self._mine(r)))
        }

    def samples(self, *, calls: bool = True, scores: bool = True) -> list[SampleRecord]:
        """Every sample of the run as its typed record, by case, task, model and sample.

        ``calls``: each turn and grader call with its request as sent and its output (else only
        their keys and statuses); ``scores``: with the sample's scores, error label and scoring
        version. A stored row this code cannot read raises ``StoredRecordError``."""
        s = t_.samples
        rows = self._rows(
            sa.select(s).where(self._mine(s)).order_by(s.c.case_id, s.c.task, s.c.model, s.c.sample)
        )
        calls_of = _Calls(self) if calls else None
        all_scores = self.scores() if scores else {}
        labels = self.error_labels() if scores else {}
        versions = self.sample_scoring_versions() if scores else {}
        out = []
        for row in rows:
            r = dict(row._mapping)
            r.pop("run_id")
            sid = str(r["sample_id"])
            where = f"run {self.run_id}, sample {sid[:300]}"
            r["turns"], r["graders"] = _turns(r.pop("turns_json"), where, calls_of)
            r.update(_parsed(r.pop("parsed_json"), str(r["family"]), where))
            try:
                r["image_hashes"] = json.loads(r["image_hashes"])
                out.append(
                    SampleRecord.model_validate(
                        {
                            **r,
                            "scores": all_scores.get(sid, []),
                            "error_label": labels.get(sid),
                            "scoring_version": versions.get(sid),
                        }
                    )
                )
            except ValueError as exc:  # ValidationError is a ValueError
                raise StoredRecordError(f"{where}: not readable: {_first(exc)}") from None
        return out

    def scores(self) -> dict[str, list[Score]]:
        s = t_.scores
        out: dict[str, list[Score]] = {}
        for sid, scorer, value, expl, details in self._rows(
            sa.select(s.c.sample_id, s.c.scorer, s.c.value, s.c.explanation, s.c.details_json)
            .where(self._mine(s))
            .order_by(s.c.sample_id, s.c.scorer)
        ):
            out.setdefault(sid, []).append(
                Score(scorer=scorer, value=value, explanation=expl, details=json.loads(details))
            )
        return out

    def scoring_versions(self) -> dict[str | None, int]:
        """Scored samples per scoring version (None: scored before versions were recorded)."""
        s = t_.scores
        return {
            v: int(n)
            for v, n in self._rows(
                sa.select(s.c.scoring_version, sa.func.count(sa.distinct(s.c.sample_id)))
                .where(self._mine(s))
                .group_by(s.c.scoring_version)
                .order_by(s.c.scoring_version)
            )
        }

    def sample_scoring_versions(self) -> dict[str, str | None]:
        """The scoring version of every scored sample."""
        s = t_.scores
        return {
            str(sid): v
            for sid, v in self._rows(
                sa.select(s.c.sample_id, sa.func.max(s.c.scoring_version))
                .where(self._mine(s))
                .group_by(s.c.sample_id)
            )
        }

    def error_labels(self) -> dict[str, ErrorLabel]:
        e = t_.error_labels
        return {
            sid: ErrorLabel.model_validate_json(j)
            for sid, j in self._rows(sa.select(e.c.sample_id, e.c.label_json).where(self._mine(e)))
        }

    def cases(self) -> dict[str, Case]:
        """The run's case snapshots by case id (empty for runs recorded before snapshots)."""
        c = t_.cases
        return {
            cid: Case.model_validate_json(j)
            for cid, j in self._rows(
                sa.select(c.c.case_id, c.c.case_json).where(self._mine(c)).order_by(c.c.case_id)
            )
        }

    def scored_samples(self) -> list[str]:
        """ScoredSample JSON of every scored sample (what summaries are built from)."""
        s = t_.scored_samples
        return [
            j
            for (j,) in self._rows(
                sa.select(s.c.scored_json).where(self._mine(s)).order_by(s.c.sample_id)
            )
        ]

    def scored_by_sample(self) -> dict[str, str]:
        """ScoredSample JSON by sample id."""
        s = t_.scored_samples
        return {
            str(k): str(v)
            for k, v in self._rows(sa.select(s.c.sample_id, s.c.scored_json).where(self._mine(s)))
        }

    def coverage(self) -> CaseCoverage:
        """The cases evaluated out of those the dataset lists, and every skipped one with why.

        A run stored before this was recorded: ``recorded`` is False and ``evaluated`` counts the
        cases its samples answer."""
        evaluated = self._one(self._meta_value(_CASES_EVALUATED))
        if evaluated is None:
            s = t_.samples
            n = self._one(sa.select(sa.func.count(sa.distinct(s.c.case_id))).where(self._mine(s)))
            return CaseCoverage(evaluated=int(n[0]) if n else 0, recorded=False)
        k = t_.skipped_cases
        rows = self._rows(
            sa.select(k.c.entry, k.c.position, k.c.case_id, k.c.reason)
            .where(self._mine(k))
            .order_by(k.c.n)
        )
        skipped = [SkippedCase(entry=e, position=p, case_id=c, reason=r) for e, p, c, r in rows]
        return CaseCoverage(evaluated=int(evaluated[0]), skipped=skipped)

    def call_errors(self, retries: dict[str, int] | None = None) -> list[CallErrors]:
        """Per model, the samples that ended in an error: how many, the first message and how
        many distinct ones, and the retries its calls took (the stored responses' and
        failures': ``retries()``, or the result of it a caller already holds). Models without a
        failed sample are left out."""
        retries = self.retries() if retries is None else retries
        s = t_.samples
        failed = sa.and_(self._mine(s), s.c.status == "error")
        groups: list[CallErrors] = []
        for model, n, distinct in self._rows(
            sa.select(s.c.model, sa.func.count(), sa.func.count(sa.distinct(s.c.parse_error)))
            .where(failed)
            .group_by(s.c.model)
            .order_by(s.c.model)
        ):
            first = self._one(
                sa.select(s.c.parse_error)
                .where(failed, s.c.model == model)
                .order_by(s.c.updated_at, s.c.sample_id)
                .limit(1)
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

    def response_costs(self) -> dict[str, list[float | None]]:
        """Each model's stored responses' costs, one per answered call (None: no price)."""
        r = t_.responses
        out: dict[str, list[float | None]] = {}
        for model, output_json in self._rows(
            sa.select(r.c.model, r.c.output_json).where(self._mine(r))
        ):
            cost = json.loads(output_json).get("cost_usd")
            out.setdefault(str(model), []).append(
                float(cost) if isinstance(cost, int | float) else None
            )
        return out

    def retries(self) -> dict[str, int]:
        """Retries per model: the extra attempts its calls took, answered or failed in the end
        (each call's ``ModelOutput.retries``)."""
        out: dict[str, int] = {}
        for table in (t_.responses, t_.failures):
            for model, output_json in self._rows(
                sa.select(table.c.model, table.c.output_json).where(self._mine(table))
            ):
                n = json.loads(output_json).get("retries") or 0
                if n:
                    out[model] = out.get(model, 0) + int(n)
        return out

    def counts(self) -> StoreCounts:
        tables = {
            t.name: int(
                self._one(sa.select(sa.func.count()).select_from(t).where(self._mine(t)))[0]  # type: ignore[index]
            )
            for t in (t_.requests, t_.responses, t_.failures, t_.samples, t_.scores, t_.audit)
        }
        s = t_.samples
        by_status = {
            str(status): int(n)
            for status, n in self._rows(
                sa.select(s.c.status, sa.func.count()).where(self._mine(s)).group_by(s.c.status)
            )
        }
        return StoreCounts(**tables, by_status=by_status)

    def audit(self) -> Iterator[AuditRecord]:
        a = t_.audit
        for (j,) in self._rows(sa.select(a.c.record_json).where(self._mine(a)).order_by(a.c.id)):
            yield AuditRecord.model_validate_json(j)


# --------------------------------------------------------------------------- rows as JSON

# The inserts whose consecutive rows go to PostgreSQL as one statement: name -> (table, what a
# row whose key is there already does, the column the database numbers)
_ROWS_OF: dict[str, tuple[sa.Table, str, str | None]] = {
    "score": (t_.scores, "update", None),
    "response": (t_.responses, "update", None),
    "request": (t_.requests, "keep", None),
    "case": (t_.cases, "keep", None),
    "audit": (t_.audit, "insert", "id"),
    "failure": (t_.failures, "insert", "id"),
}
_PG_TYPES = {sa.Text: "text", sa.Integer: "bigint", sa.Float: "float8"}
_ROWS_SQL: dict[str, str] = {}


def _runs(records: list[Statements]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The statements of ``records`` in order, consecutive ones of the same name together."""
    name = ""
    group: list[dict[str, Any]] = []
    for statements in records:
        for n, args in statements:
            if n != name and group:
                yield name, group
                group = []
            name = n
            group.append(args)
    if group:
        yield name, group


def _row_columns(name: str) -> list[sa.Column[Any]]:
    table, _, numbered = _ROWS_OF[name]
    return [c for c in table.columns if c.name not in ("run_id", numbered)]


def _json_rows(name: str, group: list[dict[str, Any]]) -> str | None:
    """``group``'s rows as one JSON array, or None when they cannot go as one statement: two
    rows with one key (PostgreSQL updates a row once per statement) or a value JSON cannot
    carry (a non-finite number)."""
    table = _ROWS_OF[name][0]
    key = [c.name for c in table.primary_key.columns if c.name in group[0]]
    if key and len({tuple(g[k] for k in key) for g in group}) < len(group):
        return None
    try:
        return json.dumps(group, allow_nan=False)
    except (ValueError, TypeError):
        return None


def _rows_sql(name: str) -> str:
    """PostgreSQL: insert the rows of the JSON parameter ``rows`` into statement ``name``'s
    table for the run ``run_id``, as the statement itself does with a key already there."""
    with _SQL_LOCK:
        if name in _ROWS_SQL:
            return _ROWS_SQL[name]
    table, kind, _ = _ROWS_OF[name]
    cols = _row_columns(name)
    names = ", ".join(f'"{c.name}"' for c in cols)  # quoted: "text", "time" are columns
    types = ", ".join(f'"{c.name}" {_PG_TYPES[type(c.type)]}' for c in cols)
    sql = (
        f"INSERT INTO {table.name} (run_id, {names}) SELECT %(run_id)s, {names} "
        f"FROM json_to_recordset(%(rows)s::json) AS x({types})"
    )
    key = ", ".join(c.name for c in table.primary_key.columns)
    if kind == "update":
        rest = ", ".join(
            f'"{c.name}" = excluded."{c.name}"' for c in cols if c.name not in table.primary_key.c
        )
        sql += f" ON CONFLICT ({key}) DO UPDATE SET {rest}"
    elif kind == "keep":
        sql += f" ON CONFLICT ({key}) DO NOTHING"
    with _SQL_LOCK:
        _ROWS_SQL[name] = sql
    return sql


# --------------------------------------------------------------------------- reading samples


def _first(exc: Exception) -> str:
    """A validation error as a person reads it (its first error), or the error's text."""
    from pydantic import ValidationError

    from evaluation.errors import first_error

    return first_error(exc, "the row") if isinstance(exc, ValidationError) else str(exc)[:300]


class _Calls:
    """The requests and outputs of a run's calls, read once and parsed on first use."""

    def __init__(self, store: RunStore) -> None:
        self._requests = store.requests()
        r, f = t_.responses, t_.failures
        self._responses = dict(
            store._rows(sa.select(r.c.cache_key, r.c.output_json).where(store._mine(r)))
        )
        self._failures = dict(  # the last failure of a key (resume may have tried it again)
            store._rows(
                sa.select(f.c.cache_key, f.c.output_json).where(store._mine(f)).order_by(f.c.id)
            )
        )
        self._sent: dict[str, SentRequest | None] = {}
        self._out: dict[str, ModelOutput | None] = {}

    def request(self, key: str, where: str) -> SentRequest | None:
        if key not in self._sent:
            raw = self._requests.get(key)
            sent = None
            if raw is not None:
                try:
                    record = json.loads(raw)
                except ValueError as exc:
                    raise StoredRecordError(f"{where}: its request is not JSON ({exc})") from None
                sent = SentRequest.from_record(record if isinstance(record, dict) else {})
            self._sent[key] = sent
        return self._sent[key]

    def output(self, key: str, where: str) -> ModelOutput | None:
        if key not in self._out:
            raw = self._responses.get(key) or self._failures.get(key)
            try:
                self._out[key] = None if raw is None else ModelOutput.model_validate_json(raw)
            except ValueError as exc:
                raise StoredRecordError(
                    f"{where}: its output is not readable: {_first(exc)}"
                ) from None
        return self._out[key]


def _turns(raw: str, where: str, calls: _Calls | None) -> tuple[list[SampleTurn], list[GraderCall]]:
    """A samples row's turns and grader calls (``turns_json``), typed, with their calls."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StoredRecordError(f"{where}: its turns are not JSON ({exc})") from None
    if not isinstance(data, list):
        raise StoredRecordError(f"{where}: its turns are not a list")
    turns: list[SampleTurn] = []
    graders: list[GraderCall] = []
    for n, t in enumerate(data, start=1):
        if not isinstance(t, dict):
            raise StoredRecordError(f"{where}: stored turn {n} is not an object")
        at = f"{where}, stored turn {n}"
        try:
            call: SampleTurn | GraderCall = (
                GraderCall.model_validate(t) if "grader" in t else SampleTurn.model_validate(t)
            )
        except ValueError as exc:
            raise StoredRecordError(f"{at}: {_first(exc)}") from None
        if calls is not None:
            call.request = calls.request(call.cache_key, at)
            call.output = calls.output(call.cache_key, at)
        (graders if isinstance(call, GraderCall) else turns).append(call)  # type: ignore[arg-type]
    return turns, graders


def _parsed(raw: str | None, family: str, where: str) -> dict[str, Any]:
    """The parsed answer of a samples row (``parsed_json``: a ParsedAnswer as JSON), typed by
    the task family, with what parsing found missing and repaired."""
    if not raw:
        return {"parsed": None}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StoredRecordError(f"{where}: its parsed answer is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StoredRecordError(f"{where}: its parsed answer is not an object")
    answer = data.get("answer")
    out: dict[str, Any] = {
        "missing_fields": data.get("missing_fields") or [],
        "repairs": data.get("repairs") or [],
        "parsed": None,
    }
    if answer is not None:
        kind = ClassificationAnswer if family == "classification" else Answer
        try:
            out["parsed"] = kind.model_validate(answer)
        except ValueError as exc:
            raise StoredRecordError(f"{where}: its parsed answer: {_first(exc)}") from None
    return out


_REACHED: set[str] = set()  # run logs this process has reached: a refusal now is a restart


def _restarting(exc: sa.exc.OperationalError, reached: bool) -> bool:
    """Whether the server said it is starting up or shutting down, or (``reached`` before)
    refused the connection: a restart in progress, not a wrong URL or credentials."""
    text = str(exc.orig).lower()
    words = ["starting up", "shutting down", "terminating connection", "recovery"]
    return any(w in text for w in [*words, *(["connection refused"] if reached else [])])
