"""Per-layer memory and time of a training step, and the ``MemoryProfile`` the rank sends.

``LayerProfiler(layers, names, model=..., optimizer=...)`` hooks the registered layers (the
modules the offload engine may act on, in forward order; ``names[i]`` is what decisions call
``layers[i]`` and what ``apply_actions(names=...)`` takes). Inside ``with profiler.measure():``
around forward and backward it records, per layer:

- ``activation_bytes``: bytes autograd saved for backward while the layer ran (a
  ``saved_tensors_hooks`` pair, parameters skipped, each storage counted once per step);
  tensors saved by an applied swap or checkpoint are not seen (they are not on the device);
- ``input_bytes``: bytes of the layer's first tensor input (what recomputation keeps);
- ``forward_s``: from the layer's forward pre-hook to its forward hook (first call per step,
  so a recomputation in backward does not count twice);
- ``backward_s``: from the gradient of its output to the gradient of its input (tensor hooks).
  Without an input that requires grad: 2 x ``forward_s`` (the usual ratio).

CPU times are ``time.perf_counter`` wall seconds; CUDA times come from events on the current
stream, read when the profile is built. A layer that runs under an applied action keeps the
sizes and times it had before (a swapped layer's activations are what it parked on the host),
so the control plane always sees what each layer needs without actions; ``applied_actions``
says what is in effect, and ``used_bytes`` what the device actually held.

Device bytes: CUDA: ``used_bytes`` is the allocator's peak inside ``measure()``,
``activations_peak_bytes`` that peak over the allocation at its start, capacity the device's
total memory. CPU (no allocator statistics): ``activations_peak_bytes`` is the activation bytes
left on the device, ``used_bytes`` parameters + gradients + optimizer state not offloaded +
those activations, capacity the host's total memory unless given.

Host link: on CUDA measured once by timing a 64 MiB pinned copy each way (the slower
direction); on CPU :data:`CPU_HOST_LINK_BYTES_PER_S` (there is no link; swaps are copies).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from moeplane.agents.sdk.memory.meter import parameter_storages, tensor_bytes
from moeplane.controlplane.wire import moeplane_pb2 as pb

CPU_HOST_LINK_BYTES_PER_S = 10e9  # a memcpy-class default: CPU "swaps" are host copies
PROBE_BYTES = 64 << 20


def host_link_bytes_per_s(device: torch.device) -> float:
    """Host<->device copy bandwidth in bytes/s (see the module docstring)."""
    if device.type != "cuda":
        return CPU_HOST_LINK_BYTES_PER_S
    host = torch.empty(PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(PROBE_BYTES, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)  # warm up
    rates = []
    for dst, src in ((dev, host), (host, dev)):
        torch.cuda.synchronize(device)
        begin = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        rates.append(PROBE_BYTES / max(time.perf_counter() - begin, 1e-9))
    return float(min(rates))


def _first_tensor(values) -> torch.Tensor | None:
    for v in values if isinstance(values, tuple | list) else (values,):
        if isinstance(v, torch.Tensor):
            return v
    return None


def _state_bytes(optimizer, params) -> int:
    if optimizer is None:
        return 0
    return sum(tensor_bytes(v) for p in params for v in optimizer.state.get(p, {}).values()
               if isinstance(v, torch.Tensor))


class LayerProfiler:
    """Measures the registered ``layers`` (see the module docstring). Not thread-safe: the
    training thread calls ``measure`` and ``profile``; backward hooks run on autograd's."""

    def __init__(self, layers: Sequence[nn.Module], names: Sequence[str] | None = None, *,
                 model: nn.Module | None = None, optimizer=None,
                 capacity_bytes: int | None = None, micro_batch_size: int = 0):
        self.modules = list(layers)
        if not self.modules:
            raise ValueError("layers: no layers to profile")
        self.names = [str(i) for i in range(len(self.modules))] if names is None else list(names)
        if len(self.names) != len(self.modules) or len(set(self.names)) != len(self.names):
            raise ValueError(f"names: {len(self.names)} unique names needed for "
                             f"{len(self.modules)} layers")
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes: must be > 0, got {capacity_bytes}")
        self.model = model if model is not None else nn.ModuleList(self.modules)
        self.optimizer = optimizer
        self.micro_batch_size = micro_batch_size
        self.device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self.cuda = self.device.type == "cuda"
        self._capacity = capacity_bytes
        self._link: float | None = None
        n = len(self.modules)
        self.activation_bytes = [0] * n  # per layer, without actions (see module doc)
        self.input_bytes = [0] * n
        self.forward_s = [0.0] * n
        self.backward_s = [0.0] * n
        self.device_activation_bytes = 0  # saved activations left on the device, last step
        self.used_bytes = 0
        self.activation_peak_bytes = 0
        self.wrappers: dict[int, nn.Module] = {}  # layer -> its wrapper while an action runs
        self._measuring = False
        self._step: dict = {}
        self._handles = []
        for i, m in enumerate(self.modules):
            self._handles.append(m.register_forward_pre_hook(self._pre_hook(i)))
            self._handles.append(m.register_forward_hook(self._post_hook(i)))

    # ------------------------------------------------------------------ hooks

    def _stamp(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _seconds(self, begin, end) -> float:
        if begin is None or end is None:
            return 0.0
        if self.cuda:
            end.synchronize()
            return begin.elapsed_time(end) / 1e3
        return max(0.0, end - begin)

    def _pre_hook(self, i: int):
        def hook(_module, args):
            if not self._measuring:
                return
            s = self._step
            s["stack"].append(i)
            if i not in s["fwd_begin"]:
                s["fwd_begin"][i] = self._stamp()
                x = _first_tensor(args)
                s["inp"][i] = 0 if x is None else tensor_bytes(x)
        return hook

    def _post_hook(self, i: int):
        def hook(_module, args, output):
            if not self._measuring:
                return
            s = self._step
            if s["stack"] and s["stack"][-1] == i:
                s["stack"].pop()
            if i in s["fwd_end"]:
                return  # a recomputation in backward
            s["fwd_end"][i] = self._stamp()
            out, x = _first_tensor(output), _first_tensor(args)
            if out is not None and out.requires_grad:
                out.register_hook(self._mark(s["bwd_begin"], i))
                if x is not None and x.requires_grad:
                    x.register_hook(self._mark(s["bwd_end"], i))
        return hook

    def _mark(self, stamps: dict, i: int):
        def hook(_grad) -> None:  # a tensor hook: returns None to keep the gradient
            if i not in stamps:
                stamps[i] = self._stamp()
        return hook

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = self._step
        ptr = t.untyped_storage().data_ptr()
        if ptr not in s["skip"] and ptr not in s["seen"]:
            s["seen"].add(ptr)
            layer = s["stack"][-1] if s["stack"] else None
            s["act"][layer] = s["act"].get(layer, 0) + tensor_bytes(t)
        return t

    # ------------------------------------------------------------------ one step

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Wrap forward and backward of one step."""
        self._step = {"stack": [], "seen": set(), "act": {}, "inp": {}, "fwd_begin": {},
                      "fwd_end": {}, "bwd_begin": {}, "bwd_end": {},
                      "skip": parameter_storages([self.model])}
        base = 0
        if self.cuda:
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._measuring = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            self._measuring = False
            if self.cuda:
                peak = torch.cuda.max_memory_allocated(self.device)
                self.used_bytes, self.activation_peak_bytes = int(peak), int(peak - base)
            self._finish()

    def _finish(self) -> None:
        s = self._step
        self.device_activation_bytes = sum(s["act"].values())
        for i in range(len(self.modules)):
            if i not in s["fwd_end"]:
                continue  # did not run this step
            if i in self.wrappers:
                swapped = getattr(self.wrappers[i], "host_bytes", 0)
                if swapped:
                    self.activation_bytes[i] = swapped
                continue  # keep the sizes and times measured without actions
            self.activation_bytes[i] = s["act"].get(i, 0)
            self.input_bytes[i] = s["inp"].get(i, 0)
            self.forward_s[i] = self._seconds(s["fwd_begin"].get(i), s["fwd_end"][i])
            bwd = self._seconds(s["bwd_begin"].get(i), s["bwd_end"].get(i))
            self.backward_s[i] = bwd if i in s["bwd_end"] else 2 * self.forward_s[i]

    # ------------------------------------------------------------------ the profile

    def capacity_bytes(self) -> int:
        if self._capacity is None:
            if self.cuda:
                self._capacity = int(torch.cuda.get_device_properties(self.device).total_memory)
            else:
                import psutil

                self._capacity = int(psutil.virtual_memory().total)
        return self._capacity

    def host_link(self) -> float:
        if self._link is None:
            self._link = host_link_bytes_per_s(self.device)
        return self._link

    def _totals(self) -> tuple[int, int, int]:
        params = list(self.model.parameters())
        return (sum(tensor_bytes(p) for p in params),
                sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
                _state_bytes(self.optimizer, params))

    def update_used(self, optimizer_host_bytes: int = 0,
                    totals: tuple[int, int, int] | None = None) -> int:
        """``used_bytes`` of the last step (on CPU computed here, see the module doc).
        ``totals``: parameters, gradients, optimizer bytes when the caller has them."""
        if not self.cuda:
            parameters, gradients, optimizer = totals or self._totals()
            self.activation_peak_bytes = self.device_activation_bytes
            self.used_bytes = (parameters + gradients + optimizer - optimizer_host_bytes
                               + self.device_activation_bytes)
        return self.used_bytes

    def profile(self, device_id: str = "", rank: int = 0, applied: Sequence[str] = (),
                optimizer_host_bytes: int = 0) -> pb.MemoryProfile:
        """The ``MemoryProfile`` of the last measured step (bytes, seconds)."""
        totals = self._totals()
        parameters, gradients, optimizer = totals
        self.update_used(optimizer_host_bytes, totals)
        layers = []
        for i, m in enumerate(self.modules):
            own = list(m.parameters())
            layers.append(pb.LayerMemory(
                name=self.names[i], activation_bytes=self.activation_bytes[i],
                forward_s=self.forward_s[i], backward_s=self.backward_s[i],
                parameter_bytes=sum(tensor_bytes(p) for p in own),
                optimizer_bytes=_state_bytes(self.optimizer, own),
                input_bytes=self.input_bytes[i],
                gradient_bytes=sum(tensor_bytes(p.grad) for p in own if p.grad is not None)))
        return pb.MemoryProfile(
            device_id=device_id, rank=rank, capacity_bytes=self.capacity_bytes(),
            used_bytes=self.used_bytes, parameters_bytes=parameters, gradients_bytes=gradients,
            optimizer_bytes=optimizer, activations_peak_bytes=self.activation_peak_bytes,
            layers=layers, host_link_bytes_per_s=self.host_link(),
            applied_actions=list(applied), micro_batch_size=self.micro_batch_size)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
