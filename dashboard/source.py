"""Store reads for the dashboard, through the service layer (``moeplane.controlplane.store.queries``).

Only I/O and caching live here; the arithmetic is in ``placement`` and the figures in the
``*_views`` modules. The balancedness cache keeps, per job and placement, the per-layer
balancedness of recent steps so a live refresh decodes only new (or still-growing) steps.
"""

from __future__ import annotations

import threading

import numpy as np
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.placements import Placement, PlacementSource
from moeplane.dashboard.expert_views import layer_balancedness_of


def current_placement(engine: Engine, job_id: str, shape: tuple[int, int],
                      source: PlacementSource | None = None) -> Placement:
    """The job's running placement for a load matrix of ``shape`` [L, E] (the rules:
    :mod:`moeplane.controlplane.store.placements`). Pass the app's ``source`` so a refresh
    reads a plan's placement blob only once per plan."""
    source = source or PlacementSource(engine)
    return source.running(q.get_job(engine, job_id), shape)


def placements_at_steps(engine: Engine, job_id: str, shape: tuple[int, int], steps: list[int],
                        source: PlacementSource | None = None) -> list[Placement]:
    """The placement that ran at each of ``steps``, for loads of ``shape`` [L, E]."""
    source = source or PlacementSource(engine)
    return source.at_steps(q.get_job(engine, job_id), steps, shape)


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
