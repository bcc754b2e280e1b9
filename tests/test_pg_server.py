"""The tests' PostgreSQL: started on loopback, answers, gives fresh databases, and leaves
nothing running (the postmaster's PID and its children gone, its folder removed)."""

from __future__ import annotations

import socket
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from pg_server import fresh_pg_database, postgres_bindir

from gateway.pg_local import LocalPostgres, PostgresError, create_database


def _conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_session_server_answers_on_loopback_with_fsync_off(pg_url: str) -> None:
    assert pg_url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    with psycopg.connect(_conninfo(pg_url)) as conn:
        row = conn.execute(
            "SELECT current_database(), current_setting('listen_addresses'), "
            "current_setting('fsync'), 6 * 7"
        ).fetchone()
    assert row == ("neurosandbox", "127.0.0.1", "off", 42)
    # the URL is what the store hands to SQLAlchemy
    with sa.create_engine(pg_url).connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


def test_fresh_databases_are_empty_and_apart(pg_url: str) -> None:
    first, second = fresh_pg_database(pg_url), fresh_pg_database(pg_url)
    assert first != second and first.rsplit("/", 1)[0] == pg_url.rsplit("/", 1)[0]
    with psycopg.connect(_conninfo(first), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with psycopg.connect(_conninfo(second)) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)
    with pytest.raises(PostgresError, match="database name"):
        create_database(pg_url, 'x"; DROP DATABASE neurosandbox; --')


def test_start_query_stop_leaves_nothing_running() -> None:
    server = LocalPostgres(bindir=postgres_bindir())
    server.start()
    try:
        pid, port, root = server.pid, server.port, server.root
        assert pid is not None and port is not None and root is not None
        assert Path(f"/proc/{pid}").exists() and _children(pid)  # checkpointer, walwriter...
        children = _children(pid)
        with psycopg.connect(_conninfo(server.url)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped: no zombie either
    assert not [c for c in children if Path(f"/proc/{c}").exists()]
    assert not root.exists()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))
    server.stop()  # twice is harmless


def test_missing_postgres_skips_or_fails_when_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NEUROSANDBOX_REQUIRE_PG", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install postgresql"):
        postgres_bindir(tmp_path)
    monkeypatch.setenv("NEUROSANDBOX_REQUIRE_PG", "1")
    with pytest.raises(pytest.fail.Exception, match="NEUROSANDBOX_REQUIRE_PG"):
        postgres_bindir(tmp_path)
    monkeypatch.delenv("NEUROSANDBOX_REQUIRE_PG")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        postgres_bindir(tmp_path)
