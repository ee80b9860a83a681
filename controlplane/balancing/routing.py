"""Per-step replica routing (pure): one step's tokens of each logical expert divided among
its replicas so that the most loaded GPU is as light as possible.

``route_replicas(loads, phy2log, *, gpus) -> slot_tokens``:

- ``loads [L, E]`` int64: one step's global tokens per logical expert;
- ``phy2log [L, G*S]`` int64: logical expert of each physical slot (GPU ``g`` owns slots
  ``g*S .. (g+1)*S-1``);
- ``slot_tokens [L, G*S]`` int64: tokens each slot receives; for every (l, e) they sum exactly
  to ``loads[l, e]``.

The rule. With the replicas fixed, a layer's least possible max GPU load is a linear
program. An expert with one holding GPU puts all its tokens there; an expert held by several
GPUs (its *replicated* experts) may divide them freely. Among all divisions, the one that
minimises the sum of squared GPU loads also minimises the max (it is the decreasingly minimal
point of a base polytope; Fujishige). ``route_replicas`` approaches it by damped simultaneous
water-filling: each replicated expert, given the other experts' load on its GPUs, pours its
tokens into them to one level; it moves ``1 / m`` of the way there, ``m`` the most
replicated experts sharing one of its GPUs (so that every such step lowers the sum of
squares). Load that must travel along a chain of replicated experts diffuses slowly, so each
round starts from the last division pushed ``MOMENTUM`` further along its last change
(heavy-ball momentum; clipped at 0 and scaled back to the expert's tokens). After
``ITERATIONS`` rounds the division
with the lowest max load seen, per layer, is kept (the even split is the first one seen, so
the result is never worse than it). Several slots of one expert on one GPU share that GPU's
tokens evenly. Fractional shares become integers by cumulative rounding over the expert's
slots in slot order, so each slot is within one token of its share and the expert's slots sum
exactly to ``loads[l, e]``.

Senders and ties. The rule divides a global count; which sender's tokens fill which slot does
not change any GPU's load, so the SDK fills slots local-first (``moeplane.agents.sdk.routing``):
each sender's tokens of an expert go first to that expert's slots on its own rank, then on its
node, then anywhere; every rank derives the same assignment from the same all-gathered counts.

``routing_table`` holds the part that depends only on the placement (computed once per plan;
the SDK keeps it on the device); ``route_with`` applies it to one step's loads.
``route_replicas`` (and ``prediction.routed_balancedness``, through ``cached_table``) keeps
the tables of the last ``CACHED_TABLES`` placements it was given, keyed by a digest of the
placement's bytes (and G, E): a job calls it step after step with the placement of one plan,
and builds that plan's table once; ``tile_table`` repeats a table over steps routed as layers. A table is immutable (its arrays are
read-only), so a cached one answers exactly as a new one would.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.balancing.validate import check_count, check_placement

__all__ = [
    "ITERATIONS",
    "MOMENTUM",
    "RoutingTable",
    "cached_table",
    "fractional_shares",
    "route_replicas",
    "route_with",
    "routed_gpu_loads",
    "routing_table",
    "tile_table",
]

ITERATIONS = 28  # water-filling rounds (the benchmark: within 1 % of the LP optimum)
MOMENTUM = 0.7  # share of the last change added before each round
FAR = 1e30  # load of the padding GPU: never below a water level, never filled
TINY = 1e-300  # divides an expert without tokens (its shares are all 0)
CACHED_TABLES = 8  # placements whose routing table ``route_replicas`` keeps


@dataclass(frozen=True, eq=False)
class RoutingTable:
    """What routing needs from a placement ``phy2log [L, N]`` (``N = G*S``, ``P`` distinct
    (layer, expert, GPU) pairs, ``H`` padded entries of replicated experts).

    - ``order [L*N]``: flat slots sorted by (layer, expert, GPU, slot);
    - ``pair_of_sorted [L*N]``: the pair of each sorted slot; ``group_end [L*N]`` bool: the
      sorted slot is the last of its expert;
    - ``pair_slots [P]``: slots of each pair; ``pair_gpu [P]``: ``layer*G + gpu``;
      ``pair_expert [P]``: ``layer*E + expert``; ``pair_index [P]``: the pair's entry in
      ``holders`` (-1: the expert has one holding GPU);
    - ``holders [H]``: ``layer*G + gpu`` of each holder of each replicated expert, in buckets
      ``(start, stop, width)`` of rows padded to ``width`` with the padding GPU ``L*G``;
      ``rep_expert [H]``: ``layer*E + expert`` of each entry; ``alpha [H]``: its step
      ``1 / m``; ``entry_row [H]``: the row (replicated expert) of each entry.
    """

    layers: int
    experts: int
    gpus: int
    slots: int
    order: np.ndarray
    pair_of_sorted: np.ndarray
    group_end: np.ndarray
    pair_slots: np.ndarray
    pair_gpu: np.ndarray
    pair_expert: np.ndarray
    pair_index: np.ndarray
    holders: np.ndarray
    rep_expert: np.ndarray
    alpha: np.ndarray
    entry_row: np.ndarray
    buckets: tuple[tuple[int, int, int], ...]


def routing_table(phy2log: np.ndarray, *, gpus: int, num_experts: int) -> RoutingTable:
    """The placement-only part of routing for ``phy2log [L, G*S]`` on ``gpus`` GPUs.

    Raises ValueError naming the argument on a bad shape, ids outside ``[0, num_experts)`` or
    an expert without a replica."""
    gpus = check_count("gpus", gpus)
    num_experts = check_count("num_experts", num_experts)
    arr = np.asarray(phy2log)
    if arr.ndim != 2:
        raise ValueError(f"phy2log must have shape [layers, gpus*slots], got shape {arr.shape}")
    num_layers, num_slots = arr.shape
    if num_slots % gpus:
        raise ValueError(f"phy2log has {num_slots} slots per layer, not a multiple of gpus = {gpus}")
    p2l = check_placement("phy2log", arr, num_layers, num_slots, num_experts)
    spg = num_slots // gpus
    layer = np.arange(num_layers, dtype=np.int64)[:, None]
    gpu = np.arange(num_slots, dtype=np.int64) // spg
    key = ((layer * num_experts + p2l) * gpus + gpu[None, :]).ravel()
    order = np.argsort(key, kind="stable")
    sk = key[order]
    first = np.r_[True, sk[1:] != sk[:-1]]
    pair_of_sorted = np.cumsum(first) - 1
    upair = sk[first]
    pair_slots = np.bincount(pair_of_sorted).astype(np.int64)
    pair_expert = upair // gpus
    pair_gpu = (pair_expert // num_experts) * gpus + upair % gpus
    holders_of = np.bincount(pair_expert, minlength=num_layers * num_experts)
    rep = holders_of[pair_expert] >= 2
    # replicated experts in buckets of equal padded width (2, 4, 8, ...): rows of a bucket
    # are padded to its width with the padding GPU ``L*G``; buckets lie end to end in flat
    # arrays (``holders``), widest last
    k = holders_of[pair_expert]
    width = np.where(rep, 1 << np.ceil(np.log2(np.maximum(k, 1))).astype(np.int64), 0)
    rep_pairs = np.flatnonzero(rep)
    bucket_order = rep_pairs[np.argsort(width[rep_pairs], kind="stable")]
    col = np.empty(upair.size, dtype=np.int64)
    index = np.arange(upair.size)
    firsts = np.maximum.accumulate(np.where(_starts(pair_expert), index, 0))  # ascending
    col[:] = index - firsts
    buckets = []
    pair_index = np.full(upair.size, -1, dtype=np.int64)
    pieces, offset = [], 0
    for wdt in _sorted_unique(width[bucket_order]):
        members = bucket_order[width[bucket_order] == wdt]
        mine = pair_expert[members]  # ascending: members ascend within a width
        first = _starts(mine)
        experts_b = mine[first]
        row = np.cumsum(first) - 1
        block = np.full((experts_b.size, int(wdt)), num_layers * gpus, dtype=np.int64)
        block[row, col[members]] = pair_gpu[members]
        pair_index[members] = offset + row * int(wdt) + col[members]
        buckets.append((offset, offset + block.size, int(wdt), experts_b))
        pieces.append(block.ravel())
        offset += block.size
    holders = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    rep_expert = (
        np.concatenate([np.repeat(b[3], b[2]) for b in buckets]) if buckets
        else np.zeros(0, dtype=np.int64)
    )
    # m: replicated experts sharing each GPU; a replicated expert steps 1 / max m
    real = holders < num_layers * gpus
    sharing = np.bincount(holders[real], minlength=num_layers * gpus + 1)
    sharing[-1] = 0
    m = np.ones(holders.size, dtype=np.int64)
    for lo, hi, wdt, _ in buckets:
        per_row = sharing[holders[lo:hi]].reshape(-1, wdt).max(axis=1)
        m[lo:hi] = np.repeat(np.maximum(per_row, 1), wdt)
    sexp = sk // gpus
    group_end = np.r_[sexp[1:] != sexp[:-1], True]
    return RoutingTable(
        layers=num_layers, experts=num_experts, gpus=gpus, slots=num_slots, order=order,
        pair_of_sorted=pair_of_sorted, pair_slots=pair_slots, pair_gpu=pair_gpu,
        pair_expert=pair_expert, pair_index=pair_index, holders=holders,
        rep_expert=rep_expert, alpha=1.0 / m, group_end=group_end,
        entry_row=_rows(buckets),
        buckets=tuple((lo, hi, wdt) for lo, hi, wdt, _ in buckets),
    )


def tile_table(table: RoutingTable, copies: int) -> RoutingTable:
    """The table of ``np.tile(phy2log, (copies, 1))`` (``copies x L`` layers: e.g. the steps
    of a window routed as layers of one call), from the table of ``phy2log`` by offsetting
    its indices: the same arrays ``routing_table`` builds from the tiled placement, without
    its sort. A replicated expert's bucket holds every copy's rows of it, copy after copy."""
    copies = check_count("copies", copies)
    if copies == 1:
        return table
    layers, gpus = table.layers, table.gpus
    lg = layers * gpus
    k = np.arange(copies, dtype=np.int64)[:, None]

    def tiled(a: np.ndarray, step: int) -> np.ndarray:
        return (a[None] + k * step).ravel()

    holders, rep_expert, pair_index = [], [], np.full(table.pair_index.size * copies, -1,
                                                      dtype=np.int64)
    buckets = []
    pair_index_of = table.pair_index
    for lo, hi, wdt in table.buckets:
        h = table.holders[lo:hi]
        holders.append(np.where(h[None] == lg, copies * lg, h[None] + k * lg).ravel())
        rep_expert.append(tiled(table.rep_expert[lo:hi], layers * table.experts))
        buckets.append((copies * lo, copies * hi, wdt, None))
        mine = np.flatnonzero((pair_index_of >= lo) & (pair_index_of < hi))
        where = (mine[None] + k * pair_index_of.size).ravel()
        pair_index[where] = (copies * lo + k * (hi - lo) + (pair_index_of[mine] - lo)).ravel()
    empty = np.zeros(0, dtype=np.int64)
    return RoutingTable(
        layers=copies * layers, experts=table.experts, gpus=gpus, slots=table.slots,
        order=tiled(table.order, layers * table.slots),
        pair_of_sorted=tiled(table.pair_of_sorted, table.pair_slots.size),
        group_end=np.tile(table.group_end, copies), pair_slots=np.tile(table.pair_slots, copies),
        pair_gpu=tiled(table.pair_gpu, lg), pair_expert=tiled(table.pair_expert, layers * table.experts),
        pair_index=pair_index, holders=np.concatenate(holders) if holders else empty,
        rep_expert=np.concatenate(rep_expert) if rep_expert else empty,
        alpha=np.concatenate([np.tile(table.alpha[lo:hi], copies) for lo, hi, _ in table.buckets])
        if table.buckets else np.zeros(0),
        entry_row=_rows(buckets), buckets=tuple(b[:3] for b in buckets),
    )


def _starts(x: np.ndarray) -> np.ndarray:
    """bool ``[n]``: where ascending ``x [n]`` takes a new value."""
    return np.r_[True, x[1:] != x[:-1]] if x.size else np.zeros(0, dtype=bool)


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of ascending ``x`` (``np.unique`` without its sort or hash)."""
    return x[_starts(x)]


def _rows(buckets) -> np.ndarray:
    """``[H]`` row (replicated expert) of each padded entry, numbered across buckets."""
    out, first = [], 0
    for lo, hi, wdt, _ in buckets:
        rows = (hi - lo) // wdt
        out.append(np.repeat(np.arange(first, first + rows), wdt))
        first += rows
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _check_loads(loads: object, table: RoutingTable) -> np.ndarray:
    arr = np.asarray(loads)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise ValueError(f"loads must be an integer array (tokens), got dtype {arr.dtype}")
    if arr.shape != (table.layers, table.experts):
        raise ValueError(
            f"loads must have shape [layers, experts] = [{table.layers}, {table.experts}] "
            f"(as phy2log), got {arr.shape}"
        )
    out = arr.astype(np.int64)
    if (out < 0).any():
        raise ValueError("loads must be non-negative")
    return out


def fractional_shares(table: RoutingTable, loads: np.ndarray, iterations: int = ITERATIONS):
    """Tokens of each (layer, expert, GPU) pair before rounding: float64 ``[P]``, for int64
    ``loads [L, E]`` (checked by the caller)."""
    w = loads.ravel().astype(np.float64)
    lg = table.layers * table.gpus
    single = table.pair_index < 0
    base = np.bincount(table.pair_gpu[single], weights=w[table.pair_expert[single]],
                       minlength=lg + 1).astype(np.float64)  # int64 when no weights
    base[lg] = FAR
    holders, alpha = table.holders, table.alpha
    pad = holders == lg
    wr = w[table.rep_expert]
    real = np.bincount(table.rep_expert[~pad], minlength=w.size)
    x = np.where(pad, 0.0, wr / np.maximum(real[table.rep_expert], 1))
    start = prev = x
    target = np.empty_like(x)
    row = table.entry_row
    for _ in range(iterations):
        v = np.maximum(x + MOMENTUM * (x - prev), 0.0)
        total = np.bincount(row, weights=v)[row]  # >= the expert's tokens when they are > 0
        v = v * (wr / np.maximum(total, TINY))
        load = base + np.bincount(holders, weights=v, minlength=lg + 1)
        others = load[holders] - v  # load of the other experts on each holder
        for lo, hi, wdt in table.buckets:
            o = others[lo:hi].reshape(-1, wdt)
            tokens = wr[lo:hi:wdt]
            # water level = min over the prefixes of the holders sorted by load of
            # (tokens + the prefix's load) / its size
            if wdt == 2:
                a, b = o[:, 0], o[:, 1]
                low = np.minimum(a, b)
                top = np.minimum(tokens + low, 0.5 * (tokens + a + b))
            else:
                tri, size = _prefix_sums(wdt)
                top = ((tokens[:, None] + np.sort(o, axis=1) @ tri) / size).min(axis=1)
            target[lo:hi] = np.maximum(top[:, None] - o, 0.0).ravel()
        prev, x = x, v + alpha * (target - v)
    x = _better_of(table, base, start, x)
    shares = w[table.pair_expert]
    rep = ~single
    shares[rep] = x[table.pair_index[rep]]
    return shares


def _better_of(table: RoutingTable, base: np.ndarray, a: np.ndarray, b: np.ndarray):
    """Per layer, the division ``a`` or ``b`` (``[H]``) with the lower max GPU load."""
    lg = table.layers * table.gpus
    peaks = [
        (base + np.bincount(table.holders, weights=v, minlength=lg + 1))[:lg]
        .reshape(table.layers, table.gpus).max(axis=1)
        for v in (a, b)
    ]
    keep_b = peaks[1] <= peaks[0]
    return np.where(keep_b[table.rep_expert // table.experts], b, a)


@functools.lru_cache(maxsize=32)
def _prefix_sums(width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(triu(ones [width, width]), [1 .. width])``: ``v @ first`` sums each prefix of a
    row ``v``; the second is each prefix's size."""
    return np.triu(np.ones((width, width))), np.arange(1, width + 1, dtype=np.float64)


def route_with(
    table: RoutingTable, loads: np.ndarray, *, iterations: int = ITERATIONS
) -> np.ndarray:
    """``route_replicas`` with a prepared ``table``: ``loads [L, E]`` int -> int64
    ``slot_tokens [L, G*S]``."""
    w = _check_loads(loads, table)
    iterations = check_count("iterations", iterations, minimum=0)
    shares = fractional_shares(table, w, iterations)
    per_slot = shares[table.pair_of_sorted] / table.pair_slots[table.pair_of_sorted]
    return _round_slots(table, w, per_slot)


def _round_slots(table: RoutingTable, w: np.ndarray, per_slot: np.ndarray) -> np.ndarray:
    """Cumulative rounding of ``per_slot [L*N]`` (sorted order) within each expert's slots."""
    n = per_slot.size
    cum = np.cumsum(per_slot.reshape(table.layers, table.slots), axis=1).ravel()
    start = np.r_[True, table.group_end[:-1]]  # groups never cross a layer's row
    first = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    before = np.where(first % table.slots == 0, 0.0, cum[first - 1])
    ints = np.floor(cum - before + 0.5).astype(np.int64)
    ends = table.group_end
    ints[ends] = w.ravel()[table.pair_expert[table.pair_of_sorted[ends]]]
    tokens_sorted = ints - np.where(start, 0, np.r_[0, ints[:-1]])
    out = np.empty(table.layers * table.slots, dtype=np.int64)
    out[table.order] = tokens_sorted
    return out.reshape(table.layers, table.slots)


def route_replicas(
    loads: np.ndarray, phy2log: np.ndarray, *, gpus: int, iterations: int = ITERATIONS
) -> np.ndarray:
    """Divide one step's tokens of each logical expert among its replicas, the most loaded
    GPU as light as possible: ``loads [L, E]`` int64 (tokens), ``phy2log [L, G*S]`` int64 ->
    ``slot_tokens [L, G*S]`` int64, summing over each expert's slots exactly to
    ``loads[l, e]``. Pure and deterministic. Raises ValueError naming the argument on a bad
    shape, dtype or id."""
    arr = np.asarray(loads)
    if arr.ndim != 2:
        raise ValueError(f"loads must have shape [layers, experts], got shape {arr.shape}")
    p2l = np.asarray(phy2log)
    if p2l.ndim != 2 or p2l.shape[0] != arr.shape[0]:
        raise ValueError(
            f"phy2log must have shape [layers, gpus*slots] with {arr.shape[0]} layers "
            f"(as loads), got shape {p2l.shape}"
        )
    table = cached_table(p2l, gpus, arr.shape[1])
    return route_with(table, arr, iterations=iterations)


class _TableCache:
    """The routing tables of the last ``size`` placements, keyed by (G, E, shape, dtype,
    blake2b of the bytes). Thread-safe; a table is built outside the lock."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple, RoutingTable] = OrderedDict()

    def get(self, p2l: np.ndarray, gpus: int, num_experts: int) -> RoutingTable:
        data = np.ascontiguousarray(p2l)
        key = (gpus, num_experts, data.shape, data.dtype.str,
               hashlib.blake2b(data.view(np.uint8), digest_size=16).digest())
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                return table
        table = routing_table(data, gpus=gpus, num_experts=num_experts)
        for value in vars(table).values():
            if isinstance(value, np.ndarray):
                value.setflags(write=False)
        with self._lock:
            self._tables[key] = table
            while len(self._tables) > self.size:
                self._tables.popitem(last=False)
        return table


_TABLES = _TableCache(CACHED_TABLES)


def cached_table(p2l: np.ndarray, gpus: int, num_experts: int) -> RoutingTable:
    """``routing_table(p2l, gpus=gpus, num_experts=num_experts)``, built once per placement
    among the last ``CACHED_TABLES``; raises as it does."""
    return _TABLES.get(p2l, gpus, num_experts)


def routed_gpu_loads(slot_tokens: np.ndarray, gpus: int) -> np.ndarray:
    """Tokens per GPU: ``slot_tokens [L, G*S]`` -> int64 ``[L, G]``."""
    st = np.asarray(slot_tokens)
    return st.reshape(st.shape[0], gpus, -1).sum(axis=2)
