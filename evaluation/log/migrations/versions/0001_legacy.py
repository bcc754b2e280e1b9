"""The run store as it was before Alembic (``run.sqlite``, store version 1): one run per file,
tables keyed without the run id. A file that has these tables and no ``alembic_version`` is
stamped here (``evaluation.log.db.migrate``, after adding what older files lack).

Revision ID: 0001_legacy
"""

from alembic import op

revision = "0001_legacy"
down_revision = None
branch_labels = None
depends_on = None

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS run (
    run_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    status TEXT NOT NULL, config_json TEXT NOT NULL, dataset_name TEXT, dataset_kind TEXT,
    dataset_hash TEXT NOT NULL, prompt_version TEXT, code_version TEXT, packages_json TEXT)""",
    """CREATE TABLE IF NOT EXISTS requests (
    cache_key TEXT PRIMARY KEY, case_id TEXT NOT NULL, task TEXT NOT NULL, family TEXT NOT NULL,
    model TEXT NOT NULL, sample INTEGER NOT NULL, turn INTEGER NOT NULL,
    image_hashes TEXT NOT NULL, prompt_hash TEXT NOT NULL, request_json TEXT NOT NULL,
    created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS responses (
    cache_key TEXT PRIMARY KEY REFERENCES requests(cache_key), model TEXT NOT NULL,
    text TEXT NOT NULL, output_json TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY, cache_key TEXT NOT NULL, model TEXT NOT NULL, error TEXT NOT NULL,
    output_json TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS samples (
    sample_id TEXT PRIMARY KEY, case_id TEXT NOT NULL, task TEXT NOT NULL, family TEXT NOT NULL,
    model TEXT NOT NULL, sample INTEGER NOT NULL, status TEXT NOT NULL, turns_json TEXT NOT NULL,
    parsed_json TEXT, parse_error TEXT, image_hashes TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS scores (
    sample_id TEXT NOT NULL REFERENCES samples(sample_id), scorer TEXT NOT NULL, value REAL,
    explanation TEXT NOT NULL, details_json TEXT NOT NULL, scored_at TEXT NOT NULL,
    scoring_version TEXT, PRIMARY KEY (sample_id, scorer))""",
    """CREATE TABLE IF NOT EXISTS error_labels (
    sample_id TEXT PRIMARY KEY REFERENCES samples(sample_id), label_json TEXT NOT NULL,
    scored_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS scored_samples (
    sample_id TEXT PRIMARY KEY REFERENCES samples(sample_id), scored_json TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, time TEXT NOT NULL, model TEXT NOT NULL, endpoint TEXT NOT NULL,
    case_id TEXT NOT NULL, cache_key TEXT NOT NULL, remote INTEGER NOT NULL,
    deidentified INTEGER NOT NULL, record_json TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cases (
    case_id TEXT PRIMARY KEY, case_json TEXT NOT NULL, recorded_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS samples_model ON samples(model)",
    "CREATE INDEX IF NOT EXISTS failures_key ON failures(cache_key)",
    """CREATE TABLE IF NOT EXISTS skipped_cases (
    n INTEGER PRIMARY KEY, entry TEXT NOT NULL, position INTEGER, case_id TEXT,
    reason TEXT NOT NULL, recorded_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS notes (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT NOT NULL)""",
]


def upgrade() -> None:
    for sql in _SCHEMA:
        op.execute(sql)


def downgrade() -> None:
    raise NotImplementedError("the run log is never downgraded")
