"""Store reads for the dashboard, through the service layer (``moeplane.controlplane.store.queries``).

Only I/O and caching live here; the arithmetic is in ``placement`` and the figures in the
``*_views`` modules. The balancedness cache keeps, per job and placement, the per-layer
balancedness of recent steps so a live refresh decodes only new (or still-growing) steps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.dashboard.expert_views import JobGeometry, job_geometry, layer_balancedness_of
from moeplane.dashboard.placement import identity_phy2log


@dataclass(frozen=True)
class Placement:
    """The placement the Experts views assume: geometry, ``phy2log`` [L, G*S], its source."""

    geometry: JobGeometry
    phy2log: np.ndarray
    source: str  # "identity" before the first applied plan, else "epoch N"

    @property
    def key(self) -> tuple:
        g = self.geometry
        return (self.source, g.layers, g.experts, g.ranks, g.slots_per_rank)


def job_ranks(engine: Engine, job_id: str) -> int:
    """Number of distinct EP ranks the job's nodes serve."""
    ranks: set[int] = set()
    for node in q.list_nodes(engine, job_id=job_id):
        ranks.update(node["ranks"])
    return len(ranks)


RUNNING = (Status.APPLIED, Status.ROLLED_BACK)
"""Statuses of plans that were in effect at some time (applied, maybe replaced since)."""


def _plan_placement(shape: tuple[int, int], plan: dict) -> Placement | None:
    """The placement of ``plan`` (with its ``phy2log``) for loads of ``shape`` [L, E]; None
    when it does not fit them."""
    layers, experts = shape
    phy2log = plan["phy2log"]
    fits = (phy2log.shape == (layers, plan["world_size"] * plan["slots_per_rank"])
            and (phy2log.size == 0 or int(phy2log.max()) < experts))
    if not fits:
        return None
    geom = JobGeometry(layers, experts, int(plan["world_size"]), int(plan["slots_per_rank"]))
    return Placement(geom, phy2log, f"epoch {plan['epoch']}")


def _identity(job: dict, shape: tuple[int, int], ranks_seen: int) -> Placement:
    geom = job_geometry(job, shape, ranks_seen)
    return Placement(geom, identity_phy2log(geom.layers, geom.experts, geom.ranks, geom.slots_per_rank),
                     "identity")


class PlacementCache:
    """The running plan's placement per (job, plan, loads shape), so a dashboard refresh reads
    the plan's [L, G*S] placement blob (3.8 MB at 58x8192) only when the running plan changes:
    each refresh reads the running plan's row without its blob, and the blob only for a plan
    (or shape) not seen yet. Keeps the ``size`` most recently used entries; thread-safe."""

    def __init__(self, size: int = 16):
        if size < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        # (job_id, epoch, created_at, shape) -> the plan's placement, None: it does not fit
        self._placements: OrderedDict[tuple, Placement | None] = OrderedDict()

    def running(self, engine: Engine, job_id: str, shape: tuple[int, int]) -> Placement | None:
        """The placement of the job's newest applied plan for loads of ``shape``; None when
        there is none or it does not fit ``shape``."""
        head = P.latest_plan(engine, job_id, (Status.APPLIED,), with_placement=False)
        return None if head is None else self.of_plan(engine, job_id, head, shape)

    def of_plan(self, engine: Engine, job_id: str, head: dict, shape: tuple[int, int]) -> Placement | None:
        """The placement of the plan whose row without its blob is ``head`` (epoch,
        created_at) for loads of ``shape``; None when it does not fit ``shape`` or is gone."""
        # created_at: a plan row re-created under the same epoch (a restored store) is another plan
        key = (job_id, head["epoch"], head["created_at"], tuple(int(n) for n in shape))
        with self._lock:
            if key in self._placements:
                self._placements.move_to_end(key)
                return self._placements[key]
        try:
            plan = P.get_plan(engine, job_id, head["epoch"])
        except q.NotFound:  # gone since the read above: as if there were no plan (not cached)
            return None
        placement = _plan_placement(shape, plan)
        with self._lock:
            self._placements[key] = placement
            self._placements.move_to_end(key)
            while len(self._placements) > self.size:
                self._placements.popitem(last=False)
        return placement


def current_placement(engine: Engine, job_id: str, shape: tuple[int, int],
                      cache: PlacementCache | None = None) -> Placement:
    """The job's running placement for a load matrix of ``shape`` [L, E]: the ``phy2log`` of
    its newest applied plan, else (before the first plan, or when that plan does not fit the
    shape) the identity placement (slot ``s`` holds ``s % E``). With ``cache``, the plan's
    placement is read from the store only when the running plan changes."""
    job = q.get_job(engine, job_id)
    if cache is None:
        plan = P.latest_plan(engine, job_id, (Status.APPLIED,))
        placement = None if plan is None else _plan_placement(shape, plan)
    else:
        placement = cache.running(engine, job_id, shape)
    return placement if placement is not None else _identity(job, shape, job_ranks(engine, job_id))


def placements_at_steps(engine: Engine, job_id: str, shape: tuple[int, int], steps: list[int],
                        cache: PlacementCache | None = None) -> list[Placement]:
    """The placement that ran at each of ``steps``: the newest plan applied at or before the
    step (applied, or since rolled back), else the identity placement. Reads each plan's
    placement once per call, or with ``cache`` once while the cache keeps it."""
    job = q.get_job(engine, job_id)
    ranks = job_ranks(engine, job_id)
    applied = sorted(
        ((p["applied_step"], p["epoch"], p) for p in P.list_plans(engine, job_id, limit=1000)
         if p["status"] in RUNNING and p["applied_step"] is not None),
        key=lambda a: a[:2],
        reverse=True,
    )
    by_epoch: dict[int | None, Placement] = {}
    out = []
    for step in steps:
        head = next((p for s, _, p in applied if s <= step), None)
        epoch = None if head is None else head["epoch"]
        if epoch not in by_epoch:
            if head is None:
                placement = None
            elif cache is not None:
                placement = cache.of_plan(engine, job_id, head, shape)
            else:
                try:
                    placement = _plan_placement(shape, P.get_plan(engine, job_id, epoch))
                except q.NotFound:  # gone since the list above: as if it had not run
                    placement = None
            by_epoch[epoch] = placement if placement is not None else _identity(job, shape, ranks)
        out.append(by_epoch[epoch])
    return out


class BalancednessCache:
    """Per-layer balancedness of recent steps, per (job, placement); thread-safe."""

    def __init__(self, window: int = 60):
        if window < 1:
            raise ValueError(f"window: must be >= 1, got {window}")
        self.window = window
        self._lock = threading.Lock()
        # (job_id, placement key) -> {step: (nodes_reported, layer_bal [L])}
        self._steps: dict[tuple, dict[int, tuple[int, np.ndarray]]] = {}

    def recent(self, engine: Engine, job_id: str, latest_step: int, placement: Placement,
               nodes_expected: int) -> tuple[list[int], np.ndarray]:
        """Steps (ascending) of the last ``window`` steps up to ``latest_step`` and their
        balancedness [T, L]. Re-reads only steps not cached or cached before every node reported."""
        lo = latest_step - self.window + 1
        key = (job_id, placement.key)
        with self._lock:
            cached = dict(self._steps.get(key, {}))
        cached = {s: v for s, v in cached.items() if s >= lo}
        incomplete = [s for s, (n, _) in cached.items() if n < nodes_expected]
        start = min(incomplete) if incomplete else (max(cached) + 1 if cached else lo)
        start = max(start, lo)
        if start <= latest_step:
            rows = q.loads_history(
                engine, job_id, q.Range(step_start=start, step_end=latest_step + 1, limit=self.window)
            )
            g = placement.geometry
            for row in rows:
                counts = row["counts"]
                if counts.shape != (g.layers, g.experts):
                    continue
                cached[row["step"]] = (
                    row["nodes_reported"],
                    layer_balancedness_of(counts, placement.phy2log, g.ranks),
                )
        with self._lock:
            self._steps[key] = cached
        steps = sorted(cached)
        if not steps:
            return [], np.zeros((0, placement.geometry.layers))
        return steps, np.stack([cached[s][1] for s in steps])
