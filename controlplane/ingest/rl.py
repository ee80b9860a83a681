"""Ingest of ``RLReport``: phase spans (packed columns), weight syncs, consumed batches and
expert loads by phase.

A structurally broken report (a column of the wrong dtype or length, another job's id) is
refused whole. Otherwise each bad row is refused on its own (end < start, an unknown phase or
role, a policy version going backwards for a rank, a rank that is not the node's, phase loads
whose counts are not the job's [L, E] of integers >= 0) and the rest is stored; the error
names the first bad field. Storage is idempotent by key (see
:mod:`moeplane.controlplane.store.rl`), so the agent's resends store nothing twice; the stream
then claims the message's (node, seq) like any other.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine

from moeplane.controlplane.ingest.validate import JobShape
from moeplane.controlplane.rl.phases import PHASE_CODE, ROLE_CODE, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store.rl_loads import PhaseLoadsRow
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array

MAX_SPANS = 1 << 20  # rows per report


@dataclass
class _Refusals:
    """The first refusal's field and problem, and how many items were refused."""

    field: str = ""
    problem: str = ""
    count: int = 0

    def add(self, field: str, problem: str, count: int = 1) -> None:
        if count and not self.count:
            self.field, self.problem = field, problem
        self.count += count


def _codes(names, table: dict[str, int]) -> np.ndarray:
    """int16 [len(names) + 1]: the code in ``table`` of each name, -1 when unknown; the last
    entry (-1) is what an index out of range maps to."""
    return np.array([table.get(n, -1) for n in names] + [-1], dtype=np.int16)


def decode_spans(msg: pb.RLSpans, refused: _Refusals) -> tuple[Spans, np.ndarray]:
    """The spans of ``msg`` and a bool [N] mask of rows that pass the per-row checks (bad rows
    are counted in ``refused``). Raises WireError for a structurally broken message."""
    if not msg.HasField("step"):
        return Spans.build([], [], [], [], [], [], [], []), np.zeros(0, dtype=bool)
    step = decode_array(msg.step, "rl.spans.step", ndim=1, kinds="iu")
    n = step.shape[0]
    if n > MAX_SPANS:
        raise WireError("rl.spans.step", f"{n} spans exceed the limit of {MAX_SPANS} per report")
    cols = {"step": step}
    for name in ("rank", "version", "phase", "role", "tokens"):
        cols[name] = decode_array(getattr(msg, name), f"rl.spans.{name}", shape=(n,), kinds="iu")
    for name in ("start", "end"):
        cols[name] = decode_array(getattr(msg, name), f"rl.spans.{name}", shape=(n,), kinds="f")
    ok = np.ones(n, dtype=bool)

    def check(bad: np.ndarray, field: str, problem) -> None:
        bad = bad & ok
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            refused.add(f"rl.spans.{field}[{i}]", problem(i), int(bad.sum()))
            ok[bad] = False

    phases, roles = _codes(msg.phase_names, PHASE_CODE), _codes(msg.role_names, ROLE_CODE)
    p_in, r_in = cols["phase"].astype(np.int64), cols["role"].astype(np.int64)
    p_idx = np.where((p_in >= 0) & (p_in < len(msg.phase_names)), p_in, -1)
    r_idx = np.where((r_in >= 0) & (r_in < len(msg.role_names)), r_in, -1)
    phase, role = phases[p_idx], roles[r_idx]
    check(phase < 0, "phase", lambda i: f"{_name(msg.phase_names, p_idx[i])} is not a known phase")
    check(role < 0, "role", lambda i: f"{_name(msg.role_names, r_idx[i])} is not a known role")
    check(step < 0, "step", lambda i: f"{step[i]} < 0")
    check(cols["rank"] < -1, "rank", lambda i: f"{cols['rank'][i]} < -1")
    check(cols["version"] < 0, "version", lambda i: f"{cols['version'][i]} < 0")
    check(cols["tokens"] < 0, "tokens", lambda i: f"{cols['tokens'][i]} < 0")
    check(cols["end"] < cols["start"], "end",
          lambda i: f"end {cols['end'][i]} < start {cols['start'][i]}")
    check(cols["start"] < 0, "start", lambda i: f"{cols['start'][i]} is not a unix time")
    spans = Spans(step.astype(np.int64), cols["rank"].astype(np.int32), cols["version"].astype(np.int64),
                  np.maximum(phase, 0).astype(np.int8), np.maximum(role, 0).astype(np.int8),
                  cols["start"].astype(np.float64), cols["end"].astype(np.float64), cols["tokens"].astype(np.int64))
    return spans, ok


def _name(names, index: int) -> str:
    return repr(names[index]) if index >= 0 else f"index {index} (of {len(names)} names)"


def check_versions(spans: Spans, ok: np.ndarray, latest: dict[int, tuple[float, int]],
                   refused: _Refusals) -> None:
    """Refuse (in ``ok``) rows whose policy version is lower than an earlier span's of the same
    rank: in this report (ordered by start) or stored (``latest``: rank -> (start, version)),
    unless the row starts no later than that stored span (an old span resent)."""
    rows = np.flatnonzero(ok & (spans.rank >= 0))
    if rows.size == 0:
        return
    order = rows[np.lexsort((spans.start[rows], spans.rank[rows]))]
    rank, version, start = spans.rank[order], spans.version[order], spans.start[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = rank[1:] != rank[:-1]
    group = np.cumsum(first) - 1
    # stored (start, version) of each row's rank; -inf / -1 when none
    stored_v = np.array([latest.get(int(r), (0.0, -1))[1] for r in rank[first]], dtype=np.int64)[group]
    stored_s = np.array([latest.get(int(r), (-math.inf, -1))[0] for r in rank[first]])[group]
    # highest version of the earlier rows of the same rank: a running max restarted per rank
    # (on version ranks, so that rank offsets cannot overflow int64)
    values, vr = np.unique(version, return_inverse=True)
    width = int(vr.max()) + 1
    running = values[np.maximum.accumulate(vr + group * width) - group * width]
    earlier = np.full(order.size, -1, dtype=np.int64)
    earlier[1:] = np.where(first[1:], -1, running[:-1])
    bad = (version < earlier) | ((version < stored_v) & (start > stored_s))
    if bad.any():
        k = int(np.argmin(np.where(bad, order, np.iinfo(np.int64).max)))  # the first bad row sent
        i, r = int(order[k]), int(rank[k])
        high = max(int(earlier[k]), int(stored_v[k]) if start[k] > stored_s[k] else -1)
        refused.add(f"rl.spans.version[{i}]", f"version {int(version[k])} of rank {r} goes backwards "
                                                f"(an earlier span has version {high})", int(bad.sum()))
    ok[order[bad]] = False


def _sync(s: pb.WeightSync, i: int, refused: _Refusals) -> dict | None:
    f = f"rl.syncs[{i}]"
    times = {"start_ts": s.start, "pause_s": s.pause_s, "transfer_s": s.transfer_s, "resume_s": s.resume_s}
    bad = next((k for k, x in times.items() if not (math.isfinite(x) and x >= 0)), None)
    problem = (
        (f"{f}.to_version", f"{s.to_version} is not above from_version {s.from_version}")
        if s.to_version <= s.from_version or s.from_version < 0 else
        (f"{f}.bytes", f"{s.bytes} < 0") if s.bytes < 0 else
        (f"{f}.rank", f"{s.rank} < -1") if s.rank < -1 else
        (f"{f}.step", f"{s.step} < 0") if s.step < 0 else
        (f"{f}.{bad.removesuffix('_ts')}", f"{times[bad]} is not >= 0") if bad else None
    )
    if problem:
        refused.add(*problem)
        return None
    return {"rank": s.rank, "to_version": s.to_version, "from_version": s.from_version, "step": s.step,
            "bytes": s.bytes, **times}


def _batch(b: pb.ConsumedBatch, i: int, refused: _Refusals) -> dict | None:
    f = f"rl.batches[{i}]"
    problem = (
        (f"{f}.lag_mean", f"lags must satisfy 0 <= lag_min <= lag_mean <= lag_max, got "
                          f"{b.lag_min}, {b.lag_mean}, {b.lag_max}")
        if not (math.isfinite(b.lag_mean) and 0 <= b.lag_min <= b.lag_mean <= b.lag_max) else
        (f"{f}.bound", f"{b.bound} < -1") if b.bound < -1 else
        next(((f"{f}.{k}", f"{getattr(b, k)} < 0") for k in ("step", "trained_version", "samples", "dropped",
                                                              "partial") if getattr(b, k) < 0), None)
        or ((f"{f}.rank", f"{b.rank} < -1") if b.rank < -1 else
            (f"{f}.timestamp", f"{b.timestamp} is not a unix time") if not (math.isfinite(b.timestamp)
                                                                            and b.timestamp >= 0) else None)
    )
    if problem:
        refused.add(*problem)
        return None
    return {k: getattr(b, k) for k in ("step", "rank", "trained_version", "samples", "lag_min", "lag_mean",
                                       "lag_max", "bound", "dropped", "partial")} | {"ts": b.timestamp}


def _phase_loads(p: pb.PhaseLoads, i: int, shape: JobShape | None, job: str,
                 refused: _Refusals) -> PhaseLoadsRow | None:
    """The row of ``p`` (its counts checked against the job's [L, E]), or None when refused."""
    f = f"rl.phase_loads[{i}]"
    code = PHASE_CODE.get(p.phase)
    problem = (
        (f"{f}.phase", f"{p.phase!r} is not a known phase") if code is None else
        (f"{f}.step", f"{p.step} < 0") if p.step < 0 else
        (f"{f}.rank", f"{p.rank} < 0 (phase loads are a device's)") if p.rank < 0 else
        (f"{f}.timestamp", f"{p.timestamp} is not a unix time")
        if not (math.isfinite(p.timestamp) and p.timestamp >= 0) else
        (f"{f}.counts", f"job {job!r} has no [L, E] yet (declare layers and experts in its job spec)")
        if shape is None or not (shape.layers and shape.experts) else None
    )
    if problem:
        refused.add(*problem)
        return None
    try:
        counts = decode_array(p.counts, f"{f}.counts", ndim=2, shape=(shape.layers, shape.experts), kinds="iu",
                              nonnegative=True)
    except WireError as exc:
        refused.add(exc.field, exc.problem)
        return None
    return PhaseLoadsRow(int(p.step), int(p.rank), code, float(p.timestamp), counts)


def _foreign(ranks: np.ndarray, node_ranks: set[int]) -> np.ndarray:
    """bool mask of ``ranks`` (>= 0) that are not the node's; none when its hello announced no
    ranks."""
    if not node_ranks:
        return np.zeros(ranks.shape, dtype=bool)
    return (ranks >= 0) & ~np.isin(ranks, sorted(node_ranks))


class RLIngest:
    """Validates and stores RL reports; remembers each rank's latest (start, version).

    ``catalog``: the jobs' [L, E] (``await catalog.get(job_id)`` -> JobShape | None), which
    phase loads must match."""

    def __init__(self, engine: Engine, catalog):
        self.engine = engine
        self.catalog = catalog
        self._latest: dict[tuple[str, int], tuple[float, int]] = {}

    def _context(self, job_id: str, node_id: str, ranks: set[int]):
        node_job, node_ranks = store_rl.node_ranks(self.engine, node_id)
        missing = [r for r in ranks if (job_id, r) not in self._latest]
        for r, v in store_rl.rank_versions(self.engine, job_id, missing).items():
            self._latest[(job_id, r)] = v
        return node_job, node_ranks

    async def accept(self, report: pb.RLReport, *, node_id: str, job_id: str) -> int:
        """Store what is valid of ``report`` from ``node_id`` (serving ``job_id``); returns the
        spans stored. Raises WireError naming the first bad field when anything was refused."""
        job = report.job_id or job_id
        if not job:
            raise WireError("rl.job_id", "empty, and the node serves no job")
        if job_id and job != job_id:
            raise WireError("rl.job_id", f"node {node_id!r} is not part of job {job!r} (it serves {job_id!r})")
        refused = _Refusals()
        spans, ok = decode_spans(report.spans, refused)
        ranks = {int(r) for r in np.unique(spans.rank[ok]) if r >= 0}
        node_job, node_ranks = await asyncio.to_thread(self._context, job, node_id, ranks)
        if node_job is not None and node_job != job:
            raise WireError("rl.job_id", f"node {node_id!r} is not part of job {job!r}")
        foreign = ok & _foreign(spans.rank, node_ranks)
        if foreign.any():
            i = int(np.flatnonzero(foreign)[0])
            refused.add(f"rl.spans.rank[{i}]", f"rank {spans.rank[i]} is not a rank of node {node_id!r} "
                        f"in job {job!r}", int(foreign.sum()))
            ok &= ~foreign
        latest = {r: self._latest[(job, r)] for r in ranks if (job, r) in self._latest}
        check_versions(spans, ok, latest, refused)
        syncs = [d for i, s in enumerate(report.syncs) if (d := _sync(s, i, refused)) is not None]
        batches = [d for i, b in enumerate(report.batches) if (d := _batch(b, i, refused)) is not None]
        loads = await self._loads(report.phase_loads, job, node_id, node_ranks, refused)
        good = spans.take(ok)
        await asyncio.to_thread(store_rl.save_report, self.engine, job, node_id, good, syncs, batches, loads)
        for r in np.unique(good.rank[good.rank >= 0]).tolist():
            mine = good.rank == r
            prev = self._latest.get((job, r), (-math.inf, -1))
            self._latest[(job, r)] = (max(prev[0], float(good.start[mine].max())),
                                      max(prev[1], int(good.version[mine].max())))
        if refused.count:
            total = len(spans) + len(report.syncs) + len(report.batches) + len(report.phase_loads)
            raise WireError(refused.field, f"{refused.problem} ({refused.count} of {total} items refused; "
                                           "the rest stored)")
        return len(good)

    async def _loads(self, msgs, job: str, node_id: str, node_ranks: set[int],
                     refused: _Refusals) -> list[PhaseLoadsRow]:
        """The valid rows of ``msgs`` (repeated PhaseLoads); the others counted in ``refused``."""
        if not msgs:
            return []
        shape = await self.catalog.get(job)
        rows = []
        for i, p in enumerate(msgs):
            row = _phase_loads(p, i, shape, job, refused)
            if row is not None and _foreign(np.array([row.rank]), node_ranks)[0]:
                refused.add(f"rl.phase_loads[{i}].rank", f"rank {row.rank} is not a rank of node {node_id!r} "
                            f"in job {job!r}")
                row = None
            if row is not None:
                rows.append(row)
        return rows
