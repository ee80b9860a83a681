"""Expert loads of an MoE policy by RL phase (issue 32): rl_phase_loads.

One row per (job, rank, step, phase): the [layers, experts] tokens routed during that phase,
narrow dtype, zlib-compressed.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rl_phase_loads",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("phase", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("layers", sa.Integer, nullable=False),
        sa.Column("experts", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("counts", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_rl_phase_loads_job_step", "rl_phase_loads", ["job_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_rl_phase_loads_job_step", table_name="rl_phase_loads")
    op.drop_table("rl_phase_loads")
