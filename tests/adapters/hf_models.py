"""Tiny transformers 5.x MoE models built from configs (random weights, nothing downloaded).

``build(family, layers=2, experts=8, top_k=2, seed=0)`` returns a ``*ForCausalLM`` in eval
mode with the eager experts implementation, widths 32, vocabulary 128.
"""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 128

#: family -> (config class, model class, family-specific config keyword arguments(E))
FAMILIES = {
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM,
                lambda e: {"num_local_experts": e}),
    "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM,
                  lambda e: {"num_experts": e, "moe_intermediate_size": 16,
                             "shared_expert_intermediate_size": 16}),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  lambda e: {"num_experts": e, "moe_intermediate_size": 16, "head_dim": 16}),
    "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM, lambda e: {"num_experts": e}),
    "deepseek_v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM,
                    lambda e: {"n_routed_experts": e, "n_group": 2, "topk_group": 1,
                               "first_k_dense_replace": 1, "q_lora_rank": None,
                               "kv_lora_rank": 8, "qk_rope_head_dim": 8,
                               "qk_nope_head_dim": 8, "v_head_dim": 8,
                               "moe_intermediate_size": 16}),
    "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM,
                lambda e: {"num_local_experts": e, "layer_types": None, "head_dim": 16}),
}


def config(family: str, layers: int = 2, experts: int = 8, top_k: int = 2, **extra):
    """The family's config with tiny widths (eager experts, no hub access)."""
    config_cls, _, specific = FAMILIES[family]
    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=32,
                  num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                  num_experts_per_tok=top_k, max_position_embeddings=64)
    kwargs.update(specific(experts))
    kwargs.update(extra)
    cfg = config_cls(**kwargs)
    cfg._experts_implementation = "eager"
    return cfg


def build(family: str, layers: int = 2, experts: int = 8, top_k: int = 2, seed: int = 0,
          **extra) -> torch.nn.Module:
    """A randomly initialised tiny ``*ForCausalLM`` of ``family`` in eval mode."""
    torch.manual_seed(seed)
    model = FAMILIES[family][1](config(family, layers, experts, top_k, **extra))
    if family == "deepseek_v3":  # its correction bias starts at zero; make routing use it
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.uniform_(-0.1, 0.1)
    return model.eval()


def batch(seed: int = 0, batch_size: int = 2, seq: int = 12) -> torch.Tensor:
    """Token ids ``[batch_size, seq]`` int64."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch_size, seq), generator=generator)
