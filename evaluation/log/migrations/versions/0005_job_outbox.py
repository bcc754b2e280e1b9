"""The queue's outbox (``job_outbox``): a job written in the same transaction as its run row,
moved into the queue (procrastinate, ``gateway.jobs``) by a drain that marks it in the same
transaction as it queues it, so a process killed between the two loses no job.

Revision ID: 0005_job_outbox
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_job_outbox"
down_revision = "0004_call_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("queueing_lock", sa.Text, nullable=False),
        sa.Column("lock", sa.Text),
        sa.Column("args", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("drained_at", sa.Text),
        sa.Column("job_id", sa.BigInteger),
    )
    op.create_index("ix_job_outbox_pending", "job_outbox", ["drained_at"])


def downgrade() -> None:
    raise NotImplementedError("the run log is never downgraded")
