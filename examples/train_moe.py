"""Train a small MoE language model with expert parallelism and live rebalancing by moeplane.

The text is the Python standard library's own source files, read as bytes (vocabulary 256),
so every Python installation can run it. Run on CPU with four ranks:

    torchrun --nproc-per-node 4 examples/train_moe.py --steps 200

Connected to a node agent (``moeplane agent --local-socket /tmp/moeplane.sock ...``), each rank
streams its per-step expert loads and step statistics, and applies the placement plans the
control plane sends back:

    torchrun --nproc-per-node 4 examples/train_moe.py --agent-socket /tmp/moeplane.sock

With ``--memory-offload`` each rank also profiles its blocks' memory (``RankStep.memory``) and
applies the offload decisions the control plane pushes (activation swap and optimizer-state
offload; never recomputation, since a block's forward runs the expert all_to_all, which one
rank cannot rerun alone). ``--memory-capacity-mb`` sets the capacity a CPU rank reports
(default: the host's memory), so that a watermark can be tried on a laptop.

Without an agent, ``--rebalance-every N`` plans locally (the same greedy on every rank, from the
loads of the last N steps summed over ranks) and applies through the same applier.

``--steps 0`` trains until the process is stopped (``moeplane demo`` runs it so, beside the
simulated job); ``--max-steps-per-s`` paces it to leave the machine's cores to others (the
pause between steps is not counted in the reported step time); ``--first-step`` continues a
job's step numbering after a restart.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from moeplane.controlplane.balancing import balancedness, plan_placement
from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from moeplane.torch import (
    ExpertParallelMoE,
    MemoryOffload,
    PlanApplier,
    Reporter,
    attach_counter,
    moe_blocks,
    sync_gradients,
)

log = logging.getLogger("train_moe")


class Block(nn.Module):
    def __init__(self, args, phy2log_row: np.ndarray, layer: int):
        super().__init__()
        self.heads = args.heads
        self.ln1, self.ln2 = nn.LayerNorm(args.d_model), nn.LayerNorm(args.d_model)
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=False)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=False)
        self.moe = ExpertParallelMoE(args.d_model, args.d_ff, args.experts, args.top_k,
                                     phy2log_row, slots_per_rank=args.slots_per_rank,
                                     layer=layer, routing=args.routing)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.moe(self.ln2(x))


class MoELM(nn.Module):
    """Byte-level decoder: embeddings, ``layers`` x (attention + expert-parallel MoE), head."""

    def __init__(self, args, phy2log: np.ndarray):
        super().__init__()
        self.tok = nn.Embedding(256, args.d_model)
        self.pos = nn.Embedding(args.seq, args.d_model)
        self.blocks = nn.ModuleList(Block(args, phy2log[i], i) for i in range(args.layers))
        self.ln = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, 256, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def stdlib_bytes(limit: int) -> torch.Tensor:
    """The standard library's .py files, concatenated in path order, up to ``limit`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8).long()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="steps to train (0: until stopped)")
    p.add_argument("--first-step", type=int, default=0,
                   help="number of the first step (to continue a job after a restart)")
    p.add_argument("--max-steps-per-s", type=float, default=0.0,
                   help="pause between steps to train at most this fast (0: no pause)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--groups", type=int, default=0,
                   help="expert groups K the control plane keeps each on one node (0: none)")
    p.add_argument("--slots-per-rank", type=int, default=0,
                   help="physical expert slots per rank (default: experts/world + 1)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20)
    p.add_argument("--agent-socket", default="", help="node agent Unix socket (none: standalone)")
    p.add_argument("--job-id", default="train-moe")
    p.add_argument("--node-id", default=os.uname().nodename,
                   help="node id of the agent; ranks report devices <node-id>/cpu<rank>")
    p.add_argument("--rebalance-every", type=int, default=0,
                   help="standalone: plan locally every N steps (0: never)")
    p.add_argument("--memory-offload", action="store_true",
                   help="profile memory per block and apply pushed offload decisions")
    p.add_argument("--memory-capacity-mb", type=float, default=0.0,
                   help="device capacity a CPU rank reports (default: host memory)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--routing", action=argparse.BooleanOptionalAction, default=True,
                   help="divide each step's tokens of a replicated expert among its replicas by "
                        "load (default), or evenly (--no-routing)")
    return p.parse_args(argv)


def local_plan(counts: torch.Tensor, world: int, slots: int, epoch: int, step: int):
    """The same greedy plan on every rank, from loads summed over the ranks.

    Returns the plan, the summed loads ``[L, E]`` and the planned ``phy2log [L, G*S]``."""
    total = counts.clone()
    dist.all_reduce(total)
    phy2log = plan_placement(total.numpy().astype(np.float64), gpus=world, slots_per_gpu=slots).phy2log
    return pb.PlacementPlan(job_id="", epoch=epoch, phy2log=encode_array(phy2log),
                            slots_per_rank=slots, not_before_step=step + 1), total.numpy(), phy2log


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    args.slots_per_rank = args.slots_per_rank or math.ceil(args.experts / world) + 1
    phy2log = identity_placement(args.layers, args.experts, world * args.slots_per_rank)
    torch.manual_seed(args.seed)
    model = MoELM(args, phy2log)
    blocks = moe_blocks(model)
    for block in blocks:
        block.init_experts(args.seed)
    counter = attach_counter(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    applier = PlanApplier(blocks, opt, job_id=args.job_id, epoch=0)
    job = pb.JobSpec(job_id=args.job_id, layers=args.layers, experts=args.experts,
                     top_k=args.top_k, world_size=world, slots_per_rank=args.slots_per_rank,
                     ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                     groups=args.groups)
    offload = None
    if args.memory_offload:
        offload = MemoryOffload(
            model.blocks, [f"blocks.{i}" for i in range(args.layers)], model=model,
            optimizer=opt, micro_batch_size=args.batch,
            capacity_bytes=int(args.memory_capacity_mb * (1 << 20)) or None,
            kinds=("swap_activations", "offload_optimizer"))
    paused = [0.0]  # seconds spent pausing between steps, kept out of the step times

    def busy_clock() -> float:
        return time.perf_counter() - paused[0]

    reporter = Reporter(counter, rank=rank, job=job, socket_path=args.agent_socket or None,
                        device_id=f"{args.node_id}/cpu{rank}", on_plan=applier.submit,
                        model=model, optimizer=opt, offload=offload, perf=busy_clock).start()
    applier.on_report = reporter.send_report

    data = stdlib_bytes(args.data_bytes)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    window = torch.zeros_like(counter)
    tokens = args.batch * args.seq
    started = time.perf_counter()
    last = args.first_step + args.steps - 1  # with --steps 0: until stopped
    step = args.first_step - 1
    while args.steps == 0 or step < last:
        step += 1
        begun = time.perf_counter()
        with reporter.host_region():
            starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
            seq = torch.stack([data[s : s + args.seq + 1] for s in starts.tolist()])
        with reporter.activations():
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 256), seq[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        sync_gradients(model)
        opt.step()
        window += counter
        reporter.end_step(step, tokens=tokens)
        if args.rebalance_every and (step + 1) % args.rebalance_every == 0:
            plan, loads, target = local_plan(window, world, args.slots_per_rank,
                                             applier.epoch + 1, step)
            applier.submit(plan)
            if rank == 0:
                before = balancedness(loads, applier.phy2log(), world)
                after = balancedness(loads, target, world)
                log.info("plan epoch %d: predicted balancedness %.3f -> %.3f", plan.epoch,
                         before, after)
            window.zero_()
        report = applier.step_boundary(step)
        if report is not None and rank == 0:
            log.info("plan epoch %d %s from step %d %s", report.epoch,
                     pb.PlanState.Name(report.state), report.step, report.error)
        if step % args.log_every == 0 or step == last:
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == 0:
                stats = reporter.last
                log.info("step %d loss %.4f step %.1f ms host-bound %.2f epoch %d "
                         "(%.1f steps/s)", step, float(total) / world,
                         stats["step_time_s"] * 1e3, stats["host_bound_ratio"], applier.epoch,
                         (step + 1 - args.first_step) / (time.perf_counter() - started))
        if args.max_steps_per_s > 0:
            now = time.perf_counter()
            if begun + 1.0 / args.max_steps_per_s > now:
                time.sleep(begun + 1.0 / args.max_steps_per_s - now)
                paused[0] += time.perf_counter() - now
    reporter.close()
    if offload is not None:
        for r in offload.reports:
            log.info("rank %d offload decision %d %s: used %d B, saved %d B %s", rank,
                     r.decision_id, pb.PlanState.Name(r.state), r.measured_used_bytes,
                     r.measured_saved_bytes, r.error)
        offload.close()
    if rank == 0:
        log.info("done: memory %s, steps dropped %d", reporter.memory, reporter.dropped)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
