"""A transformers experts module whose experts live in moeplane's expert-parallel slots.

Route: a module swap. The MoE block's ``experts`` child (``Qwen3MoeExperts``,
``MixtralExperts``, ``OlmoeExperts``, ``DeepseekV3Experts``, ``GptOssExperts``, ...) is replaced
by :class:`HFExpertSlots`, which the block calls exactly as before::

    experts(hidden_states [T, H], top_k_index [T, k] int64, top_k_weights [T, k]) -> [T, H]

The router, its top-k and its gating weights stay the block's own (they produce the two index and
weight arguments). :class:`HFExpertSlots` dispatches each (token, choice) to a slot of its expert
on some rank (:meth:`moeplane.agents.sdk.moe.ExpertSlots.dispatch`: all-to-all, replicas,
gradients), and there runs the family's own experts module, kept as the child ``local`` with its
fused parameters cut down to this rank's ``S`` slots: ``local`` is called with each received row's
local slot as its only choice and a weight of 1, so the family's expert math (its activation,
``_apply_gate``, biases, transposed or interleaved layout, and the ``experts_implementation`` the
config selects) is used unchanged. The gating weights are applied after the rows come back.

Parameter names gain ``.local``: ``model.layers.0.mlp.experts.local.gate_up_proj [S, ...]``.
"""

from __future__ import annotations

import torch
from torch import nn

from moeplane.agents.sdk.adapters.transformers_layout import ExpertLayout
from moeplane.agents.sdk.moe import ExpertSlots


class HFExpertSlots(ExpertSlots):
    """One MoE layer's experts in slots spread over the ranks of ``group``.

    Args:
        experts: the family's experts module with all E experts (fused parameters ``[E, ...]``);
            it is modified in place: its fused parameters become ``[S, ...]`` copies of this
            rank's slots (the full tensors are dropped) and its ``num_experts`` becomes S.
        layout: its fused parameter layout (names, shapes), from
            :func:`moeplane.agents.sdk.adapters.transformers_layout.expert_layout`.
        phy2log_row: ``[G*S]`` logical expert in each physical slot of this layer.
        slots_per_rank: S.
        layer: index of this MoE layer among the model's MoE layers.
        group: expert-parallel process group (default: the world).
    """

    def __init__(
        self,
        experts: nn.Module,
        layout: ExpertLayout,
        phy2log_row,
        *,
        slots_per_rank: int,
        layer: int,
        group=None,
    ):
        super().__init__(
            layout.num_experts, phy2log_row, slots_per_rank=slots_per_rank, layer=layer,
            group=group,
        )
        self.param_names = layout.params
        keep = torch.as_tensor(self.local_experts(), dtype=torch.int64)
        for name in layout.params:
            full = getattr(experts, name)
            mine = full.detach()[keep.to(full.device)].clone()
            setattr(experts, name, nn.Parameter(mine, requires_grad=full.requires_grad))
        experts.num_experts = slots_per_rank
        self.local = experts
        self.to(next(experts.parameters()).device)  # the step counter follows the weights

    def expert_parameters(self) -> list[nn.Parameter]:
        """The family's fused parameters of this rank's slots, each ``[S, ...]``."""
        return [getattr(self.local, name) for name in self.param_names]

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """``hidden_states [T, H]``, ``top_k_index [T, k]``, ``top_k_weights [T, k]`` -> ``[T, H]``."""
        return self.dispatch(hidden_states, top_k_index, top_k_weights)

    def slot_forward(
        self, x: torch.Tensor, local_slot: torch.Tensor, per_slot: list[int]
    ) -> torch.Tensor:
        if x.shape[0] == 0:
            # no rows here: an eager experts forward would return zeros outside the graph, and
            # this rank would then skip the all-to-all's backward, a collective the others run
            return x * 0
        ones = torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)
        return self.local(x, local_slot.unsqueeze(1), ones)
