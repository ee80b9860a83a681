"""Latest memory profile of each device and free host memory of each node, per job.

What the offload controller decides on and what REST and the dashboard show. Bytes are
bytes, times seconds. Only a profile of the same or a later step replaces a stored one.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.memory.records import NodeMemoryRecord, ProfileRecord
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.writes import upsert


def save_profiles(engine: Engine, node: NodeMemoryRecord, profiles: list[ProfileRecord]) -> None:
    """Upsert the latest profile of each device and the node's free host memory.

    A row is replaced only by one of the same or a later step, so a resent old message never
    overwrites newer data.
    """
    with engine.begin() as conn:
        upsert(conn, t.node_memory, {"job_id": node.job_id, "node_id": node.node_id},
               {"step": node.step, "ts": node.ts, "host_free_bytes": node.host_free_bytes},
               newer=lambda new: t.node_memory.c.step <= new.step)
        for p in profiles:
            values = {
                "node_id": p.node_id, "rank": p.rank, "step": p.step, "ts": p.ts,
                "capacity_bytes": p.capacity_bytes, "used_bytes": p.used_bytes,
                "parameters_bytes": p.parameters_bytes, "gradients_bytes": p.gradients_bytes,
                "optimizer_bytes": p.optimizer_bytes,
                "activations_peak_bytes": p.activations_peak_bytes,
                "host_link_bytes_per_s": p.host_link_bytes_per_s,
                "applied_actions": ",".join(p.applied_actions),
                "layers": json.dumps(list(p.layers), separators=(",", ":")),
            }
            upsert(conn, t.memory_profiles, {"job_id": p.job_id, "device_id": p.device_id}, values,
                   newer=lambda new: t.memory_profiles.c.step <= new.step)


def _profile_dict(row) -> dict:
    d = dict(row)
    d["layers"] = json.loads(d["layers"])
    d["applied_actions"] = [a for a in d["applied_actions"].split(",") if a]
    return d


def latest_profiles(engine: Engine, job_id: str, device_id: str | None = None) -> list[dict]:
    """The latest memory profile of each device of the job, ordered by node, rank, device."""
    q = sa.select(t.memory_profiles).where(t.memory_profiles.c.job_id == job_id)
    if device_id is not None:
        q = q.where(t.memory_profiles.c.device_id == device_id)
    q = q.order_by(t.memory_profiles.c.node_id, t.memory_profiles.c.rank, t.memory_profiles.c.device_id)
    with engine.connect() as conn:
        return [_profile_dict(r) for r in conn.execute(q).mappings().all()]


def node_memory(engine: Engine, job_id: str) -> dict[str, dict]:
    """node_id -> {step, ts, host_free_bytes} of the job's nodes that sent profiles."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.node_memory).where(t.node_memory.c.job_id == job_id)).mappings().all()
    return {r["node_id"]: dict(r) for r in rows}


def profile_version(engine: Engine, job_id: str) -> tuple:
    """Changes whenever a profile or the policy of the job changes (cheap change detection)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(sa.func.count(), sa.func.max(t.memory_profiles.c.ts), sa.func.sum(t.memory_profiles.c.step))
            .where(t.memory_profiles.c.job_id == job_id)
        ).first()
    return (*row, policy_updated_at(engine, job_id))


def policy_updated_at(engine: Engine, job_id: str) -> float:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(t.offload_policies.c.updated_at).where(t.offload_policies.c.job_id == job_id)
        ).scalar() or 0.0


def memory_breakdown(engine: Engine, job_id: str, *, with_layers: bool = False) -> list[dict]:
    """Each device's latest memory breakdown, for REST and the dashboard (bytes, seconds).

    Per device: the profile's fields; ``other_bytes`` = used − (parameters + gradients +
    optimizer + activations peak), floored at 0 (workspace, allocator cache, buffers);
    ``host_free_bytes`` of its node; ``high_watermark_bytes``/``low_watermark_bytes`` under
    the job's policy; ``decision``: its newest offload decision (id, status, verdict,
    predicted_peak_bytes, measured_used_bytes, reason) or None. ``layers`` only with
    ``with_layers``. Raises NotFound for an unknown job.
    """
    policy = O.get_policy(engine, job_id)
    hosts = node_memory(engine, job_id)
    newest = O.latest_per_device(engine, job_id)
    out = []
    for p in latest_profiles(engine, job_id):
        explained = p["parameters_bytes"] + p["gradients_bytes"] + p["optimizer_bytes"] + p["activations_peak_bytes"]
        d = {k: v for k, v in p.items() if with_layers or k != "layers"}
        d["other_bytes"] = max(0, p["used_bytes"] - explained)
        d["host_free_bytes"] = hosts.get(p["node_id"], {}).get("host_free_bytes")
        d["high_watermark_bytes"] = int(policy.high_watermark * p["capacity_bytes"])
        d["low_watermark_bytes"] = int(policy.low_watermark * p["capacity_bytes"])
        dec = newest.get(p["device_id"])
        d["decision"] = None if dec is None else {
            k: dec[k] for k in ("decision_id", "status", "verdict", "predicted_peak_bytes",
                                "measured_used_bytes", "reason")
        }
        out.append(d)
    return out
