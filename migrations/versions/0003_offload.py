"""Memory offload: latest memory profile per device and host memory per node, offload
policies, offload decisions with their lifecycle, decision events.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_profiles",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("device_id", sa.String(160), primary_key=True),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("capacity_bytes", sa.BigInteger, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
        sa.Column("parameters_bytes", sa.BigInteger, nullable=False),
        sa.Column("gradients_bytes", sa.BigInteger, nullable=False),
        sa.Column("optimizer_bytes", sa.BigInteger, nullable=False),
        sa.Column("activations_peak_bytes", sa.BigInteger, nullable=False),
        sa.Column("host_link_bytes_per_s", sa.Float, nullable=False),
        sa.Column("applied_actions", sa.Text, nullable=False, server_default=""),
        sa.Column("layers", sa.Text, nullable=False, server_default="[]"),
    )
    op.create_index("ix_memory_profiles_node", "memory_profiles", ["job_id", "node_id"])
    op.create_table(
        "node_memory",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("host_free_bytes", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "offload_policies",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("mode", sa.String(16), nullable=False, server_default="auto"),
        sa.Column("high_watermark", sa.Float, nullable=False),
        sa.Column("low_watermark", sa.Float, nullable=False),
        sa.Column("decision_timeout_s", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.CheckConstraint(
            "low_watermark > 0 AND low_watermark < high_watermark AND high_watermark <= 1",
            name="ck_offload_policies_watermarks",
        ),
    )
    op.create_table(
        "offload_decisions",
        sa.Column("decision_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(160), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("actions", sa.Text, nullable=False, server_default="[]"),
        sa.Column("undo", sa.Text, nullable=False, server_default="[]"),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("leader_term", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("profile_step", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("capacity_bytes", sa.BigInteger, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
        sa.Column("peak_now_bytes", sa.BigInteger, nullable=False),
        sa.Column("predicted_peak_bytes", sa.BigInteger, nullable=False),
        sa.Column("high_watermark_bytes", sa.BigInteger, nullable=False),
        sa.Column("low_watermark_bytes", sa.BigInteger, nullable=False),
        sa.Column("host_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("overhead_s", sa.Float, nullable=False, server_default="0"),
        sa.Column("applied_step", sa.BigInteger, nullable=True),
        sa.Column("measured_used_bytes", sa.BigInteger, nullable=True),
        sa.Column("measured_saved_bytes", sa.BigInteger, nullable=True),
        sa.Column("error", sa.Text, nullable=False, server_default=""),
    )
    op.create_index(
        "ix_offload_decisions_job_device", "offload_decisions", ["job_id", "device_id"]
    )
    op.create_table(
        "offload_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("decision_id", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("step", sa.BigInteger, nullable=True),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_offload_events_decision", "offload_events", ["decision_id"])


def downgrade() -> None:
    op.drop_index("ix_offload_events_decision", table_name="offload_events")
    op.drop_index("ix_offload_decisions_job_device", table_name="offload_decisions")
    op.drop_index("ix_memory_profiles_node", table_name="memory_profiles")
    for name in (
        "offload_events", "offload_decisions", "offload_policies", "node_memory",
        "memory_profiles",
    ):
        op.drop_table(name)
