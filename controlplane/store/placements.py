"""The one source of a job's placement: its geometry, the placement running now, and the
placement that ran at step s. The controller, REST, the dashboard, the plan diff, the load
history and ``/metrics`` all read placements here.

Rules, written once:

- geometry: L layers and E experts from the job row; G ranks from the job's ``world_size``,
  else the ranks its nodes announced; S from ``slots_per_rank`` when G*S holds every expert,
  else ``ceil(E / G)``; nodes: for a job with ``groups``, ``world_size / ranks_per_node`` (the
  spec's nodes, each group kept on one: ingest checked that they fit), else the job's node
  count when it divides G, else 1;
- running now: the newest plan with status applied; before the first one, or when that plan
  does not fit the geometry's L and E, the identity placement (slot s holds expert s % E);
- at step s: the plan with the largest ``applied_step`` <= s among plans that ran (applied or
  since rolled back), else the identity placement.

A plan's ``phy2log`` [L, G*S] never changes once written, so it is read from the store once
per (job, epoch, created_at) and kept in a bounded LRU (3.8 MB per plan at 58 x 8192 slots);
every other read takes the plan rows without their blob. Thread-safe.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.domain.lifecycle import RAN, Status
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t


@dataclass(frozen=True)
class Geometry:
    """EP geometry of a job: L layers, E experts, G ranks, S slots per rank, N nodes."""

    layers: int
    experts: int
    ranks: int
    slots_per_rank: int
    nodes: int = 1

    @property
    def slots(self) -> int:
        return self.ranks * self.slots_per_rank


@dataclass(frozen=True)
class Placement:
    """``phy2log`` int64 [L, G*S] of ``geometry``; ``epoch`` 0 is the identity placement."""

    geometry: Geometry
    phy2log: np.ndarray
    epoch: int = 0
    created_at: float | None = None

    @property
    def source(self) -> str:
        return "identity" if self.epoch == 0 else f"epoch {self.epoch}"

    @property
    def key(self) -> tuple:
        return (self.epoch, self.created_at, self.geometry)


def slots_per_rank(experts: int, world: int, slots: int | None) -> int:
    """S of a job's geometry: the spec's ``slots`` when ``world x slots`` hold all ``experts``,
    else ``ceil(experts / world)``."""
    return slots if slots and slots * world >= experts else math.ceil(experts / world)


def geometry(engine: Engine, job: dict, shape: tuple[int, int] | None = None) -> Geometry | None:
    """The geometry of ``job`` (a ``get_job`` row); None while L, E or G are not known.

    ``shape`` (L, E) of a load matrix a caller wants to show overrides the job's L and E, and
    then a job with no known ranks counts as one rank (the dashboard shows loads at once).
    """
    layers, experts = shape if shape is not None else (job.get("layers"), job.get("experts"))
    if not layers or not experts:
        return None
    world = job.get("world_size")
    if world:  # the spec says it: only the node count is needed (not 1,024 node rows)
        n_nodes = q.count_nodes(engine, job["job_id"])
    else:
        nodes = q.list_nodes(engine, job["job_id"])
        world, n_nodes = len({r for n in nodes for r in n["ranks"]}), len(nodes)
        if not world and shape is None:
            return None
        world = world or 1
    slots = slots_per_rank(int(experts), int(world), job.get("slots_per_rank"))
    per_node = job.get("ranks_per_node")
    if job.get("groups") and per_node and world % per_node == 0:
        n_nodes = world // per_node
    return Geometry(int(layers), int(experts), int(world), int(slots),
                    n_nodes if n_nodes and world % n_nodes == 0 else 1)


def identity(geo: Geometry) -> Placement:
    """The placement a job starts with: slot i holds expert i % E."""
    return Placement(geo, identity_placement(geo.layers, geo.experts, geo.slots))


class PlacementSource:
    """Placements of every job of one store, with the blobs of the ``size`` most recently
    used plans cached. ``blob_reads`` counts the plan blobs read from the store."""

    def __init__(self, engine: Engine, size: int = 32):
        if size < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.engine = engine
        self.size = size
        self.blob_reads = 0
        self._lock = threading.Lock()
        self._blobs: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def geometry(self, job: dict, shape: tuple[int, int] | None = None) -> Geometry | None:
        return geometry(self.engine, job, shape)

    def of_plan(self, job_id: str, head: dict, geo: Geometry) -> Placement | None:
        """The placement of the plan whose row without its blob is ``head``; None when it is
        gone or does not fit ``geo`` (other L, or an expert id >= E)."""
        key = (job_id, head["epoch"], head["created_at"])
        with self._lock:
            phy2log = self._blobs.get(key)
            if phy2log is not None:
                self._blobs.move_to_end(key)
        if phy2log is None:
            try:
                phy2log = P.get_plan(self.engine, job_id, head["epoch"])["phy2log"]
            except q.NotFound:  # gone since the row was read: as if it had not run
                return None
            with self._lock:
                self.blob_reads += 1
                self._blobs[key] = phy2log
                while len(self._blobs) > self.size:
                    self._blobs.popitem(last=False)
        if head["layers"] != geo.layers or (phy2log.size and int(phy2log.max()) >= geo.experts):
            return None
        plan_geo = Geometry(geo.layers, geo.experts, int(head["world_size"]),
                            int(head["slots_per_rank"]), geo.nodes)
        return Placement(plan_geo, phy2log, int(head["epoch"]), head["created_at"])

    def running(self, job: dict, shape: tuple[int, int] | None = None) -> Placement | None:
        """The placement ``job`` runs now (for loads of ``shape``, default the job's [L, E]);
        None while its geometry is unknown."""
        geo = self.geometry(job, shape)
        if geo is None:
            return None
        head = P.latest_plan(self.engine, job["job_id"], (Status.APPLIED,), with_placement=False)
        placement = None if head is None else self.of_plan(job["job_id"], head, geo)
        return placement if placement is not None else identity(geo)

    def ran(self, job_id: str) -> list[dict]:
        """Rows (no blob) of the plans that ran, by ``applied_step`` then epoch ascending."""
        p = t.plans.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(*P.SUMMARY_COLUMNS).where(p.job_id == job_id, p.applied_step.is_not(None),
                                       p.status.in_([str(s) for s in RAN]))
                .order_by(p.applied_step, p.epoch)
            ).mappings().all()
        return [dict(r) for r in rows]

    def at_steps(self, job: dict, steps: list[int],
                 shape: tuple[int, int] | None = None) -> list[Placement] | None:
        """The placement that ran at each of ``steps``; None while the geometry is unknown."""
        geo = self.geometry(job, shape)
        if geo is None:
            return None
        ran = self.ran(job["job_id"])
        start = identity(geo)
        by_epoch: dict[int, Placement] = {}
        out = []
        for step in steps:
            head = next((h for h in reversed(ran) if h["applied_step"] <= step), None)
            if head is None:
                out.append(start)
                continue
            if head["epoch"] not in by_epoch:
                placement = self.of_plan(job["job_id"], head, geo)
                by_epoch[head["epoch"]] = placement if placement is not None else start
            out.append(by_epoch[head["epoch"]])
        return out
