"""The gateway's runs as rows of ``gateway_runs``: a ``GatewayRun`` to its row and back (the one
encoding, which ``RunStore`` writes and reads too), and the runs of an install listed from its
PostgreSQL run log by one query each (with SQLite, one file per run, the gateway lists its run
folders instead). Listings read rows without the SR's evidence (large, and no listing shows it):
``RunStore.gateway_run`` reads a run whole."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from evaluation.errors import StoreError
from evaluation.log import db as db_
from evaluation.log import schema as t_
from evaluation.log.records import GatewayRun

# the record's facts that are columns of their own (one small UPDATE per pipeline stage)
COLUMNS = ("status", "stage", "progress", "started_at", "finished_at", "error")


def gateway_run_row(run: GatewayRun, *, evidence: bool = True) -> dict[str, Any]:
    """The ``gateway_runs`` row of ``run`` (without ``run_id`` and ``updated_at``, which the
    store adds); ``evidence`` False: without ``evidence_json`` (left as stored)."""
    row: dict[str, Any] = {c: getattr(run, c) for c in COLUMNS}
    row["status"] = run.status.value
    row |= {
        "study_uid": run.study_uid,
        "patient_id": None,
        "timings_json": json.dumps(run.timings_s),
        "record_json": run.model_dump_json(exclude={"evidence", "timings_s", *COLUMNS}),
    }
    if evidence:
        row["evidence_json"] = (
            json.dumps([e.model_dump() for e in run.evidence]) if run.evidence else None
        )
    return row


def gateway_run_of_row(m: Any) -> GatewayRun:
    """A ``gateway_runs`` row (its mapping) as the record; a row read without its
    ``evidence_json`` column gives a record without evidence."""
    data = json.loads(m["record_json"])
    data |= {c: m[c] for c in COLUMNS}
    data["timings_s"] = json.loads(m["timings_json"])
    evidence = m.get("evidence_json")
    data["evidence"] = json.loads(evidence) if evidence else []
    return GatewayRun.model_validate(data)


def _rows(url: str, stmt: sa.Select[Any]) -> list[sa.Row[Any]]:
    try:
        with db_.postgres_engine(url).connect() as conn:
            return list(conn.execute(stmt).fetchall())
    except sa.exc.OperationalError as exc:
        raise StoreError(f"database {db_.safe_url(url)} not reachable: {exc.orig}") from exc


def gateway_run_ids(url: str, after: str | None = None) -> list[str]:
    """The ids of the gateway's runs at ``url``, newest first (run ids are time-ordered);
    those after the run id ``after`` only, when given."""
    g = t_.gateway_runs
    stmt = sa.select(g.c.run_id).order_by(g.c.run_id.desc())
    if after is not None:
        stmt = stmt.where(g.c.run_id > after)
    return [str(r[0]) for r in _rows(url, stmt)]


def list_gateway_runs(url: str, limit: int = 100, study_uid: str | None = None) -> list[GatewayRun]:
    """The newest gateway runs at ``url`` first (of ``study_uid`` only, when given), without
    their evidence. A row that does not validate is left out."""
    g = t_.gateway_runs
    cols = [c for c in g.c if c.name != "evidence_json"]
    stmt = sa.select(*cols).order_by(g.c.run_id.desc()).limit(max(0, int(limit)))
    if study_uid is not None:
        stmt = stmt.where(g.c.study_uid == study_uid)
    out = []
    for row in _rows(url, stmt):
        try:
            out.append(gateway_run_of_row(row._mapping))
        except ValueError:
            continue
    return out
