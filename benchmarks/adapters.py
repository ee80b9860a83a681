"""attach() overhead on a transformers model with 58 MoE layers x 256 experts (tiny widths).

    .venv/bin/python benchmarks/adapters.py [--tokens 64,512] [--reps 11]

The model: ``transformers.DeepseekV3ForCausalLM`` from a config with DeepSeek-V3's expert
geometry (61 decoder layers, the first 3 dense: 58 MoE layers x 256 routed experts, top-8 in
4 of 8 groups) and tiny widths (hidden 32, expert width 8), eager experts, random weights, one
intra-op thread, ``torch.no_grad``. Times are the thread's CPU time (``time.thread_time``),
not the wall clock, which on the shared 2-core machine mostly measures other people's jobs.

Two measurements, same run:

- isolated: what ``attach`` adds to a step, measured directly: the 58 pre-hook calls on the
  step's own ``top_k_index`` tensors, the hook dispatch ``nn.Module.__call__`` adds to a module
  that has a hook (measured on a no-op module with and without one, times 58), and
  ``Watch.take()`` (fold, one host copy, reset, range and layer checks). Baseline: the model's
  own routing, the 58 routers' forwards on the same hidden states. The floor: one bare counting
  kernel over the same ids, already in one tensor (``torch.bincount`` of layer-offset keys, and
  ``scatter_add_`` of ones into ``[L, E]``, the fold's kernel), plus the hook dispatch. The
  measurements are interleaved within each rep, so that they share the machine's state.
- end to end: the whole forward with ``attach`` + ``take()`` against the same model without
  ``attach``, interleaved, medians. The forward is ~1,000x the budget on this CPU, so this
  difference is within the noise; it checks that nothing large hides outside the isolated sum.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from moeplane.torch import attach

BUDGET_MS = 0.5


def build() -> DeepseekV3ForCausalLM:
    config = DeepseekV3Config(
        vocab_size=256, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
        num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4, num_attention_heads=2,
        num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=4096, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(config).eval()


def timed(fn, reps: int) -> list[float]:
    """``reps`` CPU times (ms) of this thread running ``fn``: on the shared machine the wall
    clock also counts the time other processes hold the cores; the work is what a step adds."""
    out = []
    for _ in range(reps):
        start = time.thread_time()
        fn()
        out.append((time.thread_time() - start) * 1e3)
    return out


def capture(model, blocks, ids) -> dict[int, tuple]:
    """One forward's inputs of every experts module ((args, kwargs)) and router ((hidden,))."""
    captured: dict[int, tuple] = {}
    hooks = [b.experts.register_forward_pre_hook(
        lambda m, a, kw: captured.__setitem__(id(m), (a, kw)), with_kwargs=True)
        for b in blocks]
    hooks += [b.gate.register_forward_pre_hook(
        lambda m, a: captured.__setitem__(id(m), a)) for b in blocks]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return captured


def isolated(model, blocks, ids, reps: int, dispatch_ms: float) -> dict[str, float]:
    """Medians and minima (ms per step) of what attach adds, of the floor and of the model's
    own routing."""
    captured = capture(model, blocks, ids)
    watch = attach(model)
    calls = [(b.experts, next(iter(b.experts._forward_pre_hooks.values())),
              *captured[id(b.experts)]) for b in blocks]
    routed = torch.stack([captured[id(b.experts)][0][1] for b in blocks]).view(len(blocks), -1)
    experts = blocks[0].experts.num_experts
    keys = (routed + torch.arange(len(blocks))[:, None] * experts).view(-1)
    counts = torch.zeros(len(blocks), experts, dtype=torch.int64)
    ones = torch.ones_like(routed)

    def watch_step():
        for module, hook, a, kw in calls:
            hook(module, a, kw)
        watch.take()

    def routing():
        with torch.no_grad():
            for block in blocks:
                block.gate(*captured[id(block.gate)])

    inner = 50
    parts = {"step": (watch_step, inner), "take": (watch.take, inner), "route": (routing, 1),
             "bincount": (lambda: torch.bincount(keys, minlength=counts.numel()), inner),
             "scatter": (lambda: counts.scatter_add_(1, routed, ones), inner)}
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(reps):
        for name, (fn, n) in parts.items():
            times[name] += [t / n for t in timed(lambda fn=fn, n=n: [fn() for _ in range(n)], 1)]
    watch.detach()
    out = {name: statistics.median(t) for name, t in times.items()}
    out["added"] = out["step"] + dispatch_ms
    out["added_min"] = min(times["step"]) + dispatch_ms
    return out


def hook_dispatch_ms(reps: int) -> float:
    """What nn.Module.__call__ adds to 58 calls of a module that has a forward pre-hook."""

    class Noop(nn.Module):
        def forward(self, x, i, w):
            return x

    bare, hooked = Noop(), Noop()
    hooked.register_forward_pre_hook(lambda m, a, kw: None, with_kwargs=True)
    x, calls = torch.zeros(1), 20_000
    per_call = [(h - b) / calls for b, h in zip(
        timed(lambda: [bare(x, x, x) for _ in range(calls)], reps),
        timed(lambda: [hooked(x, x, x) for _ in range(calls)], reps), strict=True)]
    return max(0.0, statistics.median(per_call)) * 58


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="64,512", help="tokens per step, comma-separated")
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = build()
    blocks = [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    assert len(blocks) == 58 and blocks[0].experts.num_experts == 256
    dispatch = hook_dispatch_ms(args.reps)
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(1)
    print(f"## attach overhead, 58 MoE layers x 256 experts, top-8, {args.reps} reps\n")
    print("| tokens | model's routing (58 routers) ms | hooks + take() ms | of which take() "
          "alone | hook dispatch x58 | **added by attach** ms (quietest rep) | / routing | "
          "floor: bare bincount / scatter_add_ + dispatch, ms | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in tokens:
        ids = torch.randint(0, 256, (1, n), generator=gen)
        r = isolated(model, blocks, ids, args.reps, dispatch)
        verdict = "met" if r["added"] <= BUDGET_MS else "missed"
        print(f"| {n} | {r['route']:.2f} | {r['step']:.3f} | {r['take']:.3f} | {dispatch:.3f} | "
              f"**{r['added']:.3f}** ({r['added_min']:.3f}) | {r['added'] / r['route']:.4f} | "
              f"{r['bincount'] + dispatch:.3f} / {r['scatter'] + dispatch:.3f} | {verdict} |")

    ids = torch.randint(0, 256, (1, tokens[0]), generator=gen)

    def forward():
        with torch.no_grad():
            model(ids)

    plain, watched = [], []
    forward()  # warm-up
    for _ in range(args.reps):
        plain += timed(forward, 1)
        watch = attach(model)
        watched += timed(lambda w=watch: (forward(), w.take()), 1)
        watch.detach()
    p_plain, p_watched = statistics.median(plain), statistics.median(watched)
    print(f"\nend to end, {tokens[0]} tokens (noisy): forward without attach {p_plain:.1f} ms, "
          f"with attach + take() {p_watched:.1f} ms, ratio {p_watched / p_plain:.4f} "
          f"({p_watched - p_plain:+.1f} ms)")


if __name__ == "__main__":
    main()
