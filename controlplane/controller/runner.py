"""The reconcile loop: for each job this replica leads, read state, decide, execute.

Reads (store) → ``decide`` (pure) → persists a plan (fenced by the leadership term) →
publishes it on the bus channel ``plans.<job>`` where every replica's ingest streams it to
the job's agents. Also measures the balancedness a plan achieved from the first loads after
it was applied, and fails plans that were pushed but never applied in time.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.balancing import balancedness, identity_placement
from moeplane.controlplane.controller.decide import Action, decide
from moeplane.controlplane.controller.leader import Leadership
from moeplane.controlplane.controller.loop import ReconcileLoop
from moeplane.controlplane.domain.lifecycle import IN_FLIGHT, Status
from moeplane.controlplane.domain.rebalance_policy import Mode
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.lifecycle import Fenced
from moeplane.controlplane.wire.plan_codec import full_plan

log = logging.getLogger(__name__)


def ema(window: np.ndarray, alpha: float = 0.3) -> np.ndarray:
    """Exponential moving average over steps: ``window [W, L, E]`` oldest first -> ``[L, E]``."""
    out = window[0].astype(np.float64)
    for w in window[1:]:
        out = alpha * w + (1 - alpha) * out
    return out


def geometry(engine: Engine, job: dict) -> tuple[int, int, int] | None:
    """(world_size G, slots_per_rank S, nodes) of a job, from its spec or its nodes' ranks."""
    if not job.get("experts"):
        return None
    world = job.get("world_size")
    if world:  # the job's spec says it: only the node count is needed (not 1,024 node rows)
        n_nodes = q.count_nodes(engine, job["job_id"])
    else:
        nodes = q.list_nodes(engine, job["job_id"])
        world, n_nodes = len({r for n in nodes for r in n["ranks"]}), len(nodes)
        if not world:
            return None
    slots = job.get("slots_per_rank") or math.ceil(job["experts"] / world)
    return world, slots, n_nodes if n_nodes and world % n_nodes == 0 else 1


def identity(layers: int, experts: int, world: int, slots: int) -> np.ndarray:
    """The placement a job starts with: slot i holds expert i % E. int64 [L, G*S]."""
    return identity_placement(layers, experts, world * slots)


def plan_message(plan: dict, not_before_step: int) -> bytes:
    """Serialized full PlacementPlan of a stored plan: phy2log [L, G*S] in the smallest integer
    dtype holding its ids (uint8 for E <= 256). The bus carries it; ingest derives deltas."""
    return full_plan(plan["job_id"], plan["epoch"], plan["phy2log"], plan["slots_per_rank"],
                     not_before_step).SerializeToString()


def push(engine: Engine, job_id: str, epoch: int, clock=time.time) -> bytes:
    """approved → pushed; returns the PlacementPlan to publish."""
    plan = P.transition(engine, job_id, epoch, Status.PUSHED, clock=clock)
    latest = q.latest_step(engine, job_id) or 0
    return plan_message(plan, latest + 1)


class Controller(ReconcileLoop):
    """One per replica; reconciles the placement of every job it leads each ``interval_s``."""

    channel = "plans"

    def __init__(self, engine: Engine, bus, leadership: Leadership, *, interval_s: float = 0.5, clock=time.time):
        super().__init__(engine, bus, leadership, interval_s=interval_s, clock=clock)
        self._seen_step: dict[str, int] = {}
        self._placements: dict[str, tuple[int, np.ndarray]] = {}  # job -> (epoch, its phy2log)
        self.decisions: dict[str, str] = {}  # job -> last decision reason (for /health and tests)

    def reconcile_all(self) -> list[tuple[str, bytes]]:
        out = []
        for job in q.list_jobs(self.engine):
            term = self.leadership.try_lead(job["job_id"])
            if term is None:
                continue
            msg = self.reconcile(job, term)
            if msg is not None:
                out.append((job["job_id"], msg))
        return out

    def reconcile(self, job: dict, term: int) -> bytes | None:
        job_id = job["job_id"]
        latest = job.get("latest_step")
        if latest is None:  # no loads yet: nothing to decide on (and no geometry query)
            return None
        geo = geometry(self.engine, job)
        if geo is None:
            return None
        world, slots, nodes = geo
        now = self.clock()
        # plan rows without their [L, G*S] placement (3.8 MB at 58x8192) on every tick
        running = P.latest_plan(self.engine, job_id, (Status.APPLIED,), with_placement=False)
        if running and running["measured_after"] is None and running["applied_step"] is not None:
            self._measure(job_id, running | {"phy2log": self._placement(job_id, running["epoch"])})
        in_flight = P.latest_plan(self.engine, job_id, IN_FLIGHT, with_placement=False)
        if in_flight is not None:
            if now - in_flight["updated_at"] > P.get_policy(self.engine, job_id).plan_timeout_s:
                P.transition(self.engine, job_id, in_flight["epoch"], Status.FAILED, detail="not applied before the timeout", clock=self.clock)
            return None
        if self._seen_step.get(job_id) == latest:
            return None
        self._seen_step[job_id] = latest
        current = self._placement(job_id, running["epoch"]) if running else \
            identity(job["layers"], job["experts"], world, slots)
        policy = P.get_policy(self.engine, job_id)
        window = q.loads_history(self.engine, job_id, q.Range(step_start=max(0, latest - policy.window_steps + 1)))
        if not window:
            return None
        loads = np.stack([w["counts"] for w in window]).astype(np.float64)
        if current.shape != (loads.shape[1], world * slots):
            log.warning("job %s: placement %s does not fit loads %s", job_id, current.shape, loads.shape)
            return None
        recent = np.array([balancedness(w, current, world) for w in loads])
        stats = q.step_stats_history(self.engine, job_id, q.Range(step_start=max(0, latest - policy.window_steps + 1)))
        step_time = float(np.mean([s["step_time_s"] for s in stats])) if stats else 1.0
        last = P.list_plans(self.engine, job_id, limit=1)
        decision = decide(
            recent_balancedness=recent, predicted=ema(loads), current=current, world_size=world,
            slots_per_rank=slots, nodes=nodes, step_time_s=step_time, now=now,
            last_plan_at=last[0]["created_at"] if last else None, policy=policy,
        )
        self.decisions[job_id] = f"{decision.action}: {decision.reason}"
        if decision.action != Action.REBALANCE:
            return None
        try:
            epoch = P.create_plan(
                self.engine, job_id, decision.phy2log, world_size=world, slots_per_rank=slots,
                base_epoch=running["epoch"] if running else 0, leader_term=term, moves=decision.moves,
                cross_node_moves=decision.cross_node_moves, predicted_before=decision.predicted_before,
                predicted_after=decision.predicted_after, measured_before=float(recent[-1]),
                reason=decision.reason, clock=self.clock,
            )
        except Fenced as exc:
            log.warning("%s; giving up leadership", exc)
            self.leadership.release(job_id)
            return None
        log.info("job %s: plan %d proposed (%s)", job_id, epoch, decision.reason)
        if policy.mode != Mode.AUTO:
            return None
        P.transition(self.engine, job_id, epoch, Status.APPROVED,
                     detail="auto policy", clock=self.clock)
        if not self._term_current(job_id, term):
            return None
        return push(self.engine, job_id, epoch, clock=self.clock)

    def _term_current(self, job_id: str, term: int) -> bool:
        with self.engine.connect() as conn:
            cur = conn.execute(sa.select(t.job_leases.c.term).where(t.job_leases.c.job_id == job_id)).scalar()
        if cur != term:
            self.leadership.release(job_id)
            return False
        return True

    def _placement(self, job_id: str, epoch: int) -> np.ndarray:
        """``phy2log [L, G*S]`` of plan ``epoch`` (a plan's placement never changes: read once)."""
        cached = self._placements.get(job_id)
        if cached is None or cached[0] != epoch:
            cached = self._placements[job_id] = (epoch, P.get_plan(self.engine, job_id, epoch)["phy2log"])
        return cached[1]

    def _measure(self, job_id: str, plan: dict) -> None:
        after = q.loads_history(self.engine, job_id, q.Range(step_start=plan["applied_step"] + 1, limit=1))
        if not after:
            return
        value = balancedness(after[0]["counts"].astype(np.float64), plan["phy2log"], plan["world_size"])
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(t.plans).where(t.plans.c.job_id == job_id, t.plans.c.epoch == plan["epoch"])
                .values(measured_after=value, measured_step=after[0]["step"])
            )
