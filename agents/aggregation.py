"""Per-step aggregation of the node's ranks, with a deadline. Pure: time comes in as ``now``.

Each rank reports its ``counts[L, E]`` and statistics for a step. A step is complete when every
expected rank reported, or when ``deadline_s`` has passed since its first report; the ranks
that did not report by then are listed as missing, and a report that arrives after its step was
emitted is counted in ``late_reports`` and dropped (the control plane keeps one row per
(job, node, step) anyway).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RankReport:
    """One rank's step. counts: [L, E] int64 tokens routed to each logical expert."""

    rank: int
    counts: np.ndarray
    step_time_s: float
    host_bound_ratio: float
    tokens: int
    timestamp: float


@dataclass(frozen=True)
class NodeStep:
    """The node's ranks summed for one step. counts: [L, E] int64, over ``ranks``."""

    job_id: str
    step: int
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    counts: np.ndarray
    reports: tuple[RankReport, ...]
    timestamp: float


@dataclass
class _Open:
    first_seen: float
    reports: dict[int, RankReport] = field(default_factory=dict)


class StepAggregator:
    """Aggregates steps of one job on one node.

    expected: the ranks of this node (e.g. from ``--ranks``); ranks that attach are added with
    :meth:`expect`. deadline_s: seconds after a step's first report before it is emitted
    without the missing ranks.
    """

    def __init__(self, job_id: str, expected: set[int] | None = None, deadline_s: float = 10.0,
                 remember_steps: int = 4096):
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.job_id = job_id
        self.expected: set[int] = set(expected or ())
        self.deadline_s = deadline_s
        self.open: dict[int, _Open] = {}
        self.emitted: OrderedDict[int, None] = OrderedDict()
        self.remember_steps = remember_steps
        self.late_reports = 0

    def expect(self, rank: int) -> None:
        self.expected.add(rank)

    def add(self, step: int, report: RankReport, now: float) -> list[NodeStep]:
        """Record ``report`` for ``step``; return the steps it completes (0 or 1)."""
        if step in self.emitted:
            self.late_reports += 1
            return []
        self.expected.add(report.rank)
        entry = self.open.setdefault(step, _Open(first_seen=now))
        if entry.reports and next(iter(entry.reports.values())).counts.shape != report.counts.shape:
            raise ValueError(f"counts shape {report.counts.shape} differs from other ranks "
                             f"of step {step}")
        entry.reports[report.rank] = report
        if self.expected <= entry.reports.keys():
            return [self._emit(step)]
        return []

    def due(self, now: float) -> list[NodeStep]:
        """Emit every open step whose deadline has passed, oldest step first."""
        late = sorted(s for s, e in self.open.items() if now - e.first_seen >= self.deadline_s)
        return [self._emit(s) for s in late]

    def next_deadline(self) -> float | None:
        """Earliest time (same clock as ``now``) at which :meth:`due` emits something."""
        if not self.open:
            return None
        return min(e.first_seen for e in self.open.values()) + self.deadline_s

    def _emit(self, step: int) -> NodeStep:
        entry = self.open.pop(step)
        self.emitted[step] = None
        while len(self.emitted) > self.remember_steps:
            self.emitted.popitem(last=False)
        reports = tuple(entry.reports[r] for r in sorted(entry.reports))
        counts = np.sum([r.counts for r in reports], axis=0, dtype=np.int64)
        return NodeStep(
            job_id=self.job_id,
            step=step,
            ranks=tuple(r.rank for r in reports),
            missing_ranks=tuple(sorted(self.expected - entry.reports.keys())),
            counts=counts,
            reports=reports,
            timestamp=max(r.timestamp for r in reports),
        )
