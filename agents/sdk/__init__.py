"""In-process SDK that training code imports (PyTorch; the ``moeplane[torch]`` extra).

Modules, each imported on its own so that ``import moeplane.agents.sdk`` stays free of torch:

- :mod:`moeplane.agents.sdk.placement` — pure numpy placement arithmetic (replica tables, per-rank loads,
  balancedness, a greedy rebalancer, migration sources).
- :mod:`moeplane.agents.sdk.moe` — expert slots over the ranks (``ExpertSlots``: placement,
  dispatch, replica gradients), the expert-parallel MoE block (``ExpertParallelMoE``) and
  ``sync_gradients``.
- :mod:`moeplane.agents.sdk.hf_ep` — ``expert_parallel``: an unmodified transformers MoE model's
  experts in those slots, with live placement changes.
- :mod:`moeplane.agents.sdk.comm` — differentiable ``all_to_all`` and batched point-to-point exchange.
- :mod:`moeplane.agents.sdk.reporter` — per-step load counts and step statistics, sent to the node agent
  by a background thread (gRPC ``NodeLocal.Attach`` over a Unix socket).
- :mod:`moeplane.agents.sdk.applier` — validates placement plans, agrees on the switch step, migrates
  expert weights and optimizer state between ranks.
"""
