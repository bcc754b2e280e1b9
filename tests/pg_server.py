"""A real PostgreSQL (Debian's) for the test session, on a free loopback port.

Started once per session (per xdist worker) through ``gateway.pg_local`` — ``initdb`` as the
``postgres`` user when the tests run as root, trust authentication on loopback, ``fsync`` off —
and stopped by PID at the end, its folder removed. Fixture ``pg_url``: the SQLAlchemy URL
(``postgresql+psycopg://postgres@127.0.0.1:PORT/neurosandbox``) of the session's database;
``fresh_pg_database(pg_url)`` gives a test an empty database of its own on the same server.

Skips when PostgreSQL is not installed, unless ``NEUROSANDBOX_REQUIRE_PG=1`` or ``CI`` is set:
then the tests fail, so CI never passes by skipping the PostgreSQL half.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.pg_local import (
    DEBIAN_ROOT,
    LocalPostgres,
    PostgresNotInstalledError,
    create_database,
    find_bindir,
)


def postgres_required() -> bool:
    """True when a missing PostgreSQL must fail the tests instead of skipping them."""
    return os.environ.get("NEUROSANDBOX_REQUIRE_PG") == "1" or bool(os.environ.get("CI"))


def postgres_bindir(root: Path = DEBIAN_ROOT) -> Path:
    """The server binaries; skip (or fail when required) when PostgreSQL is not installed."""
    try:
        return find_bindir(root)
    except PostgresNotInstalledError as exc:
        if postgres_required():
            pytest.fail(f"{exc}; NEUROSANDBOX_REQUIRE_PG=1 or CI is set, so this is a failure")
        pytest.skip(str(exc))


def fresh_pg_database(url: str) -> str:
    """A new, empty database on the server of ``url``; its URL."""
    return create_database(url)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres]:
    server = LocalPostgres(bindir=postgres_bindir())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg_server: LocalPostgres) -> str:
    return pg_server.url
