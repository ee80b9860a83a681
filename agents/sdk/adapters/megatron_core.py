"""Megatron-Core's ``TopKRouter``: count its ``routing_map`` (what ``router_trace.py`` reads).

Found by structure: a module with integer ``topk`` and ``num_experts`` attributes and a
``routing`` method. Its forward returns ``(probs, routing_map)``, ``routing_map`` a bool
``[tokens, E]`` (after any capacity drop); a forward hook adds ``routing_map.sum(0)`` to the
layer's row. The layer's path is the router's parent (the ``MoELayer``).

Python hooks do not run under CUDA-graph replay: with Megatron's CUDA graphs on, the replayed
steps are not counted. Nothing here imports megatron.
"""

from __future__ import annotations

import torch
from torch import nn

from moeplane.agents.sdk.adapters.sites import FINDERS, Site, WatchError, _under


def router_map_sites(model: nn.Module, taken: list[str]) -> list[Site]:
    """Forward hooks on Megatron-style routers (``topk``, ``num_experts``, ``routing``)."""
    sites = []
    for path, module in model.named_modules():
        experts = getattr(module, "num_experts", None)
        if (not path or not isinstance(getattr(module, "topk", None), int)
                or not isinstance(experts, int) or not callable(getattr(module, "routing", None))
                or _under(path, taken)):
            continue

        def read(args, kwargs, output, path=path, experts=experts):
            routing_map = output[1] if isinstance(output, tuple | list) and len(output) > 1 \
                else None
            if (not isinstance(routing_map, torch.Tensor) or routing_map.dtype != torch.bool
                    or routing_map.dim() != 2 or routing_map.shape[1] != experts):
                what = (f"{routing_map.dtype} {list(routing_map.shape)}"
                        if isinstance(routing_map, torch.Tensor) else type(routing_map).__name__)
                raise WatchError(f"{path}: router output's routing_map is {what}, expected "
                                 f"bool [tokens, {experts}]")
            return routing_map

        sites.append(Site(path.rpartition(".")[0] or path, path, module, experts, "mask", read,
                          pre=False))
    return sites


FINDERS.append(router_map_sites)
