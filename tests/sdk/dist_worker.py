"""One rank of the 4-process gloo scenario used by test_distributed.py.

Run as ``python -m tests.sdk.dist_worker OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Trains a tiny MoE model twice from the same seed:

- run "static": the initial placement throughout, replica routing off (tokens of a replicated
  expert split evenly); the per-rank tokens of step 6 measured;
- run "moved" (replica routing on, the default): bad plans submitted (rejected), then a good
  plan that moves experts between ranks and changes replica counts (rank 0 receives it a step before the others), then two
  conflicting plans under one epoch (fail everywhere), then a rebalancing plan computed from the
  measured loads, checked against the measured per-rank tokens on the same batch.

Writes ``OUT_DIR/rank{r}.pt`` with losses, final expert weights per logical expert, reports.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from moeplane.agents.sdk.applier import PlanApplier
from moeplane.agents.sdk.moe import ExpertParallelMoE, attach_counter, moe_blocks, sync_gradients
from moeplane.controlplane.balancing import plan_placement
from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array

LAYERS, EXPERTS, TOP_K, SLOTS, VOCAB, D, FF = 2, 8, 2, 3, 64, 16, 32
STEPS, BATCH, SEQ = 9, 4, 16
SEED = 1234


class TinyLM(nn.Module):
    def __init__(self, phy2log: np.ndarray, routing: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
        self.moe = nn.ModuleList(
            ExpertParallelMoE(
                D, FF, EXPERTS, TOP_K, phy2log[i], slots_per_rank=SLOTS, layer=i, routing=routing
            )
            for i in range(LAYERS)
        )
        self.head = nn.Linear(D, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for norm, moe in zip(self.norms, self.moe, strict=True):
            h = h + moe(norm(h))
        return self.head(h)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 1000 * step + rank)
    seq = torch.randint(0, VOCAB // 4, (BATCH, SEQ + 1), generator=gen) * 3 % VOCAB
    return seq[:, :-1], seq[:, 1:]


def plan(epoch: int, phy2log: np.ndarray, *, slots: int = SLOTS, nb: int = 0) -> pb.PlacementPlan:
    return pb.PlacementPlan(
        job_id="job", epoch=epoch, phy2log=encode_array(phy2log), slots_per_rank=slots,
        not_before_step=nb,
    )


def logical_weights(model: TinyLM) -> dict:
    """(layer, expert) -> list of (w1, w3, w2) of every local replica."""
    out: dict = {}
    for block in moe_blocks(model):
        for slot, e in enumerate(block.local_experts().tolist()):
            out.setdefault((block.layer, e), []).append(
                [p[slot].detach().clone() for p in block.expert_parameters()]
            )
    return out


def train(world: int, rank: int, initial: np.ndarray, moved: bool) -> dict:
    torch.manual_seed(SEED)
    model = TinyLM(initial, routing=moved)
    for block in moe_blocks(model):
        block.init_experts(SEED)
    blocks = moe_blocks(model)
    counter = attach_counter(blocks)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    applier = PlanApplier(blocks, opt, job_id="job", epoch=1)
    losses, balance = [], {}
    # layer 0: expert 3 gets three replicas (two on rank 0), experts 0, 1, 2 change replica
    # counts, most experts change rank; layer 1 swaps the ranks' contents around
    moved_plan = np.array(
        [[3, 3, 1, 2, 3, 0, 4, 2, 5, 6, 7, 1], np.roll(initial[1], 4)], dtype=np.int64
    )
    for step in range(STEPS):
        tokens, target = batch(rank, step)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync_gradients(model)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
        if moved and step == 1:
            bad = [
                plan(2, initial[:1]),  # wrong shape
                plan(2, np.where(initial == 0, EXPERTS, initial)),  # unknown expert id
                plan(2, initial[:, :-world].copy(), slots=SLOTS - 1),  # slot count
                plan(1, initial),  # epoch not newer
            ]
            for p in bad:
                applier.submit(p)
        if moved and step == (2 if rank == 0 else 3):
            applier.submit(plan(3, moved_plan))
        if moved and step == 5:  # same epoch, different content on rank 1
            applier.submit(plan(4, moved_plan if rank != 1 else initial))
        if not moved and step == 6:
            counter.zero_()
            with torch.no_grad():
                model(tokens)
            loads = counter.clone()
            dist.all_reduce(loads)
            balance.update(loads=loads.numpy(), before=received(blocks, world),
                           running=applier.phy2log())
        if moved and step == 6:
            # rebalance from this step's measured loads; measure on the same batch after
            counter.zero_()
            with torch.no_grad():
                model(tokens)
            loads = counter.clone()
            dist.all_reduce(loads)
            before = received(blocks, world)
            target_p2l = plan_placement(
                loads.numpy().astype(np.float64), gpus=world, slots_per_gpu=SLOTS
            ).phy2log
            applier.submit(plan(5, target_p2l))
            balance.update(
                loads=loads.numpy(), before=before, target=target_p2l, running=applier.phy2log()
            )
        report = applier.step_boundary(step)
        if report is not None and report.epoch == 5:
            with torch.no_grad():
                model(tokens)
            balance["after"] = received(blocks, world)
        counter.zero_()
    return {
        "losses": losses,
        "weights": logical_weights(model),
        "phy2log": applier.phy2log(),
        "epoch": applier.epoch,
        "reports": [(r.epoch, r.state, r.step, r.error) for r in applier.reports],
        "balance": balance,
        "moved_bytes": applier.last_staged.bytes_received if applier.last_staged else 0,
    }


def received(blocks: list[ExpertParallelMoE], world: int) -> np.ndarray:
    """``[L, G]`` token-assignments each rank's slots processed in the latest forward."""
    mine = torch.tensor([b.last_received for b in blocks], dtype=torch.int64)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine)
    return torch.stack(out, dim=1).numpy()


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    initial = identity_placement(LAYERS, EXPERTS, world * SLOTS)
    result = {"static": train(world, rank, initial, False), "moved": train(world, rank, initial, True)}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
