"""Fine-tune an unmodified Hugging Face Qwen3-MoE model with expert parallelism, rebalanced live.

The model is ``transformers.Qwen3MoeForCausalLM`` built from a small config (random
initialisation, nothing downloaded); the text is the Python standard library's own source files
read as bytes (vocabulary 256). One call puts every MoE layer's experts into moeplane's slots over
the ranks (``expert_parallel``); the router, top-k and gating stay the model's own. On CPU:

    torchrun --nproc-per-node 4 examples/finetune_hf_moe_ep.py --steps 100

Connected to a node agent (``moeplane agent --local-socket /tmp/moeplane.sock --job-id
hf-moe-ep ...``), each rank streams its per-step expert loads and applies the placement plans
the control plane pushes (under the ``auto`` policy, without an operator):

    torchrun --nproc-per-node 4 examples/finetune_hf_moe_ep.py --agent-socket /tmp/moeplane.sock

Without an agent, ``--rebalance-every N`` plans locally (EPLB's greedy on every rank, from the
loads of the last N steps summed over the ranks) and applies with ``ep.apply``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist

from moeplane.controlplane.balancing import balancedness
from moeplane.controlplane.balancing.eplb import eplb_greedy
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.torch import Reporter, expert_parallel

log = logging.getLogger("finetune_hf_moe_ep")


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


def build_model(args) -> torch.nn.Module:
    """A small Qwen3-MoE causal LM over bytes, identically initialised on every rank."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
        max_position_embeddings=args.seq, tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    return Qwen3MoeForCausalLM(config).train()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--slots-per-rank", type=int, default=0,
                   help="physical expert slots per rank (default: experts/world + 1)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20)
    p.add_argument("--agent-socket", default="", help="node agent Unix socket (none: standalone)")
    p.add_argument("--job-id", default="hf-moe-ep")
    p.add_argument("--rebalance-every", type=int, default=0,
                   help="standalone: plan locally every N steps (0: never)")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    slots = args.slots_per_rank or math.ceil(args.experts / world) + 1

    model = build_model(args)
    ep = expert_parallel(model, slots_per_rank=slots)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    reporter = Reporter(ep.counter, rank=rank, job=ep.job_spec(args.job_id),
                        socket_path=args.agent_socket or None,
                        device_id=f"{os.uname().nodename}/cpu{rank}", model=model,
                        optimizer=opt).start()
    ep.connect(reporter, optimizer=opt)

    data = stdlib_bytes(args.data_bytes)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    window = torch.zeros_like(ep.counter)
    started = time.perf_counter()
    for step in range(args.steps):
        with reporter.host_region():
            starts = torch.randint(0, data.numel() - args.seq, (args.batch,), generator=gen)
            seq = torch.stack([data[s : s + args.seq] for s in starts.tolist()])
        loss = model(input_ids=seq, labels=seq).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ep.sync_gradients()
        opt.step()
        window += ep.counter
        reporter.end_step(step, tokens=seq.numel())
        report = ep.step_boundary(step)  # plans from the control plane switch here
        if report is not None and rank == 0:
            log.info("plan epoch %d %s from step %d %s", report.epoch,
                     pb.PlanState.Name(report.state), report.step, report.error)
        if args.rebalance_every and (step + 1) % args.rebalance_every == 0:
            loads = window.clone()
            dist.all_reduce(loads)
            target = eplb_greedy(loads.numpy(), world, slots)
            before = balancedness(loads.numpy(), ep.phy2log(), world)
            after = balancedness(loads.numpy(), target, world)
            report = ep.apply(target, optimizer=opt)
            if rank == 0:
                log.info("plan epoch %d applied from step %d: balancedness %.3f -> %.3f "
                         "(predicted on the last %d steps)", report.epoch, report.step, before,
                         after, args.rebalance_every)
            window.zero_()
        if step % args.log_every == 0 or step == args.steps - 1:
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == 0:
                log.info("step %d loss %.4f step %.1f ms epoch %d (%.2f steps/s)", step,
                         float(total) / world, reporter.last["step_time_s"] * 1e3,
                         ep.applier.epoch, (step + 1) / (time.perf_counter() - started))
    reporter.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
