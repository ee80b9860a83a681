"""Input checks for the planner. Every error is a ``ValueError`` naming the argument."""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["check_count", "check_loads", "check_placement"]


def check_count(name: str, value: object, *, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def check_loads(loads: object) -> np.ndarray:
    """``loads [L, E]`` of real numbers, finite and non-negative -> float64 copy."""
    arr = np.asarray(loads)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise ValueError(f"loads must be a float or integer array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"loads must have shape [layers, experts], got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"loads must have at least one layer and one expert, got {arr.shape}")
    out = arr.astype(np.float64)
    if not np.isfinite(out).all():
        raise ValueError("loads must be finite (found NaN or infinity)")
    if (out < 0).any():
        raise ValueError("loads must be non-negative")
    return out


def check_placement(
    name: str, placement: object, num_layers: int, num_slots: int, num_experts: int
) -> np.ndarray:
    """``placement [L, G*S]`` of integer expert ids in ``[0, E)``, every expert present in
    every layer -> int64 copy."""
    arr = np.asarray(placement)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.shape != (num_layers, num_slots):
        raise ValueError(
            f"{name} must have shape [layers, gpus*slots_per_gpu] = "
            f"[{num_layers}, {num_slots}], got {arr.shape}"
        )
    out = arr.astype(np.int64)
    if out.size and (out.min() < 0 or out.max() >= num_experts):
        raise ValueError(f"{name} holds expert ids outside [0, {num_experts})")
    flat = out + (np.arange(num_layers, dtype=np.int64) * num_experts)[:, None]
    present = np.bincount(flat.ravel(), minlength=num_layers * num_experts) > 0
    missing = np.nonzero(~present.reshape(num_layers, num_experts))
    if missing[0].size:
        layer, expert = int(missing[0][0]), int(missing[1][0])
        raise ValueError(
            f"{name} leaves logical expert {expert} of layer {layer} without a replica"
        )
    return out
