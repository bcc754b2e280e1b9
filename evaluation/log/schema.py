"""The run log's one schema (SQLAlchemy Core): every table keyed by ``run_id`` too, so that one
PostgreSQL database holds every run of an install and a SQLite file one run.

JSON parts are TEXT columns holding pydantic JSON (the store reads them back as typed records).
Tables with a counter key (``failures``, ``audit``, ``skipped_cases``) keep their integer id as
the key (unique across runs) and index ``run_id``. The Alembic revisions in ``migrations/`` end
at this schema (``HEAD``); a new store is created from it directly and stamped at ``HEAD``.
"""

from __future__ import annotations

import sqlalchemy as sa

HEAD = "0005_job_outbox"

metadata = sa.MetaData()


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.Text, nullable=False)


meta = sa.Table(
    "meta",
    metadata,
    _run_id(),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "key", name="pk_meta"),
)
run = sa.Table(
    "run",
    metadata,
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("dataset_name", sa.Text),
    sa.Column("dataset_kind", sa.Text),
    sa.Column("dataset_hash", sa.Text, nullable=False),
    sa.Column("prompt_version", sa.Text),
    sa.Column("code_version", sa.Text),
    sa.Column("packages_json", sa.Text),
    sa.PrimaryKeyConstraint("run_id", name="pk_run"),
)
requests = sa.Table(
    "requests",
    metadata,
    _run_id(),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("case_id", sa.Text, nullable=False),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("sample", sa.Integer, nullable=False),
    sa.Column("turn", sa.Integer, nullable=False),
    sa.Column("image_hashes", sa.Text, nullable=False),
    sa.Column("prompt_hash", sa.Text, nullable=False),
    sa.Column("request_json", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "cache_key", name="pk_requests"),
    sa.Index("ix_requests_case", "run_id", "case_id"),
)
responses = sa.Table(
    "responses",
    metadata,
    _run_id(),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("output_json", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "cache_key", name="pk_responses"),
    sa.ForeignKeyConstraint(
        ["run_id", "cache_key"],
        ["requests.run_id", "requests.cache_key"],
        name="fk_responses_request",
    ),
)
failures = sa.Table(
    "failures",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    _run_id(),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("output_json", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Index("ix_failures_key", "run_id", "cache_key"),
)
samples = sa.Table(
    "samples",
    metadata,
    _run_id(),
    sa.Column("sample_id", sa.Text, nullable=False),
    sa.Column("case_id", sa.Text, nullable=False),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("sample", sa.Integer, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("turns_json", sa.Text, nullable=False),
    sa.Column("parsed_json", sa.Text),
    sa.Column("parse_error", sa.Text),
    sa.Column("image_hashes", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "sample_id", name="pk_samples"),
    sa.Index("ix_samples_model", "run_id", "model"),
    sa.Index("ix_samples_case", "run_id", "case_id"),
)
scores = sa.Table(
    "scores",
    metadata,
    _run_id(),
    sa.Column("sample_id", sa.Text, nullable=False),
    sa.Column("scorer", sa.Text, nullable=False),
    sa.Column("value", sa.Float),
    sa.Column("explanation", sa.Text, nullable=False),
    sa.Column("details_json", sa.Text, nullable=False),
    sa.Column("scored_at", sa.Text, nullable=False),
    sa.Column("scoring_version", sa.Text),
    sa.PrimaryKeyConstraint("run_id", "sample_id", "scorer", name="pk_scores"),
    sa.ForeignKeyConstraint(
        ["run_id", "sample_id"], ["samples.run_id", "samples.sample_id"], name="fk_scores_sample"
    ),
)
error_labels = sa.Table(
    "error_labels",
    metadata,
    _run_id(),
    sa.Column("sample_id", sa.Text, nullable=False),
    sa.Column("label_json", sa.Text, nullable=False),
    sa.Column("scored_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "sample_id", name="pk_error_labels"),
    sa.ForeignKeyConstraint(
        ["run_id", "sample_id"], ["samples.run_id", "samples.sample_id"], name="fk_labels_sample"
    ),
)
scored_samples = sa.Table(
    "scored_samples",
    metadata,
    _run_id(),
    sa.Column("sample_id", sa.Text, nullable=False),
    sa.Column("scored_json", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "sample_id", name="pk_scored_samples"),
    sa.ForeignKeyConstraint(
        ["run_id", "sample_id"], ["samples.run_id", "samples.sample_id"], name="fk_scored_sample"
    ),
)
audit = sa.Table(
    "audit",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    _run_id(),
    sa.Column("time", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("case_id", sa.Text, nullable=False),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("remote", sa.Integer, nullable=False),
    sa.Column("deidentified", sa.Integer, nullable=False),
    sa.Column("record_json", sa.Text, nullable=False),
    sa.Index("ix_audit_run", "run_id", "case_id"),
)
cases = sa.Table(
    "cases",
    metadata,
    _run_id(),
    sa.Column("case_id", sa.Text, nullable=False),
    sa.Column("case_json", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
    # what erasure finds a case by (None: a case recorded before these were kept)
    sa.Column("patient_id", sa.Text),
    sa.Column("study_uids", sa.Text),  # JSON list
    sa.PrimaryKeyConstraint("run_id", "case_id", name="pk_cases"),
)
skipped_cases = sa.Table(
    "skipped_cases",
    metadata,
    sa.Column("n", sa.Integer, primary_key=True, autoincrement=True),
    _run_id(),
    sa.Column("entry", sa.Text, nullable=False),
    sa.Column("position", sa.Integer),
    sa.Column("case_id", sa.Text),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
    sa.Index("ix_skipped_run", "run_id"),
)
notes = sa.Table(
    "notes",
    metadata,
    _run_id(),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "key", name="pk_notes"),
)
# Revision 0003: the gateway's run (GatewayRun). The small, often-changed facts are columns (one
# UPDATE per pipeline stage); the rest is the record's JSON.
gateway_runs = sa.Table(
    "gateway_runs",
    metadata,
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("stage", sa.Text, nullable=False),
    sa.Column("progress", sa.Float, nullable=False),
    sa.Column("study_uid", sa.Text),
    sa.Column("patient_id", sa.Text),
    sa.Column("started_at", sa.Text),
    sa.Column("finished_at", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("timings_json", sa.Text, nullable=False),
    sa.Column("record_json", sa.Text, nullable=False),  # the rest of the GatewayRun
    sa.Column("evidence_json", sa.Text),  # its SR's evidence (large: apart)
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", name="pk_gateway_runs"),
    sa.Index("ix_gateway_runs_study", "study_uid"),
)

# The tables holding a case's data (what erasure deletes), children before parents.
# --- several workers on one run (PostgreSQL): evaluation.log.claims
# a call's claim before it is sent: one holder at a time, for ``lease_until`` (renewed while
# the call is in flight); ``n`` counts the claims (above 1: taken over from a holder gone quiet)
call_claims = sa.Table(
    "call_claims",
    metadata,
    _run_id(),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("worker", sa.Text, nullable=False),
    sa.Column("token", sa.Text, nullable=False),
    sa.Column("lease_until", sa.Float, nullable=False),  # epoch seconds (the database's clock)
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "cache_key", name="pk_call_claims"),
)
# what was not the committed response: a claim taken over (the earlier holder's call may have
# reached the provider: a possible duplicate), and a late answer refused (never overwrites)
call_attempts = sa.Table(
    "call_attempts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    _run_id(),
    sa.Column("cache_key", sa.Text, nullable=False),
    sa.Column("worker", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),  # "takeover" | "late"
    sa.Column("detail", sa.Text, nullable=False),  # whose claim was taken; the late output
    sa.Column("created_at", sa.Text, nullable=False),
)
sa.Index("ix_call_attempts_run", call_attempts.c.run_id, call_attempts.c.cache_key)
# a provider's limits shared by every worker: one row per concurrent-call slot ("call") and
# per request of the last minute ("minute"); a row is free when its lease ran out
provider_leases = sa.Table(
    "provider_leases",
    metadata,
    sa.Column("provider", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),  # "call" | "minute"
    sa.Column("slot", sa.Integer, nullable=False),
    sa.Column("holder", sa.Text),  # worker token; None: free
    sa.Column("lease_until", sa.Float, nullable=False),
    sa.PrimaryKeyConstraint("provider", "kind", "slot", name="pk_provider_leases"),
)

# --- the queue's outbox (PostgreSQL; gateway.jobs): a job written in the transaction of its run
# row, drained into the queue (its ``job_id`` there, or None: merged into a queued duplicate)
job_outbox = sa.Table(
    "job_outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("queueing_lock", sa.Text, nullable=False),
    sa.Column("lock", sa.Text),
    sa.Column("args", sa.Text, nullable=False),  # JSON: the task's arguments
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("drained_at", sa.Text),  # None: not yet in the queue
    sa.Column("job_id", sa.BigInteger),
)
sa.Index("ix_job_outbox_pending", job_outbox.c.drained_at)

CASE_TABLES = (scores, error_labels, scored_samples, responses, failures, audit, samples)
