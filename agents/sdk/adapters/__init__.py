"""Adapters that watch expert loads in unmodified MoE models (transformers, DeepSpeed,
torchtitan, Megatron-Core, or any model following their patterns).

Training code uses :func:`moeplane.torch.attach` (:mod:`.watch`). :mod:`.sites` finds the MoE
layers by structure (:mod:`.deepspeed_moe` and :mod:`.megatron_core` add their finders);
:mod:`.transformers_layout` locates the parts of a transformers 5.x MoE model (also used by
expert parallelism for unmodified HF models).
"""
