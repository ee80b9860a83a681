"""Device collectors, chosen by name: ``sim``, ``host``, ``nvml``, ``ascend``, or ``auto``
(NVML when an NVIDIA driver answers, else Ascend when ``npu-smi`` is on the PATH, else host)."""

from __future__ import annotations

import logging
import shutil

from moeplane.agents.collectors.base import Collector, Device

log = logging.getLogger(__name__)

NAMES = ("auto", "sim", "host", "nvml", "ascend")


def detect() -> str:
    """The collector this machine supports best: ``nvml``, ``ascend`` or ``host``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        if count:
            return "nvml"
    except Exception as exc:  # noqa: BLE001 - no module, no driver, no GPU: all mean "not nvml"
        log.debug("NVML not usable: %s", exc)
    if shutil.which("npu-smi"):
        return "ascend"
    return "host"


def make_collector(name: str, node_id: str, *, devices: int = 8, seed: int = 0) -> Collector:
    """Build the collector called ``name`` for node ``node_id``."""
    if name == "auto":
        name = detect()
        log.info("collector: %s (detected)", name)
    if name == "sim":
        from moeplane.agents.collectors.sim import SimCollector

        return SimCollector(node_id, devices=devices, seed=seed)
    if name == "host":
        from moeplane.agents.collectors.host import HostCollector

        return HostCollector(node_id)
    if name == "nvml":
        from moeplane.agents.collectors.nvml import NvmlCollector

        return NvmlCollector.open(node_id)
    if name == "ascend":
        from moeplane.agents.collectors.ascend import AscendCollector

        return AscendCollector(node_id)
    raise ValueError(f"collector must be one of {', '.join(NAMES)}, got {name!r}")


__all__ = ["Collector", "Device", "NAMES", "make_collector"]
