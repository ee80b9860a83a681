"""Rebalancing: job policies, placement plans (unique epoch per job), plan events, leases.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_policies",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("mode", sa.String(16), nullable=False, server_default="auto"),
        sa.Column("settings", sa.Text, nullable=False, server_default="{}"),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "plans",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False, server_default="rebalance"),
        sa.Column("base_epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("leader_term", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("layers", sa.Integer, nullable=False),
        sa.Column("world_size", sa.Integer, nullable=False),
        sa.Column("slots_per_rank", sa.Integer, nullable=False),
        sa.Column("phy2log", sa.LargeBinary, nullable=False),
        sa.Column("moves", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cross_node_moves", sa.Integer, nullable=False, server_default="0"),
        sa.Column("predicted_before", sa.Float, nullable=True),
        sa.Column("predicted_after", sa.Float, nullable=True),
        sa.Column("measured_before", sa.Float, nullable=True),
        sa.Column("measured_after", sa.Float, nullable=True),
        sa.Column("measured_step", sa.BigInteger, nullable=True),
        sa.Column("applied_step", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.CheckConstraint("epoch > 0", name="ck_plans_epoch_positive"),
    )
    op.create_table(
        "plan_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("step", sa.BigInteger, nullable=True),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_plan_events_job_epoch", "plan_events", ["job_id", "epoch"])
    op.create_table(
        "job_leases",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for name in ("job_leases", "plan_events", "plans", "job_policies"):
        op.drop_table(name)
