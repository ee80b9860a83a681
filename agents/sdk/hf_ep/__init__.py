"""Expert parallelism for unmodified Hugging Face transformers MoE models.

- :func:`~moeplane.agents.sdk.hf_ep.parallel.expert_parallel` puts every MoE layer's experts into
  moeplane's expert-parallel slots in place and returns an
  :class:`~moeplane.agents.sdk.hf_ep.parallel.ExpertParallel` handle (gradients, live placement,
  control-plane connection);
- :class:`~moeplane.agents.sdk.hf_ep.slots.HFExpertSlots` is the module that replaces a family's
  experts module.
"""

from moeplane.agents.sdk.hf_ep.parallel import ExpertParallel, expert_parallel
from moeplane.agents.sdk.hf_ep.slots import HFExpertSlots

__all__ = ["ExpertParallel", "HFExpertSlots", "expert_parallel"]
