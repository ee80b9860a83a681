"""Where to read the routing decision of each MoE layer of a model: its *sites*.

A :class:`Site` is one hooked module and how to read the experts chosen for a forward from its
input or output. Finders look at module structure, never at the model's name:

- experts modules called with ``top_k_index`` (transformers 5.x, see
  :mod:`.transformers_layout`): a forward *pre*-hook reads the index argument, ``[T, k]``
  integer expert ids;
- routers returning expert ids: a module with integer ``top_k`` and ``num_experts``
  attributes, outside any block found above; a forward hook reads the first integer tensor of
  its output whose last dimension is ``top_k`` (``[T, k]`` or ``[B, L, k]`` ids; torchtitan's
  ``TokenChoiceTopKRouter``);
- transformers 4.x blocks (a ``gate`` ``nn.Linear(H, E)`` returning logits, ``experts`` an
  ``nn.ModuleList`` of E, ``top_k``): a forward hook on the gate recomputes the ids the way the
  block does (:func:`linear_gate_sites`);
- framework finders registered in :data:`FINDERS` (e.g. routers returning a bool ``[T, E]``
  routing map, or layers returning ``[E]`` counts).

Sites are returned in model order (``named_modules`` order); one site per MoE layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from moeplane.agents.sdk.adapters import transformers_layout as tl


class WatchError(ValueError):
    """A model the watch cannot count, or a routing tensor it refuses; names the module."""


#: kind of a routing tensor: "ids" = integer expert ids of any shape (each element one token
#: routed to one expert); "mask" = bool [T, E] routing map; "counts" = [E] tokens per expert.
KINDS = ("ids", "mask", "counts")
#: dtypes of expert ids (one set lookup per hook call)
INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                            torch.uint16, torch.uint32, torch.uint64})


@dataclass
class Site:
    """One MoE layer's hook point.

    Attributes:
        path: the MoE layer's module path (what :attr:`Watch.layers` lists).
        hooked_path: the module path of the hooked module (named in errors).
        module: the hooked module.
        num_experts: E of this layer.
        kind: one of :data:`KINDS`.
        read: ``(args, kwargs, output) -> Tensor`` of that kind; output is None in a pre-hook.
            Raises WatchError (naming ``hooked_path``) on a tensor of the wrong dtype or shape.
        pre: a forward pre-hook (reads the input) rather than a forward hook.
    """

    path: str
    hooked_path: str
    module: nn.Module
    num_experts: int
    kind: str
    read: Callable[[tuple, dict, object], torch.Tensor]
    pre: bool

    def install(self, layer: int, record: Callable[[int, torch.Tensor, str], None]):
        """Register the hook; ``record(layer, tensor, kind)`` gets each forward's routing."""
        read, kind = self.read, self.kind
        if self.pre:
            def pre_hook(module, args, kwargs):
                record(layer, read(args, kwargs, None), kind)

            return self.module.register_forward_pre_hook(pre_hook, with_kwargs=True)

        def hook(module, args, kwargs, output):
            record(layer, read(args, kwargs, output), kind)

        return self.module.register_forward_hook(hook, with_kwargs=True)


def check_ids(path: str, ids, what: str, top_k: int | None = None) -> torch.Tensor:
    """``ids`` if it is a 2-D integer tensor ``[T, k]`` (k == top_k when given), else
    WatchError naming ``path`` and ``what`` (the argument or output it came from)."""
    if not isinstance(ids, torch.Tensor):
        raise WatchError(f"{path}: {what} is {type(ids).__name__}, expected an integer tensor")
    if ids.dtype not in INTEGER_DTYPES:
        raise WatchError(f"{path}: {what} has dtype {ids.dtype}, expected an integer dtype")
    if ids.dim() != 2 or (top_k is not None and ids.shape[-1] != top_k):
        want = f"[tokens, {top_k}]" if top_k is not None else "[tokens, top_k]"
        raise WatchError(f"{path}: {what} has shape {list(ids.shape)}, expected {want}")
    return ids


def hf_experts_sites(model: nn.Module) -> list[Site]:
    """Pre-hooks on experts modules called with ``top_k_index`` (transformers 5.x layout)."""
    sites = []
    for layer in tl.moe_layers(model):
        position = 1  # forward(hidden_states, top_k_index, top_k_weights)
        arg, path = layer.index_arg, layer.experts_path

        def read(args, kwargs, output, arg=arg, path=path, position=position):
            ids = kwargs[arg] if arg in kwargs else args[position] if len(args) > position \
                else None
            return check_ids(path, ids, arg)

        sites.append(Site(layer.path, layer.experts_path, layer.experts,
                          tl.experts_count(layer.experts), "ids", read, pre=True))
    return sites


def linear_gate_sites(model: nn.Module, taken: list[str]) -> list[Site]:
    """Forward hooks on ``gate`` ``nn.Linear(H, E)`` of blocks with ``experts`` (an
    ``nn.ModuleList`` of E) and integer ``top_k``: the transformers 4.x MoE blocks (Mixtral,
    Qwen2-MoE, Qwen3-MoE, OLMoE), whose gate returns logits only. The ids are recomputed the way
    those blocks do, ``topk(softmax(logits, float32), top_k)``: one softmax and one topk per
    layer on the device."""
    sites = []
    for path, block in model.named_modules():
        gate, experts = block._modules.get("gate"), block._modules.get("experts")
        top_k = getattr(block, "top_k", None)
        if (not isinstance(gate, nn.Linear) or not isinstance(experts, nn.ModuleList)
                or not isinstance(top_k, int) or gate.out_features != len(experts)
                or _under(path, taken)):
            continue
        gate_path, count = (f"{path}.gate" if path else "gate"), len(experts)

        def read(args, kwargs, output, path=gate_path, top_k=top_k, count=count):
            if (not isinstance(output, torch.Tensor) or not output.is_floating_point()
                    or output.shape[-1] != count):
                raise WatchError(f"{path}: gate output is not float logits [tokens, {count}]")
            with torch.no_grad():
                probs = torch.softmax(output.reshape(-1, count), dim=-1, dtype=torch.float)
                return torch.topk(probs, top_k, dim=-1).indices

        sites.append(Site(path, gate_path, gate, count, "ids", read, pre=False))
        taken = [*taken, path]
    return sites


def router_sites(model: nn.Module, taken: list[str]) -> list[Site]:
    """Forward hooks on routers that return expert ids, outside the module paths ``taken``."""
    sites = []
    for path, module in model.named_modules():
        top_k, count = getattr(module, "top_k", None), getattr(module, "num_experts", None)
        if not path or not isinstance(top_k, int) or not isinstance(count, int):
            continue
        if tl.index_arg(module) is not None or _under(path, taken):
            continue

        def read(args, kwargs, output, path=path, top_k=top_k):
            outputs = output if isinstance(output, tuple | list) else (output,)
            for item in outputs:
                if (isinstance(item, torch.Tensor) and not item.is_floating_point()
                        and item.dtype != torch.bool and item.dim() >= 2
                        and item.shape[-1] == top_k):
                    return item
            raise WatchError(f"{path}: router output has no integer [..., tokens, {top_k}] "
                             "tensor of expert ids")

        sites.append(Site(path.rpartition(".")[0] or path, path, module, count, "ids", read,
                          pre=False))
        taken = [*taken, path]
    return sites


#: framework finders: ``(model, taken paths) -> [Site]``, tried after the two above
FINDERS: list[Callable[[nn.Module, list[str]], list[Site]]] = []


def find_sites(model: nn.Module) -> list[Site]:
    """Every MoE layer's site, in model order (see the module docstring)."""
    sites = hf_experts_sites(model)
    taken = [site.path for site in sites]
    for finder in (linear_gate_sites, router_sites, *FINDERS):
        more = finder(model, taken)
        sites += more
        taken += [site.path for site in more]
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    return sorted(sites, key=lambda site: order[site.hooked_path])


def _under(path: str, prefixes: list[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or (not p) for p in prefixes)
