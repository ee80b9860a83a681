"""History tiers (1-min and 1-h rollups of device samples, step statistics and expert loads,
with per-kind watermarks), API and node tokens (hashed), and indexes for retention by time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, server_default=""),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.create_table(
        "sample_rollups",
        sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("layout", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("frames", sa.Integer, nullable=False),
        sa.Column("stats", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_sample_rollups_tier_bucket", "sample_rollups", ["tier", "bucket"])
    op.create_table(
        "step_rollups",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("step_first", sa.BigInteger, nullable=False),
        sa.Column("step_last", sa.BigInteger, nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("stats", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "load_rollups",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("step_first", sa.BigInteger, nullable=False),
        sa.Column("step_last", sa.BigInteger, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("layers", sa.Integer, nullable=False),
        sa.Column("experts", sa.Integer, nullable=False),
        sa.Column("stats", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "rollup_state",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("done_until", sa.Float, nullable=False),
    )
    op.create_index("ix_sample_frames_ts", "sample_frames", ["ts"])
    op.create_index("ix_step_stats_job_ts", "step_stats", ["job_id", "ts"])
    op.create_index("ix_received_at", "received", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_received_at", table_name="received")
    op.drop_index("ix_step_stats_job_ts", table_name="step_stats")
    op.drop_index("ix_sample_frames_ts", table_name="sample_frames")
    op.drop_index("ix_sample_rollups_tier_bucket", table_name="sample_rollups")
    for name in ("rollup_state", "load_rollups", "step_rollups", "sample_rollups", "api_tokens"):
        op.drop_table(name)
