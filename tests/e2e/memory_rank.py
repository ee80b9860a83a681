"""A tiny CPU training rank for the memory-offload end-to-end test (run as a subprocess).

``python -m tests.e2e.memory_rank SOCKET DEVICE_ID JOB_ID`` trains a 4-layer residual MLP
with Adam and reports through the SDK (``Reporter`` with a ``MemoryOffload`` of its layers):
loads, step statistics and memory profiles go to the agent; offload decisions are applied at
step boundaries. Each step is padded to ``STEP_S`` seconds, as a real step would take that
long, so the agent and the control plane are not flooded. Runs until SIGTERM or MAX_STEPS.
"""

from __future__ import annotations

import signal
import sys
import time

import torch

from moeplane.agents.sdk.reporter import Reporter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests.sdk.memory_net import build

WIDTH, BATCH, STEP_S, MAX_STEPS = 128, 64, 0.02, 3000


def main(socket_path: str, device_id: str, job_id: str) -> int:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    torch.set_num_threads(1)
    net, opt, offload = build(WIDTH, BATCH, profile_interval_s=0.1)
    job = pb.JobSpec(job_id=job_id, layers=1, experts=2, top_k=1, world_size=1,
                     slots_per_rank=2, ranks_per_node=1)
    counter = torch.zeros(1, 2, dtype=torch.int64)
    reporter = Reporter(counter, rank=0, job=job, socket_path=socket_path, device_id=device_id,
                        model=net, optimizer=opt, offload=offload).start()
    gen = torch.Generator().manual_seed(1)
    for step in range(MAX_STEPS):
        if stop:
            break
        begin = time.perf_counter()
        x = torch.randn(BATCH, 8, generator=gen)
        with reporter.activations():
            loss = net(x)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()
        counter[0, step % 2] += BATCH
        reporter.end_step(step, tokens=BATCH)
        time.sleep(max(0.0, STEP_S - (time.perf_counter() - begin)))  # the step's length
    reporter.close()
    offload.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
