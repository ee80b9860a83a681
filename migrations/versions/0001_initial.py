"""Initial schema: jobs, nodes, devices, compact sample frames, expert loads, step statistics.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("layers", sa.Integer, nullable=True),
        sa.Column("experts", sa.Integer, nullable=True),
        sa.Column("top_k", sa.Integer, nullable=True),
        sa.Column("world_size", sa.Integer, nullable=True),
        sa.Column("slots_per_rank", sa.Integer, nullable=True),
        sa.Column("ranks_per_node", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False, server_default=""),
        sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
        sa.Column("job_id", sa.String(128), nullable=True),
        sa.Column("ranks", sa.Text, nullable=False, server_default=""),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(160), nullable=False, unique=True),
        sa.Column("node_id", sa.String(128), sa.ForeignKey("nodes.node_id"), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False, server_default=""),
        sa.Column("memory_total_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("rank", sa.Integer, nullable=False, server_default="-1"),
    )
    op.create_index("ix_devices_node", "devices", ["node_id"])
    op.create_table(
        "received",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    op.create_table(
        "sample_layouts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("device_ids", sa.Text, nullable=False),
        sa.Column("metrics", sa.Text, nullable=False),
    )
    op.create_index("ix_sample_layouts_node", "sample_layouts", ["node_id"])
    op.create_table(
        "sample_frames",
        sa.Column("layout", sa.Integer, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("values", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_sample_frames_layout_ts", "sample_frames", ["layout", "ts"])
    op.create_table(
        "node_latest",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("layout", sa.Integer, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("values", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "load_parts",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("ranks", sa.String(1024), primary_key=True),
        sa.Column("missing_ranks", sa.Text, nullable=False, server_default=""),
    )
    op.create_table(
        "expert_loads",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("layers", sa.Integer, nullable=False),
        sa.Column("experts", sa.Integer, nullable=False),
        sa.Column("nodes_reported", sa.Integer, nullable=False),
        sa.Column("counts", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_expert_loads_job_ts", "expert_loads", ["job_id", "ts"])
    op.create_table(
        "step_stats",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("step_time_s", sa.Float, nullable=False),
        sa.Column("host_bound_ratio", sa.Float, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    for name in (
        "step_stats",
        "expert_loads",
        "load_parts",
        "node_latest",
        "sample_frames",
        "sample_layouts",
        "received",
        "devices",
        "nodes",
        "jobs",
    ):
        op.drop_table(name)
