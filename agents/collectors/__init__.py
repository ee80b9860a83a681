"""Device collectors, chosen by name: ``sim``, ``host``, ``nvml``, ``ascend``."""

from __future__ import annotations

from agents.collectors.base import Collector, Device

NAMES = ("sim", "host", "nvml", "ascend")


def make_collector(name: str, node_id: str, *, devices: int = 8, seed: int = 0) -> Collector:
    """Build the collector called ``name`` for node ``node_id``."""
    if name == "sim":
        from agents.collectors.sim import SimCollector

        return SimCollector(node_id, devices=devices, seed=seed)
    if name == "host":
        from agents.collectors.host import HostCollector

        return HostCollector(node_id)
    if name == "nvml":
        from agents.collectors.nvml import NvmlCollector

        return NvmlCollector.open(node_id)
    if name == "ascend":
        from agents.collectors.ascend import AscendCollector

        return AscendCollector(node_id)
    raise ValueError(f"collector must be one of {', '.join(NAMES)}, got {name!r}")


__all__ = ["Collector", "Device", "NAMES", "make_collector"]
