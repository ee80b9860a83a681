"""Count the tokens each expert of each MoE layer receives, in an unmodified model.

:func:`attach` finds the model's MoE layers (:mod:`.sites`), hooks them and returns a
:class:`Watch`. What a hook does in the step: check the routing tensor's dtype and shape
(metadata, no device work) and append it to a pending list. The pending tensors are folded into
one device accumulator ``[L, E + 1]`` int64 with a handful of kernels whatever ``L`` is (one
``cat`` of the ids, one of the layer offsets, a range check, one ``index_add_``: a bincount
that, unlike ``torch.bincount`` on CUDA, never reads the bin count back to the host). Nothing
in a step waits for the device: the only host copy is the one :meth:`Watch.take` makes (or the
:class:`~moeplane.agents.sdk.reporter.Reporter`'s background thread makes) per step.

Column ``E`` of the accumulator catches ids outside ``[0, E)``; :meth:`Watch.take` raises
:class:`WatchError` naming the layer's module path when it is not zero (on CUDA with a
Reporter, the check reads a copy the step after, when it is ready, without waiting for it).

Activation checkpointing: a forward re-run during backward (``torch.utils.checkpoint``,
reentrant or not, and transformers' gradient checkpointing) runs inside the autograd engine;
hooks called there are not counted. Gradient accumulation: every micro-batch's forward counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from moeplane.agents.sdk.adapters.sites import Site, WatchError, find_sites

#: pending routing tensors folded into the accumulator once this many are queued
FOLD_EVERY = 512


@dataclass
class _Chain:
    """The ``(parent, name, child)`` links from the model down to a hooked module."""

    links: tuple[tuple[nn.Module, str, nn.Module], ...]


class Watch:
    """Per-layer expert loads of an attached model (see the module docstring).

    Attributes:
        layers: the L module paths of the MoE layers, in model order.
        num_experts: E.
        counter: ``[L, E]`` int64 on the model's device, the loads folded so far (a view of the
            accumulator; a Reporter snapshots and zeroes it).
    """

    def __init__(self, model: nn.Module, sites: list[Site]):
        experts = {site.num_experts for site in sites}
        if len(experts) != 1:
            raise WatchError(f"{type(model).__name__}: MoE layers disagree on the expert "
                             f"count ({sorted(experts)}); one [L, E] counter needs one E")
        self.model = model
        self.sites = sites
        self.layers = [site.path for site in sites]
        self.num_experts = experts.pop()
        device = _device_of(model)
        count, width = len(sites), self.num_experts + 1
        self._acc = torch.zeros(count, width, dtype=torch.int64, device=device)
        self.counter = self._acc[:, : self.num_experts]
        self._base = torch.arange(count, dtype=torch.int64, device=device) * width
        self._one = torch.ones(1, dtype=torch.int64, device=device)
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._overflow_copy: tuple[torch.Tensor, object] | None = None
        self._chains = [_chain(model, site.hooked_path) for site in sites]
        self._containers = _containers(model, [site.hooked_path for site in sites])
        self._handles = [site.install(i, self._record) for i, site in enumerate(sites)]

    # ------------------------------------------------------------------ hook side

    def _record(self, layer: int, routed: torch.Tensor, kind: str) -> None:
        if torch._C._current_graph_task_id() != -1:
            return  # a forward re-run by activation checkpointing inside backward
        if routed.device != self._acc.device:
            raise WatchError(f"{self.sites[layer].hooked_path}: routing tensor on "
                             f"{routed.device}, counter on {self._acc.device}")
        if kind == "ids":
            self._pending.append((layer, routed.detach()))
            if len(self._pending) >= FOLD_EVERY:
                self._fold()
        elif kind == "counts":  # [E] tokens per expert
            self._acc[layer, : self.num_experts] += routed.detach().to(torch.int64)
        else:  # "mask": bool [T, E] routing map
            self._acc[layer, : self.num_experts] += routed.detach().sum(0, dtype=torch.int64)

    def _fold(self) -> None:
        """Add the pending expert ids to the accumulator (device work only)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        ids = torch.cat([t.reshape(-1) for _, t in pending]).to(torch.int64)
        base = torch.cat([self._base[i].expand(t.numel()) for i, t in pending])
        valid = (ids >= 0) & (ids < self.num_experts)
        key = base + torch.where(valid, ids, self.num_experts)
        self._acc.view(-1).index_add_(0, key, self._one.expand(key.numel()))

    # ------------------------------------------------------------------ step side

    def flush(self) -> None:
        """Fold pending ids into :attr:`counter` and check out-of-range ids without waiting.

        Called by the Reporter at each ``end_step`` (:meth:`Reporter.bind_counter`).
        """
        self._check_layers()
        self._fold()
        overflow = self._acc[:, self.num_experts]
        if not overflow.is_cuda:
            self._raise_overflow(overflow)
            return
        if self._overflow_copy is not None:
            host, event = self._overflow_copy
            if event.query():
                self._overflow_copy = None
                self._raise_overflow(host)
        if self._overflow_copy is None:
            host = torch.empty(overflow.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(overflow, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._overflow_copy = (host, event)
            overflow.zero_()

    def take(self) -> torch.Tensor:
        """Tokens routed to each expert of each layer since the last take: ``[L, E]`` int64 on
        the CPU; resets the counts. Raises WatchError on ids outside ``[0, E)`` or when the
        model's MoE layers changed since :func:`attach`."""
        self._check_layers()
        self._fold()
        full = self._acc.to("cpu", copy=True)
        self._acc.zero_()
        self._raise_overflow(full[:, self.num_experts])
        return full[:, : self.num_experts].contiguous()

    def detach(self) -> None:
        """Remove the hooks; the model is as before :func:`attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._pending = []

    def _raise_overflow(self, overflow: torch.Tensor) -> None:
        values = overflow.tolist()
        if any(values):
            overflow.zero_()
            named = ", ".join(f"{self.sites[i].hooked_path} ({n} ids)"
                              for i, n in enumerate(values) if n)
            raise WatchError(f"expert ids outside [0, {self.num_experts}) in {named}")

    def _check_layers(self) -> None:
        for site, chain in zip(self.sites, self._chains, strict=True):
            for parent, name, child in chain.links:
                if parent._modules.get(name) is not child:
                    raise WatchError(f"{type(self.model).__name__}: MoE layer "
                                     f"{site.hooked_path} was replaced or removed after attach")
        for path, (container, size) in self._containers.items():
            if len(container) != size:
                raise WatchError(f"{type(self.model).__name__}: {path or 'the model'} had "
                                 f"{size} modules at attach, now {len(container)}; "
                                 "attach again after changing the MoE layers")


def attach(model: nn.Module, reporter=None) -> Watch:
    """Hook every MoE layer of ``model`` (in model order) and count its expert loads.

    Args:
        model: an unmodified ``nn.Module`` (transformers 5.x MoE models, or any model with an
            experts module called with ``top_k_index`` or a router returning expert ids).
        reporter: a :class:`~moeplane.agents.sdk.reporter.Reporter` whose job is ``[L, E]``;
            its ``end_step`` then sends these counts with the step statistics.

    Raises WatchError naming the model class when it has no MoE layer.
    """
    sites = find_sites(model)
    if not sites:
        raise WatchError(f"{type(model).__name__}: no MoE layer found (looked for an experts "
                         "module called with top_k_index and for a router returning expert ids)")
    watch = Watch(model, sites)
    if reporter is not None:
        reporter.bind_counter(watch.counter, watch.flush)
    return watch


def _device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def _chain(model: nn.Module, path: str) -> _Chain:
    links, parent = [], model
    for name in path.split(".") if path else []:
        child = parent._modules[name]
        links.append((parent, name, child))
        parent = child
    return _Chain(tuple(links))


def _containers(model: nn.Module, paths: list[str]) -> dict[str, tuple[nn.Module, int]]:
    """The ModuleList/ModuleDict/Sequential ancestors of the hooked modules, with their sizes."""
    found: dict[str, tuple[nn.Module, int]] = {}
    for path in paths:
        parts = path.split(".")
        for depth in range(len(parts)):
            prefix = ".".join(parts[:depth])
            module = model.get_submodule(prefix)
            if isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Sequential):
                found.setdefault(prefix, (module, len(module)))
    return found
