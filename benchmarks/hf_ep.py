"""Expert parallelism for an unmodified transformers model: step time and migration throughput.

4 gloo ranks on this machine train a Qwen3-MoE model (transformers 5.x, random initialisation)
two ways, same per-rank batch, same seed:

- baseline: the unmodified model, data parallel (``DistributedDataParallel``: every rank holds all
  experts and all-reduces every gradient);
- ``expert_parallel(model, slots_per_rank=S)``: each rank holds S expert slots, tokens travel by
  all-to-all, ``ep.sync_gradients()`` reduces dense gradients and expert replicas.

Then ``ep.apply`` moves every slot to the next rank (weights + AdamW ``exp_avg``/``exp_avg_sq``):
throughput = bytes received over all ranks / slowest rank's time for the whole apply (agreement,
stage, vote, commit).

    .venv/bin/python benchmarks/hf_ep.py [--steps 20] [--hidden 256] [--experts 16]

Results: docs/bench-hf-ep.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _model(args):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=1024, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        num_experts=args.experts, num_experts_per_tok=2, max_position_embeddings=args.seq,
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).train()


def _steps(model, opt, args, rank: int, after_backward) -> list[float]:
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, 1024, (args.batch, args.seq), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        after_backward()
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(float(elapsed))
    return times


def _rank(rank: int, world: int, port: int, args, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from moeplane.torch import expert_parallel

    out: dict = {}
    model = _model(args)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    out["dp"] = _steps(ddp, opt, args, rank, lambda: None)
    out["dp_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    del ddp, model, opt

    model = _model(args)
    ep = expert_parallel(model, slots_per_rank=args.slots)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out["ep"] = _steps(model, opt, args, rank, ep.sync_gradients)
    out["ep_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())

    moved = np.roll(ep.phy2log(), args.slots, axis=1)  # every slot goes to the next rank
    dist.barrier()
    t0 = time.perf_counter()
    ep.apply(moved, optimizer=opt)
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    staged = ep.applier.last_staged
    received = torch.tensor([staged.bytes_received, staged.slots_received], dtype=torch.int64)
    dist.all_reduce(received)
    out["migration_s"], out["migration_bytes"] = float(elapsed), int(received[0])
    out["slots_moved"] = int(received[1])  # slots received from another rank
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--slots", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(args.world, port, args, q), nprocs=args.world, join=True,
                       start_method="spawn")
    r = q.get()
    dp, ep = statistics.median(r["dp"]), statistics.median(r["ep"])
    print(f"{args.world} ranks, Qwen3-MoE {args.layers} layers x {args.experts} experts, hidden "
          f"{args.hidden}, {args.batch}x{args.seq} tokens per rank, S={args.slots}")
    print("| model | step ms (median) | p90 ms | parameter MB per rank |")
    print("|---|---|---|---|")
    for name, times, nbytes in (("unmodified, DDP", r["dp"], r["dp_bytes"]),
                                ("expert_parallel", r["ep"], r["ep_bytes"])):
        p90 = sorted(times)[int(0.9 * (len(times) - 1))]
        print(f"| {name} | {statistics.median(times) * 1e3:.1f} | {p90 * 1e3:.1f} | "
              f"{nbytes / 1e6:.2f} |")
    print(f"EP / DDP step time: {ep / dp:.2f}")
    mb = r["migration_bytes"] / 1e6
    print(f"migration (placement rotated by one rank): {r['slots_moved']} slots received, {mb:.1f} MB received over all ranks "
          f"(weights + AdamW moments) in {r['migration_s'] * 1e3:.1f} ms -> "
          f"{mb / r['migration_s']:.0f} MB/s")


if __name__ == "__main__":
    main()
