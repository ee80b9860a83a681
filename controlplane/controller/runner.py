"""The reconcile loop: for each job this replica leads, read state, decide, execute.

Reads (store, the running placement from :mod:`moeplane.controlplane.store.placements`) →
``decide`` (pure) → persists a plan (fenced by the leadership term) → under the auto policy,
approves and pushes it through the executor; the loop publishes it on the bus channel
``plans.<job>`` where every replica's ingest streams it to the job's agents. Also measures the balancedness a plan achieved from the first loads after
it was applied, and fails plans that were pushed but never applied in time.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.balancing import routed_balancedness
from moeplane.controlplane.balancing.prediction import MEASURE_STEPS
from moeplane.controlplane.controller.decide import Action, decide, ema
from moeplane.controlplane.controller.executor import push_plan
from moeplane.controlplane.controller.leader import Leadership
from moeplane.controlplane.controller.loop import ReconcileLoop
from moeplane.controlplane.domain.lifecycle import IN_FLIGHT, Status
from moeplane.controlplane.domain.rebalance_policy import Mode
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.lifecycle import Fenced
from moeplane.controlplane.store.placements import PlacementSource

log = logging.getLogger(__name__)


class Controller(ReconcileLoop):
    """One per replica; reconciles the placement of every job it leads each ``interval_s``."""

    channel = "plans"

    def __init__(self, engine: Engine, bus, leadership: Leadership, *, interval_s: float = 0.5,
                 clock=time.time, placements: PlacementSource | None = None):
        super().__init__(engine, bus, leadership, interval_s=interval_s, clock=clock)
        self._seen_step: dict[str, int] = {}
        self.placements = placements or PlacementSource(engine)
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
        placement = self.placements.running(job)
        if placement is None:  # geometry not known yet
            return None
        geo = placement.geometry
        world, slots, nodes = geo.ranks, geo.slots_per_rank, geo.nodes
        groups = job.get("groups")  # geometry's nodes are then the spec's (one node per group set)
        now = self.clock()
        # plan rows without their [L, G*S] placement (3.8 MB at 58x8192) on every tick
        running = P.latest_plan(self.engine, job_id, (Status.APPLIED,), with_placement=False)
        if running and running["applied_step"] is not None and placement.epoch == running["epoch"] \
                and (running["measured_step"] or -1) < running["applied_step"] + MEASURE_STEPS:
            self._measure(job_id, running | {"phy2log": placement.phy2log})
        in_flight = P.latest_plan(self.engine, job_id, IN_FLIGHT, with_placement=False)
        if in_flight is not None:
            if now - in_flight["updated_at"] > P.get_policy(self.engine, job_id).plan_timeout_s:
                P.transition(self.engine, job_id, in_flight["epoch"], Status.FAILED,
                             detail="not applied before the timeout", clock=self.clock)
            return None
        if self._seen_step.get(job_id) == latest:
            return None
        self._seen_step[job_id] = latest
        current = placement.phy2log
        policy = P.get_policy(self.engine, job_id)
        window = q.loads_history(self.engine, job_id, q.Range(step_start=max(0, latest - policy.window_steps + 1)))
        if not window:
            return None
        loads = np.stack([w["counts"] for w in window]).astype(np.float64)
        if current.shape != (loads.shape[1], world * slots):
            log.warning("job %s: placement %s does not fit loads %s", job_id, current.shape, loads.shape)
            return None
        # what the job measures: each step's tokens routed among the replicas (the SDK's rule)
        recent = routed_balancedness(loads, current, gpus=world).mean(axis=1)
        stats = q.step_stats_history(self.engine, job_id, q.Range(step_start=max(0, latest - policy.window_steps + 1)))
        step_time = float(np.mean([s["step_time_s"] for s in stats])) if stats else 1.0
        last = P.list_plans(self.engine, job_id, limit=1)
        decision = decide(
            recent_balancedness=recent, predicted=ema(loads), current=current, world_size=world,
            slots_per_rank=slots, nodes=nodes, step_time_s=step_time, now=now,
            last_plan_at=last[0]["created_at"] if last else None, policy=policy, window=loads,
            groups=groups,
        )
        self.decisions[job_id] = f"{decision.action}: {decision.reason}"
        if decision.action != Action.REBALANCE:
            return None
        try:
            epoch = P.create_plan(
                self.engine, job_id, decision.phy2log, world_size=world, slots_per_rank=slots,
                base_epoch=running["epoch"] if running else 0, leader_term=term, moves=decision.moves,
                cross_node_moves=decision.cross_node_moves, predicted_before=decision.predicted_before,
                predicted_after=decision.predicted_after, measured_before=float(recent.mean()),
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
        return push_plan(self.engine, job_id, epoch, clock=self.clock)

    def _term_current(self, job_id: str, term: int) -> bool:
        with self.engine.connect() as conn:
            cur = conn.execute(sa.select(t.job_leases.c.term).where(t.job_leases.c.job_id == job_id)).scalar()
        if cur != term:
            self.leadership.release(job_id)
            return False
        return True

    def _measure(self, job_id: str, plan: dict) -> None:
        # the mean over the plan's first MEASURE_STEPS steps (as predicted_after is the mean
        # over the window's steps), refined as they arrive: a plan replaced sooner keeps the
        # mean over the steps it ran
        after = q.loads_history(
            self.engine, job_id, q.Range(step_start=plan["applied_step"] + 1, limit=MEASURE_STEPS)
        )
        if not after or after[-1]["step"] == plan["measured_step"]:
            return
        window = np.stack([a["counts"] for a in after]).astype(np.float64)
        value = float(routed_balancedness(window, plan["phy2log"], gpus=plan["world_size"]).mean())
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(t.plans).where(t.plans.c.job_id == job_id, t.plans.c.epoch == plan["epoch"])
                .values(measured_after=value, measured_step=after[-1]["step"])
            )
