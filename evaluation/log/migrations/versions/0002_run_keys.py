"""Every table keyed by ``run_id`` too (one PostgreSQL database holds every run of an install);
``cases`` keeps the patient and study UIDs that erasure finds a case by.

The tables are copied: renamed aside, created in their new shape, filled (the run id of a legacy
file's rows is its ``run`` row's, else the one the opener passes: its folder's name), dropped.

Revision ID: 0002_run_keys
"""

import json

import sqlalchemy as sa
from alembic import context, op

from evaluation.log import schema

revision = "0002_run_keys"
down_revision = "0001_legacy"
branch_labels = None
depends_on = None

# The schema at this revision: schema.py's tables but those later revisions add (0003's
# gateway runs, 0004's claims). A later revision that changes one of these tables must freeze
# its shape here first.
_LATER = {"gateway_runs", "call_claims", "call_attempts", "provider_leases", "job_outbox"}
_TABLES = [t for t in schema.metadata.sorted_tables if t.name not in _LATER]
_NEW_IN_CASES = ("patient_id", "study_uids")


def _case_keys(case_json: str) -> tuple[str | None, str | None]:
    try:
        case = json.loads(case_json)
    except ValueError:
        return None, None
    patient = case.get("patient_id") or None
    uids = (case.get("provenance") or {}).get("study_uids") or []
    return patient, json.dumps(uids) if uids else None


def upgrade() -> None:
    conn = op.get_bind()
    row = conn.exec_driver_sql("SELECT run_id FROM run LIMIT 1").first()
    run_id = str(row[0]) if row else str(context.config.attributes.get("run_id") or "")
    for t in reversed(_TABLES):  # children first (PostgreSQL keeps their keys' targets)
        op.rename_table(t.name, f"_old_{t.name}")
    for idx in ("samples_model", "failures_key"):
        op.execute(f"DROP INDEX IF EXISTS {idx}")
    md = sa.MetaData()
    for t in _TABLES:
        t.to_metadata(md).create(conn)
    for t in _TABLES:
        cols = [c.name for c in t.columns if c.name != "run_id" and c.name not in _NEW_IN_CASES]
        if t.name == "cases":
            rows = conn.exec_driver_sql(
                "SELECT case_id, case_json, recorded_at FROM _old_cases"
            ).fetchall()
            if rows:
                conn.execute(
                    t.insert(),
                    [
                        dict(zip(("patient_id", "study_uids"), _case_keys(j), strict=True))
                        | {"run_id": run_id, "case_id": c, "case_json": j, "recorded_at": r}
                        for c, j, r in rows
                    ],
                )
            continue
        names = ", ".join(cols)
        conn.execute(
            sa.text(
                f"INSERT INTO {t.name} (run_id, {names}) SELECT :rid, {names} FROM _old_{t.name}"
            ),
            {"rid": run_id},
        )
    for t in reversed(_TABLES):
        op.drop_table(f"_old_{t.name}")
    if conn.dialect.name == "postgresql":  # the counters go on from the copied ids
        for table, col in (("failures", "id"), ("audit", "id"), ("skipped_cases", "n")):
            op.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{col}'), "
                f"COALESCE((SELECT MAX({col}) FROM {table}), 0) + 1, false)"
            )


def downgrade() -> None:
    raise NotImplementedError("the run log is never downgraded")
