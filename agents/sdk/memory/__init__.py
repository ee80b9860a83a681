"""Apply memory-offload decisions to a PyTorch model (the ``moeplane[torch]`` extra).

- :mod:`moeplane.agents.sdk.memory.swap` — activation swap to (pinned) host memory through
  ``torch.autograd.graph.saved_tensors_hooks``, with prefetch of the layer below in backward.
- :mod:`moeplane.agents.sdk.memory.recompute` — recomputation via
  ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.
- :mod:`moeplane.agents.sdk.memory.optimizer` — optimizer-state offload between steps.
- :mod:`moeplane.agents.sdk.memory.meter` — bytes of saved activations kept on the device, counted by
  hooks (the measurement that works on CPU too).
- :mod:`moeplane.agents.sdk.memory.apply` — ``apply_actions(layers, actions)`` wraps the chosen layers
  and returns a handle that reports what was saved and undoes everything.
"""

from moeplane.agents.sdk.memory.apply import AppliedMemory, MemoryReport, apply_actions

__all__ = ["AppliedMemory", "MemoryReport", "apply_actions"]
