"""A run store of the layout before Alembic (revision ``0001_legacy``, store version 1): a
current ``run.sqlite`` rewritten table by table into the legacy tables (no run id in any key),
optionally older still (without the tables and column added later), as the files that runs of
earlier versions left on disk."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

from evaluation.log.db import LEGACY

_VERSIONS = Path(__file__).resolve().parents[1] / "evaluation/log/migrations/versions"


def legacy_schema() -> list[str]:
    """The CREATE statements of revision 0001_legacy (the migration's own list)."""
    spec = importlib.util.spec_from_file_location("legacy", _VERSIONS / f"{LEGACY}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module._SCHEMA)


def make_legacy(db: Path, *, drop: tuple[str, ...] = (), no_scoring_version: bool = False) -> None:
    """Rewrite ``db`` (a current run.sqlite) as a legacy one; ``drop``: tables it predates."""
    db = Path(db)
    out = db.with_name("legacy.sqlite")
    out.unlink(missing_ok=True)
    con = sqlite3.connect(out)
    for sql in legacy_schema():
        con.execute(sql)
    con.execute("ATTACH DATABASE ? AS cur", (str(db),))
    tables = [r[0] for r in con.execute("SELECT name FROM main.sqlite_master WHERE type='table'")]
    for table in tables:
        cols = [r[1] for r in con.execute(f"PRAGMA main.table_info({table})")]
        names = ", ".join(cols)
        con.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM cur.{table}")
    con.execute("UPDATE main.meta SET value='1' WHERE key='store_version'")
    con.commit()
    con.execute("DETACH DATABASE cur")
    for table in drop:
        con.execute(f"DROP TABLE {table}")
    if no_scoring_version:
        con.execute("ALTER TABLE scores DROP COLUMN scoring_version")
    con.commit()
    con.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    out.replace(db)
