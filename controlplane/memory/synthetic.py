"""Synthetic per-layer memory profiles of transformer stacks (dense and MoE), for benchmarks
and tests. Pure and deterministic: the same arguments give the same profile.

Sizes follow the usual accounting (bf16 weights and gradients, 12 bytes of fp32 master
weights and Adam moments per parameter sharded over ``zero_shards`` data-parallel ranks;
activations per layer about ``34 * s * b * h`` bytes with flash attention, Korthikanti et
al. 2022, MoE layers ``top_k`` times the MLP part; the layer input ``2 * s * b * h`` bytes).
Compute time: ``2 * active params * tokens`` FLOPs forward (plus attention), backward twice
that, at ``flops_per_s`` effective.
"""

from __future__ import annotations

from dataclasses import dataclass

from moeplane.controlplane.memory.types import DeviceMemory, LayerMemory


@dataclass(frozen=True)
class StackShape:
    """A transformer stack on one device (one pipeline stage).

    hidden: model width h; seq: tokens per sample s; micro_batch: b; layers: count;
    moe_every: every n-th layer is MoE (0: dense only); experts_per_device: local experts;
    expert_ffn: each expert's inner width; top_k: experts per token.
    """

    name: str
    hidden: int
    seq: int
    micro_batch: int
    layers: int
    ffn: int
    moe_every: int = 0
    experts_per_device: int = 0
    expert_ffn: int = 0
    top_k: int = 0
    zero_shards: int = 1
    flops_per_s: float = 4.0e14


def layer_profiles(shape: StackShape) -> tuple[LayerMemory, ...]:
    """One LayerMemory per layer of ``shape``, forward order."""
    h, s, b = shape.hidden, shape.seq, shape.micro_batch
    tokens = s * b
    out = []
    for i in range(shape.layers):
        moe = shape.moe_every > 0 and i % shape.moe_every == shape.moe_every - 1
        attn_params = 4 * h * h
        if moe:
            mlp_params = shape.experts_per_device * 3 * h * shape.expert_ffn + h * 64
            active_mlp = shape.top_k * 3 * h * shape.expert_ffn
            act = 11 * tokens * h + shape.top_k * 23 * tokens * h + 4 * tokens * shape.top_k
        else:
            mlp_params = 3 * h * shape.ffn
            active_mlp = mlp_params
            act = 34 * tokens * h
        params = attn_params + mlp_params
        fwd_flops = 2 * (attn_params + active_mlp) * tokens + 4 * s * s * h * b
        fwd = fwd_flops / shape.flops_per_s
        out.append(LayerMemory(
            name=f"layer{i}",
            parameter_bytes=2 * params,
            gradient_bytes=2 * params,
            optimizer_bytes=12 * params // shape.zero_shards,
            activation_bytes=act,
            forward_s=fwd,
            backward_s=2 * fwd,
            input_bytes=2 * tokens * h,
            kind="moe" if moe else "dense",
        ))
    return tuple(out)


def device_for(shape: StackShape, capacity_bytes: int, bandwidth: float, node_id: str,
               device_id: str, other_bytes: int = 0) -> DeviceMemory:
    """A device that would run ``shape`` with ``other_bytes`` of unexplained memory.

    ``used_bytes`` is capped at capacity (a measurement cannot exceed it); when the stack does
    not fit, the layers alone may still exceed capacity, which the engine rejects.
    """
    layers = layer_profiles(shape)
    demand = sum(x.parameter_bytes + x.gradient_bytes + x.optimizer_bytes + x.activation_bytes
                 for x in layers) + other_bytes
    return DeviceMemory(
        device_id=device_id,
        node_id=node_id,
        capacity_bytes=capacity_bytes,
        used_bytes=min(demand, capacity_bytes),
        layers=layers,
        host_bandwidth_bytes_per_s=bandwidth,
        micro_batch_size=shape.micro_batch,
    )
