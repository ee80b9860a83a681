"""Train a Hugging Face transformers Qwen3-MoE model, unmodified, watched by moeplane.

The model is ``transformers.Qwen3MoeForCausalLM`` built from a small config (random weights,
about 4 million parameters, byte vocabulary 256; nothing is downloaded), trained data parallel
(``DistributedDataParallel``, gloo on CPU) on the Python standard library's source files.
``moeplane.torch.attach`` finds its MoE layers and counts the tokens each expert receives;
with a node agent each rank streams them with its step statistics and memory breakdown:

    moeplane serve &
    moeplane agent --node-id node-0 --server 127.0.0.1:50051 --job-id finetune-hf-moe \\
        --ranks 0-1 --local-socket /tmp/moeplane.sock &
    torchrun --nproc-per-node 2 examples/finetune_hf_moe.py --agent-socket /tmp/moeplane.sock

and the dashboard's Experts page (http://127.0.0.1:8080) shows the job's loads live. The
model keeps every expert on every rank, so it does not apply placement plans: a plan the
control plane pushes is answered with ``PLAN_STATE_FAILED`` and a reason.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.torch import Reporter, attach

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_moe import stdlib_bytes  # noqa: E402 - the same text as the other example

log = logging.getLogger("finetune_hf_moe")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--agent-socket", default="", help="node agent Unix socket (none: standalone)")
    p.add_argument("--job-id", default="finetune-hf-moe")
    p.add_argument("--node-id", default=os.uname().nodename)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def build_model(args) -> Qwen3MoeForCausalLM:
    """A byte-level Qwen3-MoE: ``layers`` x (attention + ``experts`` experts, top-``top_k``)."""
    config = Qwen3MoeConfig(
        vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        num_experts=args.experts, num_experts_per_tok=args.top_k,
        max_position_embeddings=args.seq, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    config._experts_implementation = "eager" if not torch.cuda.is_available() else "grouped_mm"
    torch.manual_seed(args.seed)
    return Qwen3MoeForCausalLM(config)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model = build_model(args)
    if args.activation_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    job = pb.JobSpec(job_id=args.job_id, layers=args.layers, experts=args.experts,
                     top_k=args.top_k, world_size=world, slots_per_rank=args.experts,
                     ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    reporter: Reporter | None = None

    def refuse_plan(plan: pb.PlacementPlan) -> None:
        reporter.send_report(pb.PlanReport(
            job_id=args.job_id, epoch=plan.epoch, state=pb.PLAN_STATE_FAILED,
            error="data-parallel transformers job: every rank holds every expert"))

    reporter = Reporter(None, rank=rank, job=job, socket_path=args.agent_socket or None,
                        device_id=f"{args.node_id}/cpu{rank}", on_plan=refuse_plan,
                        model=model, optimizer=opt).start()
    watch = attach(ddp, reporter=reporter)
    if rank == 0:
        log.info("%d parameters; watching %d MoE layers: %s ... %s",
                 sum(p.numel() for p in model.parameters()), len(watch.layers),
                 watch.layers[0], watch.layers[-1])

    data = stdlib_bytes(args.data_bytes)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    model.train()
    started = time.perf_counter()
    for step in range(args.steps):
        for micro in range(args.micro_batches):
            with reporter.host_region():
                starts = torch.randint(0, data.numel() - args.seq, (args.batch,), generator=gen)
                seq = torch.stack([data[s : s + args.seq] for s in starts.tolist()])
            with reporter.activations():
                sync = micro == args.micro_batches - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    loss = ddp(input_ids=seq, labels=seq).loss / args.micro_batches
                    loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        reporter.end_step(step, tokens=args.batch * args.seq * args.micro_batches)
        if step % args.log_every == 0 or step == args.steps - 1:
            total = loss.detach().clone() * args.micro_batches
            dist.all_reduce(total)
            if rank == 0:
                stats = reporter.last
                log.info("step %d loss %.4f step %.1f ms host-bound %.2f (%.1f steps/s)",
                         step, float(total) / world, stats["step_time_s"] * 1e3,
                         stats["host_bound_ratio"], (step + 1) / (time.perf_counter() - started))
    reporter.close()
    watch.detach()
    if rank == 0:
        log.info("done: memory %s, steps dropped %d", reporter.memory, reporter.dropped)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
