"""Adapters that watch expert loads in unmodified MoE models (transformers, torchtitan, ...).

Training code uses :func:`moeplane.torch.attach`; see :mod:`.watch`.
"""
