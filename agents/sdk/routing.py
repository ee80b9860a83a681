"""Per-step replica routing on the device, for :class:`moeplane.agents.sdk.moe.ExpertParallelMoE`.

:class:`DeviceRouting` holds one layer's routing table (``moeplane.controlplane.balancing.routing``)
as torch tensors and, each forward:

1. ``quotas(counts)``: from the layer's global ``[E]`` counts (the sum of the all-gathered
   ``[G, E]`` counts), the tokens each physical slot receives, ``[G*S]`` int64: the division of
   ``route_replicas`` (damped water-filling, cumulative rounding), computed with torch ops.
   Every rank computes it from the same counts with the same ops, so every rank gets the same
   quotas. Loads are summed with a dense one-hot product, not scattered adds, so the order of
   additions (and the result) does not depend on the device's atomics.
2. ``sender_split(gathered, quotas, rank)``: how many of this rank's tokens of each expert go
   to each slot, ``[G*S]`` int64, local-first (ties go to the sender's node): each sender's
   tokens of an expert fill that expert's slots on its own rank first, then on its node, then
   anywhere. Within a stage, senders in rank order take consecutive ranges of the remaining
   quotas in slot order, so the split is exact and the same on every rank.
3. ``assign(expert, counts, split)``: the global slot of each of this rank's token-assignments:
   the j-th assignment to expert ``e`` (in token order) goes to the slot whose share of the
   rank's tokens of ``e`` covers position j.

Replicas hold identical weights, so which replica computes a token changes no result; the
division only changes which rank works on it.
"""

from __future__ import annotations

import numpy as np
import torch

from moeplane.controlplane.balancing.routing import (
    FAR,
    ITERATIONS,
    MOMENTUM,
    TINY,
    routing_table,
)

__all__ = ["DeviceRouting"]


class DeviceRouting:
    """One layer's routing, on ``device``.

    Args:
        row: ``[G*S]`` logical expert of each physical slot.
        gpus: G (ranks of the expert-parallel group).
        num_experts: E.
        ranks_per_node: ranks on one node (G must be a multiple); ranks ``n*R .. (n+1)*R-1``
            form node ``n``.
        iterations: water-filling rounds (as ``route_replicas``).
    """

    def __init__(self, row, *, gpus: int, num_experts: int, ranks_per_node: int,
                 device=None, iterations: int = ITERATIONS):
        if ranks_per_node < 1 or gpus % ranks_per_node:
            raise ValueError(f"ranks_per_node: {ranks_per_node} does not divide {gpus} ranks")
        row = np.asarray(row, dtype=np.int64).reshape(1, -1)
        t = routing_table(row, gpus=gpus, num_experts=num_experts)
        self.gpus, self.experts, self.slots = gpus, num_experts, row.shape[1]
        self.iterations = iterations
        self.buckets = t.buckets
        single = t.pair_index < 0

        def dev(a, dtype=torch.int64):
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

        eye = np.eye(gpus + 1)
        self.single_expert = dev(t.pair_expert[single])
        self.single_onehot = dev(eye[t.pair_gpu[single]], torch.float64)  # [P1, G+1]
        self.holders = dev(t.holders)
        self.holders_onehot = dev(eye[t.holders], torch.float64)  # [H, G+1]
        self.pad = dev(t.holders == gpus, torch.bool)
        self.rep_expert = dev(t.rep_expert)
        self.alpha = dev(t.alpha, torch.float64)
        self.entry_row = dev(t.entry_row)
        rows = int(t.entry_row.max()) + 1 if t.entry_row.size else 0
        self.row_onehot = dev(np.eye(rows)[t.entry_row], torch.float64)  # [H, rows]
        real = np.bincount(t.rep_expert[t.holders < gpus], minlength=num_experts)
        self.rep_holders = dev(np.maximum(real[t.rep_expert], 1), torch.float64)
        self.layer_of_entry = dev(t.rep_expert // num_experts)
        self.pair_expert = dev(t.pair_expert)
        self.rep_pairs = dev(np.flatnonzero(~single))
        self.rep_index = dev(t.pair_index[~single])
        self.order = dev(t.order)
        self.pair_of_sorted = dev(t.pair_of_sorted)
        self.pair_slots = dev(t.pair_slots, torch.float64)
        self.group_end = dev(t.group_end, torch.bool)
        self.group_start = dev(np.r_[True, t.group_end[:-1]], torch.bool)
        self.sorted_expert = dev(t.pair_expert[t.pair_of_sorted])
        self.prefix = {
            w: (dev(np.triu(np.ones((w, w))), torch.float64),
                dev(np.arange(1, w + 1), torch.float64))
            for _, _, w in t.buckets if w > 2
        }
        # local-first split: sorted slots (expert, rank, slot); their rank and node
        spg = self.slots // gpus
        sorted_rank = t.order // spg
        node = sorted_rank // ranks_per_node
        self.sorted_rank = dev(sorted_rank)
        e = t.pair_expert[t.pair_of_sorted]
        self.pair_group = dev(_group_starts(e * gpus + sorted_rank))
        self.node_group = dev(_group_starts(e * gpus + node))
        self.expert_group = dev(_group_starts(e))
        self.node_id = dev(node * num_experts + e)
        self.rank_node = dev(np.arange(gpus) // ranks_per_node)
        self.ranks_per_node = ranks_per_node

    # ------------------------------------------------------------------ quotas

    @torch.no_grad()
    def quotas(self, counts: torch.Tensor) -> torch.Tensor:
        """Tokens each slot receives: ``counts [E]`` int64 (global) -> ``[G*S]`` int64."""
        w = counts.to(torch.float64)
        g = self.gpus
        base = w[self.single_expert] @ self.single_onehot
        base[g] = FAR
        wr = w[self.rep_expert]
        x = torch.where(self.pad, 0.0, wr / self.rep_holders)
        start = prev = x
        target = torch.empty_like(x)
        for _ in range(self.iterations):
            v = torch.clamp(x + MOMENTUM * (x - prev), min=0.0)
            total = (v @ self.row_onehot)[self.entry_row]
            v = v * (wr / torch.clamp(total, min=TINY))
            load = base + v @ self.holders_onehot
            others = load[self.holders] - v
            for lo, hi, wdt in self.buckets:
                o = others[lo:hi].view(-1, wdt)
                tokens = wr[lo:hi:wdt]
                if wdt == 2:
                    a, b = o[:, 0], o[:, 1]
                    top = torch.minimum(tokens + torch.minimum(a, b), 0.5 * (tokens + a + b))
                else:
                    tri, size = self.prefix[wdt]
                    low = torch.sort(o, dim=1).values
                    top = ((tokens[:, None] + low @ tri) / size).min(dim=1).values
                target[lo:hi] = torch.clamp(top[:, None] - o, min=0.0).reshape(-1)
            prev, x = x, v + self.alpha * (target - v)
        peak_start = (base + start @ self.holders_onehot)[:g].max()
        peak_end = (base + x @ self.holders_onehot)[:g].max()
        x = torch.where(peak_end <= peak_start, x, start)
        shares = w[self.pair_expert]
        shares[self.rep_pairs] = x[self.rep_index]
        per_slot = shares[self.pair_of_sorted] / self.pair_slots[self.pair_of_sorted]
        cum = torch.cumsum(per_slot, 0)
        n = cum.numel()
        idx = torch.arange(n, device=cum.device)
        first = torch.cummax(torch.where(self.group_start, idx, 0), 0).values
        before = torch.where(first == 0, 0.0, cum[(first - 1).clamp(min=0)])
        ints = torch.floor(cum - before + 0.5).to(torch.int64)
        ints = torch.where(self.group_end, counts[self.sorted_expert], ints)
        prev = torch.cat([ints.new_zeros(1), ints[:-1]])
        out = torch.empty_like(ints)
        out[self.order] = ints - torch.where(self.group_start, 0, prev)
        return out

    # ------------------------------------------------------------------ senders

    @torch.no_grad()
    def sender_split(self, gathered: torch.Tensor, quotas: torch.Tensor, rank: int):
        """This rank's tokens per slot: ``gathered [G, E]`` int64 (every rank's counts),
        ``quotas [G*S]`` -> ``[G*S]`` int64, local-first (own rank, own node, anywhere)."""
        order, e, r = self.order, self.sorted_expert, self.sorted_rank
        rpn, experts = self.ranks_per_node, self.experts
        q = quotas[order]  # remaining quota of each slot, sorted (expert, rank, slot)
        c = gathered.clone()  # remaining tokens of each sender and expert
        # stage 1, own rank: a slot takes from its own rank's tokens of its expert
        take = torch.clamp(torch.minimum(c[r, e] - _exclusive(q, self.pair_group), q), min=0)
        mine = torch.where(r == rank, take, 0)
        q = q - take
        c.view(-1).index_add_(0, r * experts + e, -take)
        # stage 2, own node: the node's senders (rank order) take consecutive ranges of its
        # slots' remaining quota (slot order)
        qstart = _exclusive(q, self.node_group)
        v = c.view(-1, rpn, experts)
        cstart = (torch.cumsum(v, 1) - v).reshape(c.shape)
        lo = cstart[rank, e]
        part = _overlap(lo, lo + c[rank, e], qstart, qstart + q)
        mine += torch.where(self.rank_node[r] == rank // rpn, part, 0)
        ctot = v.sum(dim=1)  # [nodes, E]
        qtot = torch.zeros_like(ctot).view(-1).index_add_(0, self.node_id, q).view_as(ctot)
        q = q - torch.clamp(torch.minimum(ctot[self.rank_node[r], e] - qstart, q), min=0)
        c = c - torch.clamp(torch.minimum(qtot[self.rank_node] - cstart, c), min=0)
        # stage 3, anywhere: every sender (rank order) over every slot (slot order)
        qstart = _exclusive(q, self.expert_group)
        lo = (torch.cumsum(c, 0) - c)[rank, e]
        mine += _overlap(lo, lo + c[rank, e], qstart, qstart + q)
        out = torch.empty_like(mine)
        out[order] = mine
        return out

    # ------------------------------------------------------------------ assignment

    def assign(self, expert: torch.Tensor, counts: torch.Tensor, split: torch.Tensor):
        """Global slot of each assignment: ``expert [A]`` logical expert of each of this
        rank's token-assignments, ``counts [E]`` this rank's counts, ``split [G*S]`` its
        tokens per slot (``sender_split``) -> ``[A]`` int64."""
        order = torch.argsort(expert, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        position = torch.empty_like(expert)
        position[order] = torch.arange(expert.numel(), device=expert.device) - starts[
            expert[order]]
        ends = torch.cumsum(split[self.order], 0)
        idx = torch.searchsorted(ends, starts[expert] + position, right=True)
        return self.order[idx]


def _group_starts(keys: np.ndarray) -> np.ndarray:
    """``[n]`` index of the first element of each element's run of equal ``keys``."""
    start = np.r_[True, keys[1:] != keys[:-1]]
    return np.maximum.accumulate(np.where(start, np.arange(keys.size), 0))


def _exclusive(values: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums of ``values`` within runs starting at ``first`` (both ``[n]``)."""
    cum = torch.cumsum(values, 0)
    before = torch.where(first == 0, 0, cum[(first - 1).clamp(min=0)])
    return cum - values - before


def _overlap(a_lo, a_hi, b_lo, b_hi):
    return torch.clamp(torch.minimum(a_hi, b_hi) - torch.maximum(a_lo, b_lo), min=0)
