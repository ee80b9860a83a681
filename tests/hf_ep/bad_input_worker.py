"""One rank of the 2-process gloo bad-input scenario of test_bad_input.py.

Run as ``python -m tests.hf_ep.bad_input_worker OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Feeds ``expert_parallel`` and ``ep.apply`` each kind of bad input, checks after
each that nothing changed, then puts the same model into expert parallelism and trains on.
Writes ``OUT_DIR/rank{r}.pt``: case -> (error type, message), plus the checks' results.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from moeplane.torch import expert_parallel
from tests.adapters import hf_models

EXPERTS, SLOTS = 8, 5


class ListExperts(nn.Module):
    """Experts kept as a list of modules (not a fused layout), called like the HF ones."""

    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.num_experts = experts
        self.experts = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(experts))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for k in range(top_k_index.shape[1]):
            for e, expert in enumerate(self.experts):
                rows = top_k_index[:, k] == e
                out[rows] += top_k_weights[rows, k, None] * expert(hidden_states[rows])
        return out


def snapshot(model: nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same(model: nn.Module, before: dict) -> bool:
    now = dict(model.named_parameters())
    return now.keys() == before.keys() and all(torch.equal(now[n], before[n]) for n in before)


def attempt(results: dict, case: str, model: nn.Module, fn) -> None:
    before = snapshot(model)
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
        results[case] = (type(exc).__name__, str(exc), same(model, before))
    else:
        results[case] = ("no error", "", same(model, before))


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict = {}

    dense = hf_models.build("qwen3_moe", experts=EXPERTS, mlp_only_layers=[0, 1])
    attempt(results, "no_moe_layers", dense, lambda: expert_parallel(dense, slots_per_rank=SLOTS))

    odd = hf_models.build("qwen3_moe", experts=EXPERTS)
    odd.model.layers[1].mlp.experts = ListExperts(odd.config.hidden_size, EXPERTS)
    attempt(results, "layout", odd, lambda: expert_parallel(odd, slots_per_rank=SLOTS))

    model = hf_models.build("qwen3_moe", experts=EXPERTS)
    attempt(results, "too_few_slots", model, lambda: expert_parallel(model, slots_per_rank=3))
    good = np.tile(np.arange(world * SLOTS) % EXPERTS, (2, 1))
    attempt(results, "phy2log_shape", model,
            lambda: expert_parallel(model, slots_per_rank=SLOTS, phy2log=good[:1]))
    unknown = good.copy()
    unknown[1, 3] = EXPERTS
    attempt(results, "phy2log_unknown", model,
            lambda: expert_parallel(model, slots_per_rank=SLOTS, phy2log=unknown))
    other = hf_models.build("qwen3_moe", experts=EXPERTS, rms_norm_eps=1e-5 if rank else 1e-6)
    attempt(results, "configs_differ", other, lambda: expert_parallel(other, slots_per_rank=SLOTS))
    results["unchanged_class"] = type(model.model.layers[0].mlp.experts).__name__

    ep = expert_parallel(model, slots_per_rank=SLOTS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = hf_models.batch(seed=rank, batch_size=2, seq=8)

    def step() -> float:
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad()
        loss.backward()
        ep.sync_gradients()
        opt.step()
        return float(loss.detach())

    step()
    moved = np.roll(good, 3, axis=1)
    ep.apply(moved, optimizer=opt)  # epoch 1
    attempt(results, "apply_old_epoch", model, lambda: ep.apply(good, optimizer=opt, epoch=1))
    attempt(results, "apply_shape", model, lambda: ep.apply(good[:, :-1], optimizer=opt))
    attempt(results, "apply_unknown", model, lambda: ep.apply(unknown, optimizer=opt))
    old = pb.PlacementPlan(epoch=1, phy2log=encode_array(good), slots_per_rank=SLOTS)
    results["submit_old_epoch"] = ep.applier.submit(old)
    results["submit_old_report"] = ep.applier.reports[-1].error
    results["still_moved"] = bool(np.array_equal(ep.phy2log(), moved))
    results["epoch"] = ep.applier.epoch
    results["loss_after"] = step()
    results["apply_after"] = ep.apply(good, optimizer=opt).epoch
    dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
