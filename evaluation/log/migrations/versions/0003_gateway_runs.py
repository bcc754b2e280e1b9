"""The gateway's run (``GatewayRun``) as a table of its own: the few facts a pipeline stage
changes are columns (one small UPDATE per stage), the rest the record's JSON.

Revision ID: 0003_gateway_runs
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_gateway_runs"
down_revision = "0002_run_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gateway_runs",
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
        sa.Column("record_json", sa.Text, nullable=False),
        sa.Column("evidence_json", sa.Text),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_gateway_runs"),
    )
    op.create_index("ix_gateway_runs_study", "gateway_runs", ["study_uid"])


def downgrade() -> None:
    raise NotImplementedError("the run log is never downgraded")
