"""The transformers 4.x scenario of test_transformers4.py, in its own interpreter.

Run as ``python -m tests.adapters.tf4_worker OUT`` with PYTHONPATH putting transformers 4.57.3
(and its tokenizers / huggingface-hub) before the venv's transformers 5.x (``make torch`` installs
that overlay into ``.venv/transformers4``). For Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE: tiny
random models, counts of a forward and of two training micro-batches against the routers' own
logits (``output_router_logits=True``), outputs with and without ``attach``. Writes OUT.
"""

from __future__ import annotations

import sys

import torch
import transformers as tf

from moeplane.torch import attach

FAMILIES = {
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, {"num_local_experts": 8}),
    "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM,
                  {"num_experts": 8, "moe_intermediate_size": 16,
                   "shared_expert_intermediate_size": 16}),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  {"num_experts": 8, "moe_intermediate_size": 16, "head_dim": 16}),
    "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM, {"num_experts": 8}),
}
K = 2


def reference(model, ids) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    return torch.stack([
        torch.bincount(torch.topk(torch.softmax(lg, dim=-1, dtype=torch.float), K).indices
                       .flatten(), minlength=8) for lg in out.router_logits])


def main(out: str) -> None:
    result = {"version": tf.__version__}
    for name, (config_cls, model_cls, extra) in FAMILIES.items():
        torch.manual_seed(0)
        config = config_cls(vocab_size=128, hidden_size=32, intermediate_size=32,
                            num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                            num_experts_per_tok=K, max_position_embeddings=64, **extra)
        model = model_cls(config).eval()
        ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            before = model(ids).logits
        want = reference(model, ids)
        watch = attach(model)
        with torch.no_grad():
            after = model(ids).logits
        forward = watch.take()
        micro = [torch.randint(0, 128, (b, n), generator=torch.Generator().manual_seed(s))
                 for s, b, n in [(2, 2, 9), (3, 1, 5)]]
        model.eval()
        want_train = sum(reference(model, m) for m in micro)
        watch.take()
        model.train()
        for m in micro:
            model(m, labels=m).loss.backward()
        result[name] = {"layers": watch.layers, "forward": forward, "want": want,
                        "identical": torch.equal(before, after), "train": watch.take(),
                        "want_train": want_train}
    torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1])
