"""Count the bytes of tensors autograd saves for backward, by where they are kept.

How it measures: a ``saved_tensors_hooks`` pair around the forward sees every tensor saved
outside a more deeply nested hook (an applied swap or checkpoint installs its own, so what a
swapped layer saves is counted by the swap, and a recomputed layer saves nothing here).
Parameters (and views of them) are skipped: they stay on the device anyway. Bytes are the
tensor's ``numel * element_size``; a storage saved twice is counted once per forward. This is
what "activation memory on the device" means on CPU, where no allocator statistics exist; on
CUDA, :func:`cuda_peak_bytes` gives the allocator's peak as well.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def parameter_storages(modules: Iterable[nn.Module]) -> set[int]:
    """data_ptr of the storage of every parameter of ``modules``."""
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class SavedTensorMeter:
    """Context manager: bytes saved for backward during the ``with`` block, kept on device.

    ``device_bytes``: saved tensors left where they are; reset by entering again.
    """

    def __init__(self, modules: Iterable[nn.Module]):
        self._skip = parameter_storages(modules)
        self.device_bytes = 0
        self._seen: set[int] = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self._skip and ptr not in self._seen:
            self._seen.add(ptr)
            self.device_bytes += tensor_bytes(t)
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedTensorMeter:
        self.device_bytes = 0
        self._seen = set()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def cuda_peak_bytes(device: torch.device) -> int | None:
    """The CUDA allocator's peak since the last reset, or None off CUDA."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
