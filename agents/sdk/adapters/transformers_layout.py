"""Where the MoE parts of a Hugging Face transformers 5.x model are (structure, not names).

A transformers 5.x MoE decoder layer holds its MoE block at ``layers[i].mlp``; the block has a
router (``mlp.gate``, or ``mlp.router`` in gpt-oss) returning ``(router_logits, top_k_weights,
top_k_index)`` and an experts module (``mlp.experts``) whose expert weights are fused 3-D
parameters with the expert on dimension 0. The block calls it as
``experts(hidden_states [T, H], top_k_index [T, k] int64, top_k_weights [T, k])``.

Detection goes by that structure: an *experts module* is any module whose ``forward`` takes an
index argument named like ``top_k_index`` (see :data:`INDEX_ARGS`) as its second parameter, so
a family that is not listed here but follows the convention is found too. Nothing here imports
transformers; the helpers read ``config`` attributes and module attributes only.

Public API (also used by expert parallelism for unmodified HF models)::

    layers = moe_layers(model)       # [MoELayer], in model order (registration order)
    layers[0].path                   # "model.layers.0.mlp" (the MoE block's module path)
    layers[0].experts, .router       # the modules; router is None when there is none
    num_experts(model.config)        # E: num_local_experts | num_experts | n_routed_experts
    top_k(model.config)              # k: num_experts_per_tok
    expert_layout(layers[0].experts) # ExpertLayout: fused parameter names, shapes, flags
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

#: Names transformers gives the experts module's index argument across families
#: (``top_k_index`` in Mixtral/Qwen/OLMoE/DeepSeek, ``router_indices`` in gpt-oss).
INDEX_ARGS = ("top_k_index", "router_indices", "topk_indices", "top_k_indices",
              "selected_experts", "expert_indices")

#: Config attributes holding the expert count, in the order they are tried.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")

#: Attribute names of the router inside an MoE block, in the order they are tried.
ROUTER_NAMES = ("gate", "router")


@dataclass(frozen=True)
class MoELayer:
    """One MoE block of a model.

    Attributes:
        path: module path of the MoE block (``"model.layers.3.mlp"``).
        block: the MoE block (the experts module's parent).
        experts_path: module path of the experts module (``"model.layers.3.mlp.experts"``).
        experts: the experts module (fused expert weights; called with ``top_k_index``).
        index_arg: name of the experts forward's index argument (e.g. ``"top_k_index"``).
        router_path: module path of the router, "" when the block has none.
        router: the router module or None.
    """

    path: str
    block: nn.Module
    experts_path: str
    experts: nn.Module
    index_arg: str
    router_path: str = ""
    router: nn.Module | None = None


@dataclass(frozen=True)
class ExpertLayout:
    """How an experts module stores its fused weights.

    Attributes:
        num_experts: E, the leading dimension of every fused parameter (local experts).
        params: names of the fused parameters, each ``[E, ...]`` (e.g. ``("gate_up_proj",
            "down_proj")``; gpt-oss adds ``"gate_up_proj_bias"``, ``"down_proj_bias"``).
        shapes: each parameter's shape, same order as ``params``.
        is_transposed: True when weights are ``[E, in, out]`` (gpt-oss) rather than
            ``[E, out, in]`` (Mixtral, Qwen, OLMoE, DeepSeek).
        is_concatenated: True when ``gate_up_proj`` stacks ``[gate; up]`` halves; False when
            gate and up columns are interleaved (gpt-oss).
        has_bias: the experts carry bias parameters.
    """

    num_experts: int
    params: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    is_transposed: bool
    is_concatenated: bool
    has_bias: bool


def index_arg(module: nn.Module) -> str | None:
    """The name of ``module.forward``'s index argument if it is an experts module, else None.

    The index must be the second parameter (after the hidden states), as the HF blocks call it.
    """
    forward = inspect.unwrap(type(module).forward)
    try:
        names = [p for p in inspect.signature(forward).parameters if p != "self"]
    except (TypeError, ValueError):
        return None
    if len(names) >= 2 and names[1] in INDEX_ARGS:
        return names[1]
    return None


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """Every MoE block of ``model`` in model order (``named_modules`` order); [] when none.

    An experts module is found by :func:`index_arg`; its parent is the block; the block's
    router is its child named ``gate`` or ``router`` (None when it has neither).
    """
    modules = dict(model.named_modules())
    found: list[MoELayer] = []
    for path, module in modules.items():
        arg = index_arg(module)
        if arg is None or not path:
            continue
        block_path = path.rpartition(".")[0]
        block = modules[block_path] if block_path else model
        router_path, router = "", None
        for name in ROUTER_NAMES:
            child = block._modules.get(name)
            if child is not None and child is not module:
                router_path, router = _join(block_path, name), child
                break
        found.append(MoELayer(block_path, block, path, module, arg, router_path, router))
    return found


def num_experts(config) -> int:
    """E from a transformers config (the first of :data:`EXPERT_COUNT_KEYS` that is set).

    Raises ValueError naming the config class when none is a positive int.
    """
    for key in EXPERT_COUNT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"{type(config).__name__}: no expert count "
                     f"(none of {', '.join(EXPERT_COUNT_KEYS)} is a positive int)")


def top_k(config) -> int:
    """k, the experts each token is routed to (``config.num_experts_per_tok``)."""
    value = getattr(config, "num_experts_per_tok", None)
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{type(config).__name__}: num_experts_per_tok is {value!r}, "
                         "not a positive int")
    return value


def experts_count(experts: nn.Module) -> int:
    """E of an experts module: its ``num_experts`` attribute, else its config, else the
    leading dimension of its fused parameters. Raises ValueError when none gives one."""
    value = getattr(experts, "num_experts", None)
    if isinstance(value, int) and value > 0:
        return value
    config = getattr(experts, "config", None)
    if config is not None:
        return num_experts(config)
    lead = {p.shape[0] for p in experts.parameters(recurse=False) if p.dim() >= 2}
    if len(lead) == 1:
        return lead.pop()
    raise ValueError(f"{type(experts).__name__}: cannot tell its expert count")


def expert_layout(experts: nn.Module) -> ExpertLayout:
    """The fused parameter layout of an experts module (see :class:`ExpertLayout`).

    The flags are those ``transformers.integrations.moe.use_experts_implementation`` sets on
    the instance (defaults: not transposed, concatenated, no bias).
    """
    count = experts_count(experts)
    named = [(n, p) for n, p in experts.named_parameters(recurse=False)
             if p.dim() >= 2 and p.shape[0] == count]
    return ExpertLayout(
        num_experts=count,
        params=tuple(n for n, _ in named),
        shapes=tuple(tuple(p.shape) for _, p in named),
        is_transposed=bool(getattr(experts, "is_transposed", False)),
        is_concatenated=bool(getattr(experts, "is_concatenated", True)),
        has_bias=bool(getattr(experts, "has_bias", False)),
    )


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
