"""Engines and schema versions of the run log: SQLite (one file per run) or PostgreSQL (one
database per install, every run keyed by its id), both brought to ``schema.HEAD`` by Alembic.

A new store is created from the schema and stamped at ``HEAD``; an existing one is read at its
revision: a SQLite file of an older revision (or a ``run.sqlite`` of before Alembic, which holds
the tables but no ``alembic_version``: stamped ``0001_legacy`` first) is upgraded when opened;
one that cannot be written is read as it is (``legacy_views``). A PostgreSQL database is
upgraded only by ``upgrade(url)`` (``neurosandbox db upgrade``); a store refuses an older one.
Nothing here reads the environment: the caller passes the URL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy import event

from evaluation.errors import StoreError
from evaluation.log import schema

LEGACY = "0001_legacy"
_MIGRATIONS = Path(__file__).with_name("migrations")
_pg_engines: dict[str, sa.Engine] = {}
_pg_lock = threading.Lock()


class SchemaStatus(BaseModel):
    """Where a database's schema stands: its revision (None: empty) against this code's head."""

    url: str  # without the password
    current: str | None
    head: str = schema.HEAD

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


class SchemaOutOfDateError(StoreError):
    """The PostgreSQL run log is at an older revision than this code reads."""


def is_postgres(url: str | None) -> bool:
    return bool(url) and str(url).startswith(("postgresql", "postgres:"))


def safe_url(url: str) -> str:
    """``url`` without its password (for messages and status)."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparsable database URL>"


def sqlite_engine(
    path: Path, *, durable: bool = False, migrating: bool = False, read_only: bool = False
) -> sa.Engine:
    """One engine (one connection, shared under the store's lock) for one run's file."""
    import sqlite3

    uri = Path(path).resolve().as_uri() + ("?mode=ro" if read_only else "")
    eng = sa.create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=10),
        poolclass=sa.pool.StaticPool,
        paramstyle="named",
    )

    @event.listens_for(eng, "connect")
    def _pragmas(dbapi: Any, _record: Any) -> None:
        dbapi.isolation_level = None  # we say BEGIN; the driver never does
        dbapi.execute("PRAGMA busy_timeout=10000")
        with suppress(Exception):
            dbapi.execute("PRAGMA journal_mode=WAL")
        dbapi.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        # a migration copies tables whose keys change: keys are checked by the new schema
        dbapi.execute(f"PRAGMA foreign_keys={'OFF' if migrating else 'ON'}")

    if migrating:

        @event.listens_for(eng, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


# The server ends the session of a client that vanished (a host cut off, its link down) within
# about ten seconds, freeing the row locks of a transaction it was in: keepalives on an idle
# connection, and a bound on data the client never acknowledges (a session sending to it).
DEAD_CLIENT = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
    "-c tcp_user_timeout=10000"
)


def postgres_engine(url: str) -> sa.Engine:
    """The process's engine for ``url`` (one pool per URL: stores borrow a connection each)."""
    with _pg_lock:
        eng = _pg_engines.get(url)
        if eng is None:
            try:
                eng = sa.create_engine(url, pool_size=4, max_overflow=32, pool_pre_ping=True,
                                       connect_args={"options": DEAD_CLIENT})  # fmt: skip
            except (sa.exc.ArgumentError, ImportError) as exc:
                raise StoreError(f"database URL {safe_url(url)}: {exc}") from exc
            _pg_engines[url] = eng
        return eng


def current_revision(conn: sa.Connection) -> str | None:
    """The revision ``conn``'s database is stamped at; None when it holds no alembic_version."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
    return str(row[0]) if row else None


def _alembic(conn: sa.Connection, run_id: str | None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = conn
    cfg.attributes["run_id"] = run_id
    return cfg


def migrate(conn: sa.Connection, run_id: str | None = None) -> None:
    """Bring ``conn``'s database to HEAD inside the caller's transaction: a pre-Alembic
    ``run.sqlite`` is completed to today's legacy layout and stamped ``0001_legacy`` first."""
    from alembic import command

    cfg = _alembic(conn, run_id)
    if current_revision(conn) is None and sa.inspect(conn).has_table("run"):
        complete_legacy(conn)
        command.stamp(cfg, LEGACY)
    command.upgrade(cfg, "head")


def create(conn: sa.Connection) -> None:
    """A new store: the schema at HEAD, stamped so (no migration to replay)."""
    schema.metadata.create_all(conn)
    conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    conn.execute(
        sa.text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": schema.HEAD}
    )


# The legacy layout's tables and columns added after its first version (read as "not recorded").
_LEGACY_LATER = {
    "skipped_cases": (
        "CREATE TABLE IF NOT EXISTS skipped_cases (n INTEGER PRIMARY KEY, entry TEXT NOT NULL, "
        "position INTEGER, case_id TEXT, reason TEXT NOT NULL, recorded_at TEXT NOT NULL)"
    ),
    "notes": (
        "CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
        "updated_at TEXT NOT NULL)"
    ),
}


def complete_legacy(conn: sa.Connection) -> None:
    """What the pre-Alembic store added when opened: ``scores.scoring_version``, the skipped
    cases and the notes (a file of any earlier version becomes exactly ``0001_legacy``)."""
    insp = sa.inspect(conn)
    if "scoring_version" not in {c["name"] for c in insp.get_columns("scores")}:
        conn.exec_driver_sql("ALTER TABLE scores ADD COLUMN scoring_version TEXT")
    for sql in _LEGACY_LATER.values():
        conn.exec_driver_sql(sql)


# A legacy file that cannot be written is read through TEMP views of the same names (SQLite
# looks in ``temp`` first): each adds the run id and the columns and tables it lacks.
_LEGACY_ADDED = {"cases": ("patient_id", "study_uids"), "scores": ("scoring_version",)}


def legacy_views(raw: Any, run_id: str) -> None:
    """Read a legacy (pre-``0002``) SQLite file as the current schema, without writing it."""
    have = {r[0] for r in raw.execute("SELECT name FROM main.sqlite_master WHERE type='table'")}
    quoted = "'" + run_id.replace("'", "''") + "'"
    for table in schema.metadata.sorted_tables:
        name = table.name
        if name in have:
            cols = {r[1] for r in raw.execute(f"PRAGMA main.table_info({name})")}
            parts = [
                f"main.{name}.{c.name}" if c.name in cols else f"NULL AS {c.name}"
                for c in table.columns
                if c.name != "run_id"
            ]
            sql = f"SELECT {quoted} AS run_id, {', '.join(parts)} FROM main.{name}"
        else:
            sql = "SELECT " + ", ".join(f"NULL AS {c.name}" for c in table.columns) + " WHERE 0"
        raw.execute(f"CREATE TEMP VIEW IF NOT EXISTS {name} AS {sql}")


@contextmanager
def _pg_transaction(url: str) -> Iterator[sa.Connection]:
    try:
        with postgres_engine(url).begin() as conn:
            yield conn
    except sa.exc.OperationalError as exc:
        raise StoreError(f"database {safe_url(url)} not reachable: {exc.orig}") from exc


def schema_status(url: str) -> SchemaStatus:
    """The revision of the run log at ``url`` against this code's head (nothing written)."""
    if not is_postgres(url):
        path = Path(url.removeprefix("sqlite:///"))
        eng = sqlite_engine(path)
        try:
            with eng.connect() as conn:
                return SchemaStatus(url=url, current=current_revision(conn))
        finally:
            eng.dispose()
    with _pg_transaction(url) as conn:
        return SchemaStatus(url=safe_url(url), current=current_revision(conn))


def upgrade(url: str, *, run_id: str | None = None) -> SchemaStatus:
    """Migrate the run log at ``url`` (a PostgreSQL URL, or ``sqlite:///<run.sqlite>``) to
    head, in one transaction; an empty database gets the whole schema."""
    if not is_postgres(url):
        path = Path(url.removeprefix("sqlite:///"))
        eng = sqlite_engine(path, migrating=True)
        try:
            with eng.begin() as conn:
                migrate(conn, run_id or path.parent.name)
        finally:
            eng.dispose()
        return schema_status(url)
    with _pg_transaction(url) as conn:
        # one migrator at a time (two gateways starting together)
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(3600036)")
        migrate(conn, run_id)
    return schema_status(url)


upgrade_run_log = upgrade  # the name the evaluation face exports (``upgrade`` alone says little)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection to the database is gone (a restart, a network
    outage), not that a statement was refused."""
    import psycopg

    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig or exc
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
