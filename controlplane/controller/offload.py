"""The offload reconcile loop: for each job this replica leads, decide memory offload per device.

Reads the latest memory profile of every device and the free host memory of every node
(store) → ``decide_offload`` (pure, one call per node: host memory is shared per node) →
persists a decision for each device whose verdict or action set changed (fenced by the
leadership term) → under ``auto`` approves and pushes it, publishing ``pb.OffloadDecision``
on the bus channel ``offload.<job>``, where every replica's ingest forwards it to the stream
of the device's node. Under ``manual`` an operator approves through REST. Also fails pushed
decisions that were not reported applied within the policy's timeout.

What gets persisted, per device, compared with its newest decision (any status):
- KEEP: nothing (the actions in effect stay);
- APPLY / RELAX whose complete action set differs from the one in effect: a decision to push;
- CANNOT_MEET, or RELAX that only suggests a larger micro-batch: an ``advisory`` decision
  (shown with its reason, never pushed: its empty action set would undo everything);
- nothing when the newest decision has the same verdict and action set (also when it was
  rejected or failed: the same answer is not proposed again until the answer changes),
  and nothing for a device whose decision is still pushed (waiting for the agent's report).

Leadership uses its own lease per job (``lease_name``), separate from the rebalancing
controller's, so the two loops never fence each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time

from sqlalchemy.engine import Engine

from moeplane.controlplane.controller.executor import approve_decision
from moeplane.controlplane.controller.leader import Leadership
from moeplane.controlplane.controller.loop import ReconcileLoop
from moeplane.controlplane.domain.lifecycle import IN_FLIGHT, Conflict, Status
from moeplane.controlplane.domain.rebalance_policy import Mode
from moeplane.controlplane.memory import (
    InputError,
    NodeMemory,
    OffloadDecision,
    Verdict,
    decide_offload,
)
from moeplane.controlplane.memory.codec import device_memory
from moeplane.controlplane.store import memory_profiles as M
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.lifecycle import Fenced

log = logging.getLogger(__name__)


def lease_name(job_id: str) -> str:
    """The ``job_leases`` row (and advisory-lock name) of a job's offload controller (<= 128 chars)."""
    name = f"offload:{job_id}"
    return name if len(name) <= 128 else "offload:" + hashlib.sha256(job_id.encode()).hexdigest()


def action_dicts(decision: OffloadDecision) -> list[dict]:
    return [
        {"kind": a.kind.value, "layers": list(a.layers), "bytes_saved": a.device_bytes_freed,
         "host_bytes": a.host_bytes, "overhead_s": a.overhead_s, "prefetch": a.prefetch}
        for a in decision.actions
    ]


def _pairs(actions: list[dict]) -> set[str]:
    return {f"{a['kind']}:{layer}" for a in actions for layer in a["layers"]}


class OffloadController(ReconcileLoop):
    """One per replica; reconciles the memory of every job it leads each ``interval_s``."""

    channel = "offload"

    def __init__(self, engine: Engine, bus, leadership: Leadership, *, interval_s: float = 0.5,
                 clock=time.time):
        super().__init__(engine, bus, leadership, interval_s=interval_s, clock=clock)
        self._seen: dict[str, tuple] = {}
        self.status: dict[str, str] = {}  # job -> what the last tick concluded (for /health, tests)

    def reconcile_all(self) -> list[tuple[str, bytes]]:
        out = []
        for job in q.list_jobs(self.engine):
            job_id = job["job_id"]
            term = self.leadership.try_lead(lease_name(job_id))
            if term is None:
                continue
            out.extend((job_id, m) for m in self.reconcile(job_id, term))
        return out

    def reconcile(self, job_id: str, term: int) -> list[bytes]:
        self._expire(job_id)
        version = M.profile_version(self.engine, job_id)
        if self._seen.get(job_id) == version or not version[0]:
            return []
        self._seen[job_id] = version
        policy = O.get_policy(self.engine, job_id)
        profiles = M.latest_profiles(self.engine, job_id)
        hosts = M.node_memory(self.engine, job_id)
        latest = O.latest_per_device(self.engine, job_id)
        out: list[bytes] = []
        notes: list[str] = []
        for node_id in sorted({p["node_id"] for p in profiles}):
            members = [p for p in profiles if p["node_id"] == node_id]
            try:
                decisions = decide_offload(
                    [device_memory(p) for p in members],
                    [NodeMemory(node_id, hosts[node_id]["host_free_bytes"])],
                    policy.watermarks,
                )
            except (InputError, KeyError) as exc:  # ingest validates; a stored row should not fail
                log.warning("job %s node %s: cannot decide offload: %s", job_id, node_id, exc)
                notes.append(f"{node_id}: {exc}")
                continue
            for profile, decision in zip(members, decisions, strict=True):
                notes.append(f"{decision.device_id}: {decision.verdict.value}")
                try:
                    msg = self._persist(job_id, term, policy, profile, decision, latest.get(decision.device_id))
                except Fenced as exc:
                    log.warning("%s; giving up offload leadership", exc)
                    self.leadership.release(lease_name(job_id))
                    self._seen.pop(job_id, None)
                    return out
                if msg is not None:
                    out.append(msg)
        self.status[job_id] = "; ".join(notes)
        return out

    def _persist(self, job_id: str, term: int, policy, profile: dict, decision: OffloadDecision,
                 newest: dict | None) -> bytes | None:
        if decision.verdict is Verdict.KEEP:
            return None
        if newest is not None and newest["status"] in (str(s) for s in IN_FLIGHT):
            return None
        actions = action_dicts(decision)
        if newest is not None and newest["signature"] == O.signature_of(decision.verdict.value, actions):
            return None
        changes = (decision.verdict in (Verdict.APPLY, Verdict.RELAX)
                   and _pairs(actions) != set(profile["applied_actions"]))
        reason = decision.reason
        if decision.suggested_micro_batch_size is not None:
            reason += f" (suggested micro-batch size {decision.suggested_micro_batch_size})"
        decision_id = O.create_decision(
            self.engine, job_id, device_id=decision.device_id, node_id=decision.node_id,
            rank=profile["rank"], verdict=decision.verdict.value, actions=actions,
            undo=[{"kind": u.kind.value, "layer": u.layer} for u in decision.undo], reason=reason,
            profile_step=profile["step"], capacity_bytes=profile["capacity_bytes"],
            used_bytes=profile["used_bytes"], peak_now_bytes=decision.peak_now_bytes,
            predicted_peak_bytes=decision.peak_after_bytes,
            high_watermark_bytes=decision.high_watermark_bytes,
            low_watermark_bytes=decision.low_watermark_bytes, host_bytes=decision.host_bytes,
            overhead_s=decision.overhead_s,
            status=Status.PROPOSED if changes else Status.ADVISORY,
            leader_term=term, lease=lease_name(job_id), clock=self.clock,
        )
        log.info("job %s device %s: offload decision %d %s (%s)", job_id, decision.device_id,
                 decision_id, decision.verdict.value, reason)
        if not changes or policy.mode != Mode.AUTO:
            return None
        return approve_decision(self.engine, job_id, decision_id, "auto policy", clock=self.clock)

    def _expire(self, job_id: str) -> None:
        """Fail pushed decisions not reported applied within the policy's timeout."""
        pushed = O.list_decisions(self.engine, job_id, status=Status.PUSHED, limit=1000)
        if not pushed:
            return
        timeout = O.get_policy(self.engine, job_id).decision_timeout_s
        now = self.clock()
        for d in pushed:
            if now - d["updated_at"] > timeout:
                with contextlib.suppress(Conflict):
                    O.transition(self.engine, job_id, d["decision_id"], Status.FAILED, detail="not applied before the timeout",
                                 error="not applied before the timeout", clock=self.clock)
                self._seen.pop(job_id, None)

