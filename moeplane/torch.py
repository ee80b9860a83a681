"""The public SDK for training code (needs torch: the ``moeplane[torch]`` extra).

Everything a training job uses is imported from here; the modules behind it may change::

    from moeplane.torch import Reporter, ExpertParallelMoE, PlanApplier, MemoryOffload

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
  and batch staleness, sent through the reporter (``attach_rl(reporter.send_report, ...)``).
  They need no torch: ``moeplane.agents.sdk.rl`` imports without it.
"""

from moeplane.agents.sdk.applier import PlanApplier, PlanRejected
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
    "ExpertParallelMoE",
    "MemoryOffload",
    "PhaseRecorder",
    "PlanApplier",
    "PlanRejected",
    "Reporter",
    "attach_counter",
    "attach_rl",
    "consumed_batch",
    "detach_rl",
    "memory_breakdown",
    "moe_blocks",
    "phase",
    "policy_version",
    "sync_gradients",
    "weight_sync",
]
