"""Optimizer-state offload: the state of chosen parameters lives on the host between steps.

``OptimizerStateOffload(optimizer, params)`` registers a step pre-hook that copies every
tensor in ``optimizer.state[p]`` (Adam's ``exp_avg``/``exp_avg_sq``, and ``max_exp_avg_sq``
with amsgrad; the scalar ``step`` too when it is a tensor) back to the parameter's device,
and a post-hook that copies them to host memory (pinned when the device is CUDA) and drops
the device copies. The step itself is unchanged, so the update is bit-identical. State that
does not exist yet (before the first step) is created on the device by the step and moved
out after it. ``remove()`` brings the state back and removes the hooks.

On CPU the host copy is a separate tensor, so the effect is measurable as bytes held in host
buffers (``host_bytes``), even though both live in the same memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from moeplane.agents.sdk.memory.meter import tensor_bytes


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t)  # synchronous: the device copy is freed right after
        return host
    return t.detach().clone()


class OptimizerStateOffload:
    """Keeps the optimizer state of ``params`` on the host outside ``optimizer.step()``."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter]):
        self.optimizer = optimizer
        self.params = list(params)
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for i, p in enumerate(self.params):
            if id(p) not in ids:
                raise ValueError(f"params[{i}]: not optimized by this optimizer")
        self.host_bytes = 0
        self._on_host = False
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.to_device()),
            optimizer.register_step_post_hook(lambda *_: self.to_host()),
        ]

    def _move(self, to_host: bool) -> None:
        total = 0
        for p in self.params:
            state = self.optimizer.state.get(p)
            if not state:
                continue
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key == "step" and value.device.type == "cpu" and p.device.type != "cpu":
                    continue  # Adam keeps the step counter on the CPU by default
                if to_host:
                    state[key] = _host_copy(value)
                    total += tensor_bytes(value)
                else:
                    state[key] = value.to(p.device, non_blocking=value.is_pinned())
        self.host_bytes = total
        self._on_host = to_host

    def to_host(self) -> None:
        if not self._on_host:
            self._move(True)

    def to_device(self) -> None:
        if self._on_host:
            self._move(False)

    def remove(self) -> None:
        """Undo: the state goes back to the device and the hooks are removed."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.to_device()
        self.host_bytes = 0
