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
"""

from moeplane.agents.sdk.applier import PlanApplier, PlanRejected
from moeplane.agents.sdk.memory.runner import MemoryOffload
from moeplane.agents.sdk.moe import ExpertParallelMoE, attach_counter, moe_blocks, sync_gradients
from moeplane.agents.sdk.reporter import Reporter, memory_breakdown

__all__ = [
    "ExpertParallelMoE",
    "MemoryOffload",
    "PlanApplier",
    "PlanRejected",
    "Reporter",
    "attach_counter",
    "memory_breakdown",
    "moe_blocks",
    "sync_gradients",
]
