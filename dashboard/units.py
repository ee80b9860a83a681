"""Byte units for display: GiB for device memory, smaller units for small (CPU, test) devices."""

from __future__ import annotations

GIB = float(1 << 30)
MIB = float(1 << 20)
KIB = float(1 << 10)
UNITS = (("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def byte_unit(largest: float | None) -> tuple[str, float]:
    """(label, bytes per unit): the largest binary unit in which ``largest`` bytes is ≥ 1
    (GiB for anything from 1 GiB up or when nothing is known, down to B)."""
    if largest is None or largest != largest:
        return UNITS[0]
    for label, scale in UNITS:
        if abs(largest) >= scale:
            return label, scale
    return "B", 1.0


def fmt_bytes(value: float, unit: tuple[str, float] | None = None) -> str:
    """``value`` bytes as e.g. ``"70.4 GiB"`` or ``"24.0 MiB"``, in ``unit`` when given."""
    label, scale = unit or byte_unit(value)
    return f"{value / scale:.1f} {label}"
