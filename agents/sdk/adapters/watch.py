"""Count the tokens each expert of each MoE layer receives, in an unmodified model.

:func:`attach` finds the model's MoE layers (:mod:`.sites`), hooks them and returns a
:class:`Watch`. What a hook does in the step: check the routing tensor's dtype and shape
(metadata, no device work) and append it to a pending list (a transformers 4.x gate hook first
recomputes the ids from the logits: a softmax and a topk on the device). The pending tensors
are folded into one device accumulator ``[L, E + 2]`` int64 with two kernels per forward whatever
``L`` is: a ``stack`` of its L id tensors and one ``scatter_add_`` of ones along the expert
dimension (row i of the stacked ids adds to layer i's row: no layer offsets to add, no
``torch.bincount``, which on CUDA reads its bin count back to the host). Nothing in a step waits
for the device: the only host copy is the one :meth:`Watch.take` makes (or the Reporter's
background thread) per step.

Ids outside ``[0, E)``: on the CPU ``scatter_add_`` checks every index itself, so the ids go in
as they are and a bad one stops the fold with :class:`WatchError` naming the layer's module
path (the counts since the last take are dropped). On CUDA an out-of-range index would be a
device assert, so ids are clamped to ``[-1, E]`` and shifted by one: columns 0 and ``E + 1`` of
the accumulator catch ids below 0 and from ``E`` up, and :meth:`Watch.take` (or
:meth:`Watch.flush`, reading a copy a step later once it is ready, without waiting for it)
raises the same error when they are not zero.

Activation checkpointing: a forward re-run during backward (``torch.utils.checkpoint``,
reentrant or not, and transformers' gradient checkpointing) runs inside the autograd engine;
hooks called there are not counted. Gradient accumulation: every micro-batch's forward counts.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from moeplane.agents.sdk.adapters import deepspeed_moe, megatron_core  # noqa: F401 - finders
from moeplane.agents.sdk.adapters.sites import Site, WatchError, find_sites

#: pending routing tensors folded into the accumulator once this many are queued
FOLD_EVERY = 512


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
        device = self._device = _device_of(model)
        count, width = len(sites), self.num_experts + 2  # [ids < 0, experts 0..E-1, ids >= E]
        self._acc = torch.zeros(count, width, dtype=torch.int64, device=device)
        self.counter = self._acc[:, 1 : self.num_experts + 1]
        self._ones = torch.ones(0, dtype=torch.int64, device=device)  # grown as folds need
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._in_order = tuple(range(count))
        self._overflow_copy: tuple[torch.Tensor, object] | None = None
        links = _links(model, [site.hooked_path for site in sites])
        self._link_paths = list(links)
        self._link_dicts, self._link_names, self._link_children = (
            [list(column) for column in zip(*links.values(), strict=True)])
        self._containers = _containers(model, [site.hooked_path for site in sites])
        self._handles = [site.install(i, self._record) for i, site in enumerate(sites)]

    # ------------------------------------------------------------------ hook side

    def _record(self, layer: int, routed: torch.Tensor, kind: str) -> None:
        if torch._C._current_graph_task_id() != -1:
            return  # a forward re-run by activation checkpointing inside backward
        if routed.device != self._device:
            raise WatchError(f"{self.sites[layer].hooked_path}: routing tensor on "
                             f"{routed.device}, counter on {self._device}")
        if kind == "ids":  # integer: never requires grad, kept as is
            self._pending.append((layer, routed))
            if len(self._pending) >= FOLD_EVERY:
                self._fold()
        elif kind == "counts":  # [E] tokens per expert
            self.counter[layer] += routed.detach().to(torch.int64)
        else:  # "mask": bool [T, E] routing map
            self.counter[layer] += routed.detach().sum(0, dtype=torch.int64)

    def _fold(self) -> None:
        """Add the pending expert ids to the accumulator (device work only).

        Pending tensors that are the L layers in order, all of one shape (one forward; r
        micro-batches are r such runs) are stacked into ``[r, L, n]`` and each run is one
        ``scatter_add_`` into all L rows; anything else (a layer skipped or called twice,
        shapes that differ) is added tensor by tensor into its layer's row.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        count = len(self.sites)
        tensors = [t for _, t in pending]
        if (len(pending) % count == 0 and len({t.shape for t in tensors}) == 1
                and tuple(i for i, _ in pending) == self._in_order * (len(pending) // count)):
            shape = (len(pending) // count, count, tensors[0].numel())  # no -1: 0 tokens work
            runs = [(None, ids) for ids in torch.stack(tensors).view(shape)]
        else:
            runs = [(i, t.reshape(1, t.numel())) for i, t in pending]
        try:
            for layer, ids in runs:
                self._scatter(layer, ids)
        except RuntimeError:  # CPU: scatter_add_ found an index outside [0, E)
            self._acc.zero_()
            self._raise_overflow(self._out_of_range(pending))
            raise

    def _scatter(self, layer: int | None, ids: torch.Tensor) -> None:
        """Add ``ids`` (``[L, n]`` integer expert ids, row i of layer i, when ``layer`` is None,
        else ``[1, n]`` of that layer) to the accumulator: one ``scatter_add_`` of ones."""
        if self._ones.numel() < ids.numel():
            self._ones = torch.ones(ids.numel(), dtype=torch.int64, device=self._device)
        ones = self._ones[: ids.numel()].view(ids.shape)  # contiguous: scatter's fast path
        if self._acc.is_cuda:  # clamped into the overflow columns: no device assert
            target, index = self._acc, ids.clamp(-1, self.num_experts).to(torch.int64).add_(1)
        else:  # scatter_add_ checks the range of every index on the CPU
            target, index = self.counter, ids.to(torch.int64)
        if layer is not None:
            target = target[layer : layer + 1]
        target.scatter_add_(1, index, ones)

    def _out_of_range(self, pending: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """``[L, 2]`` host counts of ids < 0 and ids >= E per layer in ``pending``."""
        counts = torch.zeros(len(self.sites), 2, dtype=torch.int64)
        for layer, ids in pending:
            counts[layer, 0] += int((ids < 0).sum())
            counts[layer, 1] += int((ids >= self.num_experts).sum())
        return counts

    # ------------------------------------------------------------------ step side

    def flush(self) -> None:
        """Fold pending ids into :attr:`counter` and check out-of-range ids without waiting.

        Called by the Reporter at each ``end_step`` (:meth:`Reporter.bind_counter`).
        """
        self._check_layers()
        self._fold()  # on the CPU it raises on out-of-range ids itself
        if not self._acc.is_cuda:
            return
        if self._overflow_copy is not None:
            host, event = self._overflow_copy
            if not event.query():
                return  # not copied yet: look again at the next step
            self._overflow_copy = None
            self._raise_overflow(host)
        host = torch.empty((len(self.sites), 2), dtype=torch.int64, pin_memory=True)
        host.copy_(self._take_overflow(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._overflow_copy = (host, event)

    def _take_overflow(self) -> torch.Tensor:
        """[L, 2] ids < 0 and ids >= E per layer since the last call (device); resets them."""
        columns = self._acc[:, 0 :: self.num_experts + 1]  # a view of columns 0 and E + 1
        overflow = columns.clone()
        columns.zero_()
        return overflow

    def take(self) -> torch.Tensor:
        """Tokens routed to each expert of each layer since the last take: ``[L, E]`` int64 on
        the CPU; resets the counts. Raises WatchError on ids outside ``[0, E)`` or when the
        model's MoE layers changed since :func:`attach`."""
        self._check_layers()
        self._fold()
        if not self._acc.is_cuda:  # out-of-range ids stopped the fold: no overflow columns
            counts = self.counter.clone()  # [L, E], contiguous
            self._acc.zero_()
            return counts
        full = self._acc.to("cpu", copy=True)
        self._acc.zero_()
        self._raise_overflow(full[:, 0 :: self.num_experts + 1])
        return full[:, 1 : self.num_experts + 1].contiguous()

    def detach(self) -> None:
        """Remove the hooks; the model is as before :func:`attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._pending = []

    def _raise_overflow(self, overflow: torch.Tensor) -> None:
        """``overflow``: [L, 2] host counts of ids < 0 and ids >= E per layer."""
        if not overflow.any():
            return
        values = overflow.sum(1).tolist()
        if any(values):
            named = ", ".join(f"{self.sites[i].hooked_path} ({n} ids)"
                              for i, n in enumerate(values) if n)
            raise WatchError(f"expert ids outside [0, {self.num_experts}) in {named}")

    def _check_layers(self) -> None:
        """WatchError when a module on the path to a hooked module was replaced or removed, or
        a container (ModuleList, ...) above one changed its length."""
        now = map(dict.get, self._link_dicts, self._link_names)  # in C: ~0.1 us a link
        if not all(map(operator.is_, now, self._link_children)):
            broken = next(path for path, modules, name, child
                          in zip(self._link_paths, self._link_dicts, self._link_names,
                                 self._link_children, strict=True)
                          if modules.get(name) is not child)
            raise WatchError(f"{type(self.model).__name__}: {broken} was replaced or removed "
                             "after attach; attach again after changing the MoE layers")
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


def _links(model: nn.Module, paths: list[str]) -> dict[str, tuple[dict, str, nn.Module]]:
    """Module path -> ``(parent._modules, name, child)`` for every module on the way to each
    of ``paths``, each once (shared prefixes such as ``model.layers`` are checked once)."""
    seen: dict[str, tuple[dict, str, nn.Module]] = {}
    for path in paths:
        parent, prefix = model, ""
        for name in path.split("."):
            prefix = f"{prefix}.{name}" if prefix else name
            child = parent._modules[name]
            seen.setdefault(prefix, (parent._modules, name, child))
            parent = child
    return seen


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
