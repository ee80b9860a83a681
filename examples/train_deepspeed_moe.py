"""Train a byte-level LM built on DeepSpeed's MoE layer, unmodified, watched by moeplane.

Each block is attention + ``deepspeed.moe.layer.MoE`` (top-2, experts split over the ranks:
expert parallel, ``ep_size`` = world size), on DeepSpeed's CPU accelerator with gloo, trained on
the Python standard library's source files. ``moeplane.torch.attach`` finds the DeepSpeed gates
and reads their own ``exp_counts``; with a node agent each rank streams them per step:

    moeplane serve &
    moeplane agent --node-id node-0 --server 127.0.0.1:50051 --job-id train-deepspeed-moe \\
        --ranks 0-1 --local-socket /tmp/moeplane.sock &
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/train_deepspeed_moe.py \\
        --agent-socket /tmp/moeplane.sock

The experts stay where DeepSpeed put them: a placement plan the control plane pushes is answered
with ``PLAN_STATE_FAILED`` and a reason.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from torch import nn  # noqa: E402

from moeplane.controlplane.wire import moeplane_pb2 as pb  # noqa: E402
from moeplane.torch import Reporter, attach  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_moe import stdlib_bytes  # noqa: E402 - the same text as the other examples

log = logging.getLogger("train_deepspeed_moe")


class Block(nn.Module):
    def __init__(self, args, world: int):
        super().__init__()
        self.heads = args.heads
        self.ln1, self.ln2 = nn.LayerNorm(args.d_model), nn.LayerNorm(args.d_model)
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=False)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=False)
        expert = nn.Sequential(nn.Linear(args.d_model, args.d_ff), nn.GELU(),
                               nn.Linear(args.d_ff, args.d_model))
        self.moe = MoE(hidden_size=args.d_model, expert=expert, num_experts=args.experts,
                       ep_size=world, k=args.top_k, min_capacity=args.batch * args.seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out, _, _ = self.moe(self.ln2(x))
        return x + out


class MoELM(nn.Module):
    def __init__(self, args, world: int):
        super().__init__()
        self.tok = nn.Embedding(256, args.d_model)
        self.pos = nn.Embedding(args.seq, args.d_model)
        self.blocks = nn.ModuleList(Block(args, world) for _ in range(args.layers))
        self.head = nn.Linear(args.d_model, 256, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20)
    p.add_argument("--agent-socket", default="", help="node agent Unix socket (none: standalone)")
    p.add_argument("--job-id", default="train-deepspeed-moe")
    p.add_argument("--node-id", default=os.uname().nodename)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(args.seed)
    model = MoELM(args, world)
    for block in model.blocks:
        block.moe.set_deepspeed_parallelism()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    job = pb.JobSpec(job_id=args.job_id, layers=args.layers, experts=args.experts,
                     top_k=args.top_k, world_size=world, slots_per_rank=args.experts // world,
                     ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    reporter: Reporter | None = None

    def refuse_plan(plan: pb.PlacementPlan) -> None:
        reporter.send_report(pb.PlanReport(
            job_id=args.job_id, epoch=plan.epoch, state=pb.PLAN_STATE_FAILED,
            error="DeepSpeed MoE job: its experts stay where DeepSpeed put them"))

    reporter = Reporter(None, rank=rank, job=job, socket_path=args.agent_socket or None,
                        device_id=f"{args.node_id}/cpu{rank}", on_plan=refuse_plan,
                        model=model, optimizer=opt).start()
    watch = attach(model, reporter=reporter)
    if rank == 0:
        log.info("watching %d DeepSpeed MoE layers: %s", len(watch.layers), watch.layers)
    data = stdlib_bytes(args.data_bytes)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    for step in range(args.steps):
        with reporter.host_region():
            starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
            seq = torch.stack([data[s : s + args.seq + 1] for s in starts.tolist()])
        with reporter.activations():
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 256), seq[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        for p in model.parameters():  # mean of the shared gradients; DeepSpeed marks each rank's
            if p.grad is not None and getattr(p, "allreduce", True):  # experts allreduce=False
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        reporter.end_step(step, tokens=args.batch * args.seq)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            log.info("step %d loss %.4f step %.1f ms", step, loss.item(),
                     reporter.last["step_time_s"] * 1e3)
    reporter.close()
    watch.detach()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
