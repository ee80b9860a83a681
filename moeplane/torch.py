"""The public SDK for training code (needs torch: the ``moeplane[torch]`` extra).

Everything a training job uses is imported from here; the modules behind it may change::

    from moeplane.torch import Reporter, ExpertParallelMoE, PlanApplier, MemoryOffload

- :func:`attach` — watches the expert loads of an unmodified MoE model (transformers 5.x,
  or any model whose experts module is called with ``top_k_index`` or whose router returns
  expert ids): ``watch = attach(model, reporter=reporter)``; ``watch.take()`` gives ``[L, E]``.
- :func:`expert_parallel` — puts an unmodified transformers 5.x MoE model's experts into
  expert-parallel slots over the ranks, in place: ``ep = expert_parallel(model,
  slots_per_rank=S)``; ``ep.sync_gradients()``, ``ep.apply(phy2log, optimizer=opt)``.
- :class:`Reporter` — per-step expert loads, step statistics and memory profiles, handed to a
  background sender that talks to the node agent over its Unix socket; never blocks a step.
- :class:`ExpertParallelMoE`, :func:`moe_blocks`, :func:`attach_counter`,
  :func:`sync_gradients` — the expert-parallel MoE block, its load counter and the gradient
  reduction over ranks and replicas.
- :class:`PlanApplier`, :class:`PlanRejected` — validates a pushed placement, agrees on the
  switch step with every rank and migrates expert weights and optimizer state.
- :class:`MemoryOffload`, :func:`memory_breakdown` — applies memory-offload decisions
  (activation swap, recomputation, optimizer-state offload) and reports what they saved.
- :func:`attach_rl`, :func:`phase`, :func:`policy_version`, :func:`consumed_batch`,
  :func:`weight_sync`, :class:`PhaseRecorder` — RL post-training phase spans, policy versions
  and batch staleness, sent through the reporter (``attach_rl(reporter.send_report, ...)``);
  with ``attach_rl(..., watch=attach(model))`` an MoE policy's expert loads by phase too
  (rollout beside training). They need no torch: ``moeplane.agents.sdk.rl`` imports without it.
"""

from moeplane.agents.sdk.adapters.watch import Watch, WatchError, attach
from moeplane.agents.sdk.applier import PlanApplier, PlanRejected
from moeplane.agents.sdk.hf_ep import ExpertParallel, expert_parallel
from moeplane.agents.sdk.memory.runner import MemoryOffload
from moeplane.agents.sdk.moe import ExpertParallelMoE, attach_counter, moe_blocks, sync_gradients
from moeplane.agents.sdk.reporter import Reporter, memory_breakdown
from moeplane.agents.sdk.rl import (
    PhaseRecorder,
    attach_rl,
    consumed_batch,
    detach_rl,
    phase,
    policy_version,
    weight_sync,
)

__all__ = [
    "ExpertParallel",
    "ExpertParallelMoE",
    "MemoryOffload",
    "PhaseRecorder",
    "PlanApplier",
    "PlanRejected",
    "Reporter",
    "Watch",
    "WatchError",
    "attach",
    "attach_counter",
    "attach_rl",
    "consumed_batch",
    "detach_rl",
    "expert_parallel",
    "memory_breakdown",
    "moe_blocks",
    "phase",
    "policy_version",
    "sync_gradients",
    "weight_sync",
]
