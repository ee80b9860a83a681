"""The tiny residual MLP that the SDK's memory-offload tests train, with its ``MemoryOffload``.

Shared by ``tests/sdk/test_memory_offload.py`` (in process) and ``tests/e2e/memory_rank.py``
(a subprocess rank). The model maps ``[B, 8]`` inputs to a scalar loss through ``layers.0..3``,
each a ``Linear -> GELU -> Linear`` block added to its input.
"""

from __future__ import annotations

import torch
from torch import nn

from moeplane.agents.sdk.memory.runner import MemoryOffload

NAMES = [f"layers.{i}" for i in range(4)]


class Net(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
            for _ in NAMES)
        self.out = nn.Linear(width, 1)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x).square().mean()


def build(width: int, batch: int, **offload_kw) -> tuple[Net, torch.optim.Adam, MemoryOffload]:
    """A seeded ``Net(width)``, its Adam optimizer and a ``MemoryOffload`` of its layers for
    micro-batches of ``batch``; ``offload_kw`` go to ``MemoryOffload``."""
    torch.manual_seed(0)
    net = Net(width)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    offload = MemoryOffload(net.layers, NAMES, model=net, optimizer=opt, micro_batch_size=batch,
                            **offload_kw)
    return net, opt, offload
