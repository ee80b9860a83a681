"""RL post-training: phase spans, weight syncs and consumed batches (issue 32).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rl_spans",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("phase", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("start_ts", sa.Float, primary_key=True),
        sa.Column("end_ts", sa.Float, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("role", sa.SmallInteger, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_rl_spans_job_step", "rl_spans", ["job_id", "step"])
    op.create_table(
        "rl_weight_syncs",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("to_version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("from_version", sa.BigInteger, nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("start_ts", sa.Float, nullable=False),
        sa.Column("pause_s", sa.Float, nullable=False),
        sa.Column("transfer_s", sa.Float, nullable=False),
        sa.Column("resume_s", sa.Float, nullable=False),
    )
    op.create_index("ix_rl_weight_syncs_job_step", "rl_weight_syncs", ["job_id", "step"])
    op.create_table(
        "rl_batches",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("trained_version", sa.BigInteger, nullable=False),
        sa.Column("samples", sa.BigInteger, nullable=False),
        sa.Column("lag_min", sa.BigInteger, nullable=False),
        sa.Column("lag_mean", sa.Float, nullable=False),
        sa.Column("lag_max", sa.BigInteger, nullable=False),
        sa.Column("bound", sa.BigInteger, nullable=False),
        sa.Column("dropped", sa.BigInteger, nullable=False),
        sa.Column("partial", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rl_batches")
    op.drop_index("ix_rl_weight_syncs_job_step", table_name="rl_weight_syncs")
    op.drop_table("rl_weight_syncs")
    op.drop_index("ix_rl_spans_job_step", table_name="rl_spans")
    op.drop_table("rl_spans")
