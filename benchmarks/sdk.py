"""SDK benchmarks: per-step overhead of load counting and reporting, migration throughput.

    .venv/bin/python benchmarks/sdk.py            # both, prints a Markdown report
    .venv/bin/python benchmarks/sdk.py overhead
    .venv/bin/python benchmarks/sdk.py migration

overhead: 58 layers x 256 experts, T tokens x top-8 per layer. Per step the SDK adds, per layer,
``bincount`` of the router indices and the add into the ``[L, E]`` counter (what
``ExpertParallelMoE`` does; the block reuses the bincount for routing, so this is an upper
bound), then ``Reporter.end_step``: snapshot + reset of the counter and the hand-off to the
sender thread, which streams to a real NodeLocal gRPC server on a Unix socket in this process
(so its encoding competes for the GIL as it would in training). Baseline, same run: the
router's own ``topk`` over the same tokens for 58 layers.

migration: 4 gloo ranks on this machine; each holds S expert slots (SwiGLU d x f, fp32) with
AdamW state; a plan rotates half of each rank's slots to the next rank. Throughput = bytes
received over all ranks / wall time of stage + vote + commit (slowest rank). Baseline, same
run: one ``batch_isend_irecv`` of the same bytes per rank pair as single flat buffers.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moeplane.agents.sdk.reporter import Reporter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc

LAYERS, EXPERTS, TOP_K = 58, 256, 8


class _SinkAgent(pb_grpc.NodeLocalServicer):
    def __init__(self):
        self.steps = 0
        self.done = threading.Event()
        self.want = 0

    def Attach(self, request_iterator, context):  # noqa: N802
        for msg in request_iterator:
            if msg.WhichOneof("body") == "step":
                self.steps += 1
                if self.steps >= self.want:
                    self.done.set()
        return iter(())


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def overhead(tokens: int, steps: int = 200) -> dict:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(tokens, EXPERTS, generator=gen) for _ in range(LAYERS)]
    indices = [lg.topk(TOP_K, dim=-1).indices.reshape(-1) for lg in logits]
    counter = torch.zeros(LAYERS, EXPERTS, dtype=torch.int64)
    rows = [counter[i] for i in range(LAYERS)]
    job = pb.JobSpec(job_id="bench", layers=LAYERS, experts=EXPERTS, top_k=TOP_K)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "agent.sock")
        agent = _SinkAgent()
        agent.want = steps
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_NodeLocalServicer_to_server(agent, server)
        server.add_insecure_port(f"unix:{path}")
        server.start()
        reporter = Reporter(counter, rank=0, job=job, socket_path=path).start()
        step = [0]

        binned = [torch.bincount(idx, minlength=EXPERTS) for idx in indices]

        def count():
            for row, idx in zip(rows, indices, strict=True):
                row += torch.bincount(idx, minlength=EXPERTS)

        def add():
            for row, b in zip(rows, binned, strict=True):
                row += b

        def end_step():
            reporter.end_step(step[0], tokens=tokens)
            step[0] += 1

        def route():
            for lg in logits:
                lg.topk(TOP_K, dim=-1)

        for _ in range(20):  # warm up
            count()
            route()
        counting, adding, ending = [], [], []
        for _ in range(steps):
            counting += _time(count, 1)
            adding += _time(add, 1)
            ending += _time(end_step, 1)
        routing = _time(route, 10)
        delivered = agent.done.wait(60)
        reporter.close()
        server.stop(None)
    med = statistics.median
    return {
        "tokens": tokens,
        "count_ms": med(counting) * 1e3,
        "add_ms": med(adding) * 1e3,
        "end_step_ms": med(ending) * 1e3,
        "end_step_p99_ms": float(np.percentile(ending, 99)) * 1e3,
        "route_ms": med(routing) * 1e3,
        "delivered": agent.steps,
        "all_delivered": delivered,
        "dropped": reporter.dropped,
    }


def _migration_rank(rank: int, world: int, port: int, d: int, f: int, slots: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from moeplane.agents.sdk import migration
    from moeplane.agents.sdk.moe import ExpertParallelMoE

    experts = world * slots // 2
    row = np.arange(world * slots) % experts
    block = ExpertParallelMoE(d, f, experts, 2, row, slots_per_rank=slots)
    block.init_experts(0)
    opt = torch.optim.AdamW(block.expert_parameters())
    for p in block.expert_parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    # rotate the first half of every rank's slots to the next rank
    new = row.reshape(world, slots).copy()
    half = slots // 2
    new[:, :half] = np.roll(new[:, :half], 1, axis=0)
    new = new.reshape(1, -1)
    dist.barrier()
    t0 = time.perf_counter()
    staged = migration.stage([block], opt, new)
    vote = torch.ones(1, dtype=torch.int64)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    migration.commit([block], opt, staged)
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    moved = torch.tensor([staged.bytes_received], dtype=torch.int64)
    dist.all_reduce(moved)
    # baseline: the same bytes as one flat buffer per peer
    nbytes = staged.bytes_received
    buf = torch.empty(nbytes // 4)
    out = torch.ones(nbytes // 4)
    dist.barrier()
    t1 = time.perf_counter()
    reqs = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, out, (rank + 1) % world),
        dist.P2POp(dist.irecv, buf, (rank - 1) % world),
    ])
    for r in reqs:
        r.wait()
    raw = torch.tensor([time.perf_counter() - t1])
    dist.all_reduce(raw, op=dist.ReduceOp.MAX)
    if rank == 0:
        q.put({"bytes": int(moved), "seconds": float(elapsed), "raw_seconds": float(raw),
               "per_slot_bytes": 3 * d * f * 4 * 3, "slots_moved": world * half})
    dist.destroy_process_group()


def migration_throughput(d: int = 512, f: int = 1024, slots: int = 4, world: int = 4) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_migration_rank, args=(world, port, d, f, slots, q), nprocs=world,
                       join=True, start_method="spawn")
    out = q.get()
    out["mb_per_s"] = out["bytes"] / out["seconds"] / 1e6
    out["raw_mb_per_s"] = out["bytes"] / out["raw_seconds"] / 1e6
    return out


def main() -> None:
    which = sys.argv[1:] or ["overhead", "migration"]
    if "overhead" in which:
        print("| tokens/rank (x top-8) | 58 x bincount+add ms | 58 x add ms | end_step ms p50 / p99 "
              "| SDK ms: with bincount / marginal | router topk ms (baseline) | with bincount / "
              "topk | delivered |")
        print("|---|---|---|---|---|---|---|---|")
        for tokens in (1024, 4096):
            r = overhead(tokens)
            total = r["count_ms"] + r["end_step_ms"]
            marginal = r["add_ms"] + r["end_step_ms"]
            print(f"| {tokens} | {r['count_ms']:.3f} | {r['add_ms']:.3f} | {r['end_step_ms']:.3f} "
                  f"/ {r['end_step_p99_ms']:.3f} | {total:.3f} / {marginal:.3f} | "
                  f"{r['route_ms']:.1f} | {total / r['route_ms']:.4f} | {r['delivered']} "
                  f"(dropped {r['dropped']}) |")
    if "migration" in which:
        r = migration_throughput()
        print(f"\nmigration: {r['slots_moved']} slots x {r['per_slot_bytes'] / 1e6:.1f} MB "
              f"(weights + AdamW moments), {r['bytes'] / 1e6:.1f} MB received in total, "
              f"{r['seconds'] * 1e3:.1f} ms -> {r['mb_per_s']:.0f} MB/s; raw batch_isend_irecv of "
              f"the same bytes {r['raw_seconds'] * 1e3:.1f} ms -> {r['raw_mb_per_s']:.0f} MB/s; "
              f"ratio {r['mb_per_s'] / r['raw_mb_per_s']:.2f}")


if __name__ == "__main__":
    main()
