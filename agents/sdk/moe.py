"""An expert-parallel Mixture-of-Experts block for torch.distributed (gloo, NCCL, HCCL).

Placement
    Every rank of the expert-parallel group holds ``S`` physical expert slots; the layer's row
    ``phy2log[G*S]`` names the logical expert in each slot (rank ``g`` owns slots
    ``g*S .. (g+1)*S-1``). A logical expert may sit in several slots (replicas); replicas hold
    identical weights. By default (``routing=True``) each step's tokens of a replicated expert
    are divided among its replicas from that step's global counts so that the most loaded rank
    is as light as possible (:mod:`moeplane.agents.sdk.routing`: every rank all-gathers the
    layer's ``[G, E]`` counts and derives the same division, local-first). With
    ``routing=False`` they are split evenly, deterministically (the j-th token-assignment to
    the expert, in token order, goes to replica ``j mod replicas``). Either way the math is
    the same: replicas hold identical weights.

Classes
    :class:`ExpertSlots` holds a layer's placement, the dispatch and the replica gradient
    reduction; :class:`ExpertParallelMoE` adds moeplane's own router and SwiGLU experts; the
    Hugging Face wrapper (:mod:`moeplane.agents.sdk.hf_ep`) adds a transformers model's experts.

Forward, for ``x[..., d_model]`` flattened to ``T`` tokens
    router (a replicated ``Linear``) -> softmax -> top-k logical experts and gates (renormalised)
    -> :meth:`ExpertSlots.dispatch`: physical slot per assignment -> one ``all_to_all_single`` of per-slot counts (``[G*S]``
    int64) -> ``all_to_all`` of the token rows -> each slot's SwiGLU FFN on its rows ->
    ``all_to_all`` back -> gate-weighted sum over the k choices. Gradients flow through both
    all-to-alls (:func:`moeplane.agents.sdk.comm.all_to_all`).

Gradients
    After ``loss.backward()`` call :func:`sync_gradients` (instead of DDP): dense parameters are
    averaged over the ranks, and each logical expert's gradient is summed over its replicas (in a
    fixed order, so every replica gets bit-identical gradients and stays identical under the
    optimizer) and divided by the world size. The loss each rank backpropagates is its own mean;
    the optimised objective is the mean over ranks. Placement is invisible to the math.

Adopting it in an existing model
    1. Build the process group (``torch.distributed.init_process_group``), pick ``S`` with
       ``G*S >= E`` and an initial placement, e.g. ``phy2log = np.arange(G*S) % E`` per layer.
    2. Replace the model's MoE/FFN layer ``l`` by
       ``ExpertParallelMoE(d_model, d_ff, E, top_k, phy2log[l], slots_per_rank=S, layer=l)``;
       it maps ``[..., d_model] -> [..., d_model]``. Every rank must call every block's forward
       and backward the same number of times (the all-to-alls are collectives).
    3. Seed dense parameters identically on all ranks (``torch.manual_seed``) and call
       ``block.init_experts(seed)`` so that each logical expert has the same weights wherever
       it is placed.
    4. Train with ``loss.backward(); sync_gradients(model); optimizer.step()``. Do not wrap the
       model in DDP (expert parameters differ between ranks).
    5. Optionally: :func:`attach_counter` for per-step load counts (:mod:`moeplane.agents.sdk.reporter`)
       and :class:`moeplane.agents.sdk.applier.PlanApplier` for live rebalancing.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from moeplane.agents.sdk.comm import all_to_all, exchange
from moeplane.agents.sdk.placement import PlacementError, replica_table
from moeplane.agents.sdk.routing import DeviceRouting


class ExpertSlots(nn.Module):
    """The physical expert slots of one MoE layer, spread over the ranks of ``group``.

    Holds the placement (``phy2log_row``, replica tables), dispatches routed token-assignments
    to their slots with the all-to-alls (:meth:`dispatch`) and reduces expert gradients over
    replicas (:meth:`reduce_expert_grads`). A subclass owns the per-slot parameters
    (:meth:`expert_parameters`, each with leading dimension S) and computes the slots' FFN
    (:meth:`slot_forward`); the router is the subclass's (or the wrapped model's) own.

    Args:
        num_experts: logical experts E.
        phy2log_row: ``[G*S]`` logical expert in each physical slot of this layer.
        slots_per_rank: S.
        layer: index of this MoE layer (row of the job's ``phy2log[L, G*S]``).
        group: expert-parallel process group (default: the world).
        routing: divide each step's tokens among replicas by load (default) or evenly.
        ranks_per_node: ranks per node for local-first routing (default: the
            ``LOCAL_WORLD_SIZE`` environment variable if it divides the group, else the group).

    ``step_counts [E]`` int64 accumulates the tokens routed to each logical expert (all
    forwards since the last reset; see :func:`attach_counter`). ``last_received`` is the number
    of token-assignments this rank's slots processed in the latest forward.
    """

    def __init__(self, num_experts: int, phy2log_row, *, slots_per_rank: int, layer: int = 0,
                 group=None, routing: bool = True, ranks_per_node: int | None = None):
        super().__init__()
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.num_experts = num_experts
        self.slots_per_rank, self.layer = slots_per_rank, layer
        self.register_buffer("step_counts", torch.zeros(num_experts, dtype=torch.int64), False)
        self.last_received = 0
        self.routing = bool(routing)
        self.ranks_per_node = _ranks_per_node(ranks_per_node, self.world_size)
        self._routing: DeviceRouting | None = None
        self.set_placement(phy2log_row)

    def expert_parameters(self) -> list[nn.Parameter]:
        """The per-slot parameters, each with leading dimension S."""
        raise NotImplementedError

    def slot_forward(
        self, x: torch.Tensor, local_slot: torch.Tensor, per_slot: list[int]
    ) -> torch.Tensor:
        """Each received row through its slot's FFN, without gating.

        Args:
            x: ``[N, d_model]`` rows received by this rank.
            local_slot: ``[N]`` int64 local slot (``0..S-1``) of each row.
            per_slot: ``[S]`` rows per local slot (host ints, ``sum == N``).

        Returns:
            ``[N, d_model]`` in the order of ``x``.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ placement

    @property
    def phy2log_row(self) -> np.ndarray:
        """``[G*S]`` int64 copy of the running placement of this layer."""
        return self._row.copy()

    def set_placement(self, phy2log_row) -> None:
        """Adopt a placement row; does not touch weights (the applier moves those)."""
        row = np.asarray(phy2log_row, dtype=np.int64).reshape(-1)
        if row.size != self.world_size * self.slots_per_rank:
            raise PlacementError(
                "phy2log_row", f"{row.size} slots, model has {self.world_size}x{self.slots_per_rank}"
            )
        if row.min() < 0 or row.max() >= self.num_experts:
            raise PlacementError("phy2log_row", f"ids outside [0, {self.num_experts})")
        slots, count = replica_table(row, self.num_experts)
        if (count == 0).any():
            raise PlacementError("phy2log_row", f"experts {np.flatnonzero(count == 0)} unplaced")
        device = self.step_counts.device
        self._row = row
        self._replica_slots = torch.as_tensor(slots, device=device)
        self._replica_count = torch.as_tensor(count, device=device)
        self._routing = None  # rebuilt for the new row on the next forward

    def local_experts(self) -> np.ndarray:
        """``[S]`` logical expert of each local slot."""
        s = self.slots_per_rank
        return self._row[self.rank * s : (self.rank + 1) * s]

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Run routed token-assignments on their slots, wherever they are; gate and sum.

        Args:
            x: ``[T, d_model]`` this rank's tokens.
            idx: ``[T, k]`` int64 logical expert of each of the token's k choices.
            gate: ``[T, k]`` routing weight of each choice.

        Returns:
            ``[T, d_model]``: the sum over the k choices of gate times the expert's output.
        """
        tokens, k = idx.shape
        g, s = self.world_size, self.slots_per_rank
        if self._replica_slots.device != x.device:
            self._replica_slots = self._replica_slots.to(x.device)
            self._replica_count = self._replica_count.to(x.device)
        expert = idx.reshape(-1)  # [A] logical expert of each assignment, A = T*k
        counts = torch.bincount(expert, minlength=self.num_experts)
        with torch.no_grad():
            self.step_counts += counts
        if self.routing:
            slot = self._routed_slots(expert, counts)  # [A] global slot
        else:
            slot = self._assign_slots(expert, counts)
        send_order = torch.argsort(slot, stable=True)
        slot_counts = torch.bincount(slot, minlength=g * s)
        recv_slot_counts = torch.empty_like(slot_counts)
        dist.all_to_all_single(recv_slot_counts, slot_counts, group=self.group)
        host = torch.cat([slot_counts, recv_slot_counts]).tolist()
        sent, recv = host[: g * s], host[g * s :]
        send_splits = [sum(sent[r * s : (r + 1) * s]) for r in range(g)]
        recv_splits = [sum(recv[r * s : (r + 1) * s]) for r in range(g)]
        per_slot = [sum(recv[r * s + j] for r in range(g)) for j in range(s)]
        self.last_received = sum(recv_splits)

        x_recv = all_to_all(x[send_order // k], recv_splits, send_splits, self.group)
        local_slot = torch.arange(s, device=x.device).repeat(g)
        local_slot = torch.repeat_interleave(
            local_slot, recv_slot_counts, output_size=sum(recv_splits)
        )
        y_recv = self.slot_forward(x_recv, local_slot, per_slot)
        y_back = all_to_all(y_recv, send_splits, recv_splits, self.group)
        y = y_back[_inverse(send_order)].view(tokens, k, x.shape[-1])
        return (y * gate.unsqueeze(-1).to(y.dtype)).sum(dim=1)

    def _routed_slots(self, expert: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Global slot of each assignment, by per-step replica routing (local-first)."""
        if self._routing is None or self._routing.order.device != counts.device:
            self._routing = DeviceRouting(
                self._row, gpus=self.world_size, num_experts=self.num_experts,
                ranks_per_node=self.ranks_per_node, device=counts.device,
            )
        gathered = counts.new_empty(self.world_size * self.num_experts)
        dist.all_gather_into_tensor(gathered, counts, group=self.group)
        gathered = gathered.view(self.world_size, self.num_experts)
        quotas = self._routing.quotas(gathered.sum(dim=0))
        split = self._routing.sender_split(gathered, quotas, self.rank)
        return self._routing.assign(expert, counts, split)

    def _assign_slots(self, expert: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Global slot of each assignment: round-robin over the expert's replicas."""
        order = torch.argsort(expert, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        position = torch.empty_like(expert)
        position[order] = torch.arange(expert.numel(), device=expert.device) - starts[expert[order]]
        replica = position % self._replica_count[expert]
        return self._replica_slots[expert, replica]

    # ------------------------------------------------------------------ gradients

    @torch.no_grad()
    def reduce_expert_grads(self, scale: float = 1.0) -> None:
        """Sum each logical expert's gradient over all its replicas, times ``scale``.

        Local partial sums (slots in ascending order) are exchanged point-to-point among the
        ranks that hold the expert and added in ascending rank order, so every replica ends
        with a bit-identical gradient.
        """
        params = self.expert_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        s = self.slots_per_rank
        flat = torch.cat([p.grad.reshape(s, -1) for p in params], dim=1)  # [S, n]
        mine = self.local_experts()
        held = sorted(set(mine.tolist()))
        partial = {e: flat[np.flatnonzero(mine == e)].sum(dim=0) for e in held}
        holders = {e: sorted({int(q) // s for q in np.flatnonzero(self._row == e)}) for e in held}
        shared: dict[int, list[int]] = {}
        for e in held:
            for r in holders[e]:
                if r != self.rank:
                    shared.setdefault(r, []).append(e)
        n = flat.shape[1]
        received = exchange(
            {r: torch.cat([partial[e] for e in es]) for r, es in shared.items()},
            {r: len(es) * n for r, es in shared.items()},
            dtype=flat.dtype,
            device=flat.device,
            group=self.group,
        )
        from_peer = {
            (r, e): buf[i * n : (i + 1) * n]
            for r, buf in received.items()
            for i, e in enumerate(shared[r])
        }
        total = torch.empty_like(flat)
        for e in held:
            acc = None
            for r in holders[e]:
                part = partial[e] if r == self.rank else from_peer[(r, e)]
                acc = part.clone() if acc is None else acc + part
            total[torch.as_tensor(np.flatnonzero(mine == e), device=flat.device)] = acc * scale
        offset = 0
        for p in params:
            width = p[0].numel()
            p.grad.copy_(total[:, offset : offset + width].reshape(p.shape))
            offset += width


class ExpertParallelMoE(ExpertSlots):
    """One MoE layer: a softmax top-k router and SwiGLU experts in slots spread over the ranks.

    Args:
        d_model: model width.
        d_ff: hidden width of each expert's SwiGLU FFN.
        num_experts: logical experts E.
        top_k: experts per token.
        phy2log_row: ``[G*S]`` logical expert in each physical slot of this layer.
        slots_per_rank: S.
        layer: index of this MoE layer (row of the job's ``phy2log[L, G*S]``).
        group: expert-parallel process group (default: the world).
        routing, ranks_per_node: per-step replica routing, as :class:`ExpertSlots`.

    Parameters ``w1, w3 [S, d_model, d_ff]`` and ``w2 [S, d_ff, d_model]`` hold this rank's slots.
    Placement, dispatch and gradient reduction: :class:`ExpertSlots`.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int,
        phy2log_row,
        *,
        slots_per_rank: int,
        layer: int = 0,
        group=None,
        routing: bool = True,
        ranks_per_node: int | None = None,
    ):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: {top_k} not in [1, {num_experts}]")
        super().__init__(
            num_experts, phy2log_row, slots_per_rank=slots_per_rank, layer=layer, group=group,
            routing=routing, ranks_per_node=ranks_per_node,
        )
        self.d_model, self.d_ff = d_model, d_ff
        self.top_k = top_k
        self.router = nn.Linear(d_model, num_experts, bias=False)
        slots = slots_per_rank
        self.w1 = nn.Parameter(torch.empty(slots, d_model, d_ff))
        self.w3 = nn.Parameter(torch.empty(slots, d_model, d_ff))
        self.w2 = nn.Parameter(torch.empty(slots, d_ff, d_model))

    def expert_parameters(self) -> list[nn.Parameter]:
        """The per-slot parameters, each with leading dimension S."""
        return [self.w1, self.w3, self.w2]

    @torch.no_grad()
    def init_experts(self, seed: int) -> None:
        """Initialise every local slot from its logical expert's own seed (placement-free)."""
        for slot, expert in enumerate(self.local_experts().tolist()):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + self.layer * 10_007 + expert)
            for p in self.expert_parameters():
                fan_in = p.shape[1]
                w = torch.randn(p.shape[1:], generator=gen) / math.sqrt(fan_in)
                p[slot].copy_(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.d_model)
        probs = torch.softmax(self.router(x).float(), dim=-1)
        gate, idx = probs.topk(self.top_k, dim=-1)
        gate = (gate / gate.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.dispatch(x, idx, gate).reshape(shape)

    def slot_forward(
        self, x: torch.Tensor, local_slot: torch.Tensor, per_slot: list[int]
    ) -> torch.Tensor:
        by_slot = torch.argsort(local_slot, stable=True)
        chunks = x[by_slot].split(per_slot)
        y_sorted = torch.cat([self._ffn(chunk, j) for j, chunk in enumerate(chunks)])
        return y_sorted[_inverse(by_slot)]

    def _ffn(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        return (F.silu(x @ self.w1[slot]) * (x @ self.w3[slot])) @ self.w2[slot]


def _ranks_per_node(value: int | None, world: int) -> int:
    if value is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        return local if local >= 1 and world % local == 0 else world
    if value < 1 or world % value:
        raise ValueError(f"ranks_per_node: {value} does not divide the {world} ranks")
    return value


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


def moe_blocks(model: nn.Module) -> list[ExpertSlots]:
    """The model's MoE blocks (any :class:`ExpertSlots`), ordered by their ``layer`` index."""
    return sorted(
        (m for m in model.modules() if isinstance(m, ExpertSlots)), key=lambda b: b.layer
    )


def attach_counter(blocks: list[ExpertSlots]) -> torch.Tensor:
    """One ``[L, E]`` int64 buffer whose rows are the blocks' ``step_counts`` (views).

    Reading it once per step (and zeroing it) yields the per-layer loads without a stack.
    """
    if not blocks:
        raise ValueError("blocks: no MoE blocks")
    counter = torch.zeros(
        len(blocks), blocks[0].num_experts, dtype=torch.int64, device=blocks[0].step_counts.device
    )
    for i, block in enumerate(blocks):
        block.step_counts = counter[i]
    return counter


@torch.no_grad()
def sync_gradients(model: nn.Module, group=None) -> None:
    """Average dense gradients over the ranks and reduce expert gradients over replicas.

    Call on every rank after ``loss.backward()`` and before ``optimizer.step()``. Missing
    gradients are materialised as zeros so every rank's optimizer steps every parameter.
    """
    world = dist.get_world_size(group)
    blocks = moe_blocks(model)
    expert_ids = {id(p) for b in blocks for p in b.expert_parameters()}
    dense = [p for p in model.parameters() if p.requires_grad and id(p) not in expert_ids]
    for p in dense:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if dense:
        flat = torch.cat([p.grad.reshape(-1) for p in dense])
        dist.all_reduce(flat, group=group)
        flat /= world
        offset = 0
        for p in dense:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    for block in blocks:
        block.reduce_expert_grads(scale=1.0 / world)
