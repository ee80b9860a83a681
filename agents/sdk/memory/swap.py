"""Activation swap: a layer's saved tensors go to host memory and come back for backward.

``SwappedLayer`` runs the wrapped layer under ``saved_tensors_hooks``: *pack* copies each
saved tensor (except parameters) to host memory — pinned when the tensor is on CUDA, copied
with ``non_blocking=True`` on a side stream — and *unpack* copies it back to its device. Prefetch:
the first unpack of a layer also starts fetching the layer registered below it (``below``), so
its tensors are on their way while this layer's backward runs.

On CPU the "host" copy is a real, separate copy (so the original activation can be freed);
there is nothing to pin and no stream.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from moeplane.agents.sdk.memory.meter import parameter_storages, tensor_bytes


class _Packed:
    """One saved tensor parked on the host (weakly listed by its layer for prefetch)."""

    __slots__ = ("__weakref__", "device", "fetched", "host")

    def __init__(self, host: torch.Tensor, device: torch.device):
        self.host = host
        self.device = device
        self.fetched: torch.Tensor | None = None

    def fetch(self) -> torch.Tensor:
        """Start the copy back to the device (on the side stream on CUDA); returns it."""
        if self.fetched is None:
            if self.device.type == "cuda":
                with torch.cuda.stream(_side_stream(self.device)):
                    self.fetched = self.host.to(self.device, non_blocking=True)
            else:
                self.fetched = self.host.to(self.device)
        return self.fetched

    def take(self) -> torch.Tensor:
        """The tensor on its device, safe to use on the current stream."""
        tensor = self.fetch()
        self.fetched = None  # the caller holds it now; keep no device reference
        if self.device.type == "cuda":
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(_side_stream(self.device))
            tensor.record_stream(current)
        return tensor


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t``: pinned and asynchronous on a side stream on CUDA, a plain copy
    on CPU. On CUDA ``t`` is marked used by the side stream, so the allocator keeps its
    memory until the copy is done, and the compute stream never waits for the copy."""
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, layout=t.layout, pin_memory=True)
        stream = _side_stream(t.device)
        stream.wait_stream(torch.cuda.current_stream(t.device))  # t is fully computed
        with torch.cuda.stream(stream):
            host.copy_(t, non_blocking=True)
        t.record_stream(stream)
        return host
    return t.detach().clone(memory_format=torch.contiguous_format)


_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


class SwappedLayer(nn.Module):
    """Wraps ``inner``; its saved activations live on the host between forward and backward.

    ``host_bytes``: bytes parked on the host by the last forward. ``below``: the swapped layer
    that runs before this one, prefetched when this one's backward starts (may be None).
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.host_bytes = 0
        self.below: SwappedLayer | None = None
        self._packed: list[weakref.ref[_Packed]] = []
        self._skip = parameter_storages([inner])

    def prefetch(self) -> None:
        for ref in self._packed:
            packed = ref()
            if packed is not None:  # gone once autograd has used and dropped it
                packed.fetch()

    def _pack(self, t: torch.Tensor):
        if t.untyped_storage().data_ptr() in self._skip or t.device.type == "meta":
            return t  # parameters stay where they are
        packed = _Packed(to_host(t), t.device)
        self.host_bytes += tensor_bytes(t)
        self._packed.append(weakref.ref(packed))
        return packed

    def _unpack(self, packed) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        if self.below is not None:
            self.below.prefetch()
        return packed.take()

    def forward(self, *args, **kwargs):
        self.host_bytes = 0
        self._packed = []
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.inner(*args, **kwargs)
