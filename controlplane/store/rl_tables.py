"""RL post-training tables: phase spans, weight syncs and consumed batches (migration 0006), phase
loads (0008) and per-step phase seconds (0009).

Defined on :data:`moeplane.controlplane.store.tables.metadata`, which holds them once
``tables`` is imported (it imports this module after ``metadata`` exists); read them from this
module (``tables`` does not re-export them).
"""

from __future__ import annotations

import sqlalchemy as sa

from moeplane.controlplane.store.tables import metadata

# RL post-training (migration 0006). Phase and role codes index moeplane.controlplane.rl.phases
# PHASES and ROLES. rank -1: a framework's per-step timer, not a device.
rl_spans = sa.Table(
    "rl_spans",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("phase", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("start_ts", sa.Float, primary_key=True),  # unix s
    sa.Column("end_ts", sa.Float, nullable=False),  # unix s
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),  # policy version the rank held
    sa.Column("role", sa.SmallInteger, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
)
sa.Index("ix_rl_spans_job_step", rl_spans.c.job_id, rl_spans.c.step)

rl_weight_syncs = sa.Table(
    "rl_weight_syncs",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("to_version", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("from_version", sa.BigInteger, nullable=False),
    sa.Column("node_id", sa.String(128), nullable=False),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("start_ts", sa.Float, nullable=False),  # unix s
    sa.Column("pause_s", sa.Float, nullable=False),
    sa.Column("transfer_s", sa.Float, nullable=False),
    sa.Column("resume_s", sa.Float, nullable=False),
)
sa.Index("ix_rl_weight_syncs_job_step", rl_weight_syncs.c.job_id, rl_weight_syncs.c.step)

rl_batches = sa.Table(
    "rl_batches",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("node_id", sa.String(128), nullable=False),
    sa.Column("trained_version", sa.BigInteger, nullable=False),
    sa.Column("samples", sa.BigInteger, nullable=False),
    sa.Column("lag_min", sa.BigInteger, nullable=False),
    sa.Column("lag_mean", sa.Float, nullable=False),
    sa.Column("lag_max", sa.BigInteger, nullable=False),
    sa.Column("bound", sa.BigInteger, nullable=False),  # -1: none
    sa.Column("dropped", sa.BigInteger, nullable=False),
    sa.Column("partial", sa.BigInteger, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),  # unix s
)

# Expert loads of an MoE policy by RL phase (migration 0008): one row per (job, rank, step,
# phase), stored once. ``counts`` [layers, experts] tokens routed to each expert during the
# phase, C-order little-endian of ``dtype`` (the narrowest of uint8/uint16/uint32/int64 that
# holds the largest count), zlib-compressed (see moeplane.controlplane.store.rl_loads).
rl_phase_loads = sa.Table(
    "rl_phase_loads",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("phase", sa.SmallInteger, primary_key=True, autoincrement=False),  # code into PHASES
    sa.Column("node_id", sa.String(128), nullable=False),
    sa.Column("ts", sa.Float, nullable=False),  # unix s, when the phase ended
    sa.Column("layers", sa.Integer, nullable=False),
    sa.Column("experts", sa.Integer, nullable=False),
    sa.Column("dtype", sa.String(8), nullable=False),  # numpy dtype string, e.g. "<u2"
    sa.Column("tokens", sa.BigInteger, nullable=False),  # sum of counts
    sa.Column("counts", sa.LargeBinary, nullable=False),
)
sa.Index("ix_rl_phase_loads_job_step", rl_phase_loads.c.job_id, rl_phase_loads.c.step)

# Phase seconds per (job, step, node) (migration 0009), kept at ingest in the spans'
# transaction for long timelines: ``data`` holds ``ranks`` packed little-endian records of
# moeplane.controlplane.rl.step_phases.record_dtype(phases) (per rank: first start, last end,
# rank, role, span count, seconds of each of ``phases`` phases), sorted by rank.
rl_step_phases = sa.Table(
    "rl_step_phases",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("node_id", sa.String(128), primary_key=True),
    sa.Column("phases", sa.SmallInteger, nullable=False),
    sa.Column("ranks", sa.Integer, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)
