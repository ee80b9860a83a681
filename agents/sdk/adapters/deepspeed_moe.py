"""DeepSpeed's legacy MoE (``deepspeed.moe.layer.MoE``): read the gate's own ``exp_counts``.

Found by structure: a gate module with an integer ``k`` (experts per token) and a ``wg``
``nn.Linear(hidden, E)``, i.e. ``deepspeed.moe.sharded_moe.TopKGate``. Its forward returns a
tuple whose last element is ``exp_counts``, int64 ``[E]``: the tokens this rank's gate routed to
each of the E (global) experts in this forward, before the capacity drop (DeepSpeed computes it
for every gating function: top-1, top-2, top-k, and the Tutel path). A forward hook adds it to
the layer's row; the layer's path is the gate's parent (the ``MOELayer``).

Nothing here imports deepspeed.
"""

from __future__ import annotations

import torch
from torch import nn

from moeplane.agents.sdk.adapters.sites import FINDERS, Site, WatchError, _under


def gate_sites(model: nn.Module, taken: list[str]) -> list[Site]:
    """Forward hooks on DeepSpeed-style gates (``k`` and ``wg``) outside ``taken``."""
    sites = []
    for path, module in model.named_modules():
        wg = getattr(module, "wg", None)
        if (not path or not isinstance(getattr(module, "k", None), int)
                or not isinstance(wg, nn.Linear) or _under(path, taken)):
            continue
        experts = wg.out_features

        def read(args, kwargs, output, path=path, experts=experts):
            counts = output[-1] if isinstance(output, tuple | list) and output else None
            if (not isinstance(counts, torch.Tensor) or counts.is_floating_point()
                    or counts.dtype == torch.bool or tuple(counts.shape) != (experts,)):
                what = (f"{counts.dtype} {list(counts.shape)}" if isinstance(counts, torch.Tensor)
                        else type(counts).__name__)
                raise WatchError(f"{path}: gate output's last element is {what}, expected "
                                 f"integer exp_counts [{experts}]")
            return counts

        sites.append(Site(path.rpartition(".")[0] or path, path, module, experts, "counts",
                          read, pre=False))
    return sites


FINDERS.append(gate_sites)
