"""Several workers on one run: a call's claim before it is sent (``call_claims``), what was
not the committed response (``call_attempts``: claims taken over, late answers refused), and
each provider's limits shared by every worker (``provider_leases``).

Revision ID: 0004_call_claims
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_call_claims"
down_revision = "0003_gateway_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "call_claims",
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("cache_key", sa.Text, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("token", sa.Text, nullable=False),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "cache_key", name="pk_call_claims"),
    )
    op.create_table(
        "call_attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("cache_key", sa.Text, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
    op.create_index("ix_call_attempts_run", "call_attempts", ["run_id", "cache_key"])
    op.create_table(
        "provider_leases",
        sa.Column("provider", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("holder", sa.Text),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("provider", "kind", "slot", name="pk_provider_leases"),
    )


def downgrade() -> None:
    raise NotImplementedError("the run log is never downgraded")
