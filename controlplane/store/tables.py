"""Table definitions (SQLAlchemy Core), mirroring the newest Alembic migration.

Units: timestamps are unix seconds (float64); bytes are bytes; ratios are in [0, 1].
Arrays are stored as little-endian C-order bytes with their shape in sibling columns.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("layers", sa.Integer, nullable=True),  # L, known once declared or first loads
    sa.Column("experts", sa.Integer, nullable=True),  # E
    sa.Column("top_k", sa.Integer, nullable=True),
    sa.Column("world_size", sa.Integer, nullable=True),  # EP ranks G
    sa.Column("slots_per_rank", sa.Integer, nullable=True),  # S
    sa.Column("ranks_per_node", sa.Integer, nullable=True),
    sa.Column("groups", sa.Integer, nullable=True),  # K expert groups (group-limited routing)
    sa.Column("created_at", sa.Float, nullable=False),
)

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("hostname", sa.String(255), nullable=False, server_default=""),
    sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
    sa.Column("job_id", sa.String(128), nullable=True),
    sa.Column("ranks", sa.Text, nullable=False, server_default=""),  # comma-separated ranks
    sa.Column("first_seen", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
)

devices = sa.Table(
    "devices",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("device_id", sa.String(160), nullable=False, unique=True),
    sa.Column("node_id", sa.String(128), sa.ForeignKey("nodes.node_id"), nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("model", sa.String(128), nullable=False, server_default=""),
    sa.Column("memory_total_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("rank", sa.Integer, nullable=False, server_default="-1"),
)
sa.Index("ix_devices_node", devices.c.node_id)

# One row per agent message stored, for deduplication of resends by (node, seq).
received = sa.Table(
    "received",
    metadata,
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("received_at", sa.Float, nullable=False),
)

# Raw device telemetry, compact: one row per (node, sampling round) holding the whole
# [D, M] float32 matrix of that round. The row's layout names its devices and metrics.
# About 4-5 bytes per sample with 8 devices x 16 metrics (see docs/benchmarks.md).
sample_layouts = sa.Table(
    "sample_layouts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(64), nullable=False, unique=True),  # sha256 of node|devices|metrics
    sa.Column("node_id", sa.String(128), nullable=False),
    sa.Column("device_ids", sa.Text, nullable=False),  # JSON list, D entries
    sa.Column("metrics", sa.Text, nullable=False),  # JSON list, M entries
)
sa.Index("ix_sample_layouts_node", sample_layouts.c.node_id)

sample_frames = sa.Table(
    "sample_frames",
    metadata,
    sa.Column("layout", sa.Integer, nullable=False),  # sample_layouts.id
    sa.Column("ts", sa.Float, nullable=False),  # unix seconds of the round
    sa.Column("values", sa.LargeBinary, nullable=False),  # float32 [D, M] LE; NaN = not measured
)
sa.Index("ix_sample_frames_layout_ts", sample_frames.c.layout, sample_frames.c.ts)

# The newest frame of each node: what live views read (one upsert per round).
node_latest = sa.Table(
    "node_latest",
    metadata,
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("layout", sa.Integer, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("values", sa.LargeBinary, nullable=False),
)

# Which node (and ranks) contributed to which step: deduplicates loads by (job, step, node, ranks).
load_parts = sa.Table(
    "load_parts",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("node_id", sa.String(128), primary_key=True),
    # ranks summed in this part ("0,1,..."): a node may report per rank or per node
    sa.Column("ranks", sa.String(1024), primary_key=True),
    sa.Column("missing_ranks", sa.Text, nullable=False, server_default=""),
)

# The job's global load matrix per step: counts int64 [L, E] little-endian, summed over nodes.
# On PostgreSQL ``counts`` is TOAST-compressed with lz4 (migration 0005): rewritten every batch.
expert_loads = sa.Table(
    "expert_loads",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("layers", sa.Integer, nullable=False),
    sa.Column("experts", sa.Integer, nullable=False),
    sa.Column("nodes_reported", sa.Integer, nullable=False),
    sa.Column("counts", sa.LargeBinary, nullable=False),
)
sa.Index("ix_expert_loads_job_ts", expert_loads.c.job_id, expert_loads.c.ts)

step_stats = sa.Table(
    "step_stats",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("node_id", sa.String(128), nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("step_time_s", sa.Float, nullable=False),
    sa.Column("host_bound_ratio", sa.Float, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
)

# ---------------------------------------------------------------- rebalancing (migration 0002)

# Policy and thresholds of a job's rebalancing controller.
job_policies = sa.Table(
    "job_policies",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("mode", sa.String(16), nullable=False, server_default="auto"),  # auto | manual
    sa.Column("settings", sa.Text, nullable=False, server_default="{}"),  # JSON thresholds
    sa.Column("updated_at", sa.Float, nullable=False),
)

# Placement plans. One strictly increasing epoch per job: UNIQUE(job_id, epoch), epoch > 0.
plans = sa.Table(
    "plans",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False, server_default="rebalance"),  # | rollback
    sa.Column("base_epoch", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("leader_term", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("layers", sa.Integer, nullable=False),
    sa.Column("world_size", sa.Integer, nullable=False),
    sa.Column("slots_per_rank", sa.Integer, nullable=False),
    sa.Column("phy2log", sa.LargeBinary, nullable=False),  # int64 [L, G*S] little-endian
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

plan_events = sa.Table(
    "plan_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("node_id", sa.String(128), nullable=True),
    sa.Column("step", sa.BigInteger, nullable=True),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
)
sa.Index("ix_plan_events_job_epoch", plan_events.c.job_id, plan_events.c.epoch)

# Leadership terms of a job's controller: a new leader bumps the term; a plan carries the
# term it was made under, and publishing checks the term is still current (fencing).
job_leases = sa.Table(
    "job_leases",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.String(128), nullable=False),
    sa.Column("acquired_at", sa.Float, nullable=False),
)

# ---------------------------------------------------------------- memory offload (migration 0003)

# Latest memory profile of each device of a job (one row per device, overwritten).
# layers: JSON list of {name, activation_bytes, forward_s, backward_s, parameter_bytes,
# optimizer_bytes}; applied_actions: comma-separated "kind:layer" in effect at `step`.
memory_profiles = sa.Table(
    "memory_profiles",
    metadata,
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
sa.Index("ix_memory_profiles_node", memory_profiles.c.job_id, memory_profiles.c.node_id)

# Latest free host memory of each node of a job, shared by the node's devices.
node_memory = sa.Table(
    "node_memory",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("host_free_bytes", sa.BigInteger, nullable=False),
)

# Offload policy of a job: mode auto | manual and watermarks as fractions of capacity.
offload_policies = sa.Table(
    "offload_policies",
    metadata,
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

# Offload decisions, one per device per change of verdict/action set. decision_id is global.
# actions: JSON list of {kind, layers, bytes_saved, host_bytes, overhead_s, prefetch};
# undo: JSON list of {kind, layer}. signature: verdict + action set, to detect changes.
offload_decisions = sa.Table(
    "offload_decisions",
    metadata,
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
sa.Index(
    "ix_offload_decisions_job_device", offload_decisions.c.job_id, offload_decisions.c.device_id
)

offload_events = sa.Table(
    "offload_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("decision_id", sa.Integer, nullable=False),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("node_id", sa.String(128), nullable=True),
    sa.Column("step", sa.BigInteger, nullable=True),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
)
sa.Index("ix_offload_events_decision", offload_events.c.decision_id)

# ---------------------------------------------------------------- history and access (migration 0004)

# API tokens (role viewer | operator | admin) and per-node agent tokens (role node, node_id set).
# Only sha256(secret) is stored; the secret is shown once at creation.
api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(128), nullable=False, server_default=""),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("node_id", sa.String(128), nullable=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float, nullable=True),
)

# Downsampled tiers. ``tier`` is the bucket width in seconds (60, 3600); ``bucket`` the bucket
# start (unix s, a multiple of the width). Device samples per (tier, layout, bucket): stats
# float32 [4, D, M] = count, mean, max, p95 of each cell over the bucket's frames.
sample_rollups = sa.Table(
    "sample_rollups",
    metadata,
    sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("layout", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("frames", sa.Integer, nullable=False),
    sa.Column("stats", sa.LargeBinary, nullable=False),
)
sa.Index("ix_sample_rollups_tier_bucket", sample_rollups.c.tier, sample_rollups.c.bucket)

# Step statistics per (job, tier, bucket): stats float64 [G, 8] per rank = count, step_time_s
# mean/max/p95, host_bound_ratio mean/max/p95, tokens sum.
step_rollups = sa.Table(
    "step_rollups",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("step_first", sa.BigInteger, nullable=False),
    sa.Column("step_last", sa.BigInteger, nullable=False),
    sa.Column("ranks", sa.Integer, nullable=False),
    sa.Column("stats", sa.LargeBinary, nullable=False),
)

# Expert loads per (job, tier, bucket): stats float64 [3, L, E] = sum, max, p95 over the steps.
load_rollups = sa.Table(
    "load_rollups",
    metadata,
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

# Watermark per (kind, tier): every bucket ending at or before done_until is rolled up.
rollup_state = sa.Table(
    "rollup_state",
    metadata,
    sa.Column("kind", sa.String(16), primary_key=True),  # samples | steps | loads
    sa.Column("tier", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("done_until", sa.Float, nullable=False),
)

# Retention deletes by time.
sa.Index("ix_sample_frames_ts", sample_frames.c.ts)
sa.Index("ix_step_stats_job_ts", step_stats.c.job_id, step_stats.c.ts)
sa.Index("ix_received_at", received.c.received_at)


# The RL post-training tables (migrations 0006, 0008, 0009) are defined on the same metadata in
# their own module; importing it here, after ``metadata``, registers every one of them.
from moeplane.controlplane.store import rl_tables  # noqa: E402, F401
