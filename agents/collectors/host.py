"""The host itself as one device (``{node}/host0``): CPU, memory, NIC and InfiniBand traffic.

CPU and memory come from psutil; traffic is the rate of the cumulative byte counters under
``/sys/class/net/*/statistics`` (loopback excluded) and
``/sys/class/infiniband/*/ports/*/counters/port_{xmit,rcv}_data`` (4-byte words).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moeplane.agents import metrics as m
from moeplane.agents.collectors.base import Device, RateTracker

METRICS = (
    m.UTILIZATION_RATIO, m.MEMORY_USED_BYTES, m.MEMORY_TOTAL_BYTES, m.NET_TX, m.NET_RX,
    m.ROCE_TX, m.ROCE_RX, m.HEALTH_OK,
)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def net_bytes(sys_root: Path) -> tuple[int, int]:
    """Total (tx, rx) bytes over all NICs but loopback, from ``sys_root/class/net``."""
    tx = rx = 0
    for nic in sorted((sys_root / "class" / "net").glob("*")):
        if nic.name == "lo":
            continue
        tx += _read_int(nic / "statistics" / "tx_bytes") or 0
        rx += _read_int(nic / "statistics" / "rx_bytes") or 0
    return tx, rx


def infiniband_bytes(sys_root: Path) -> tuple[int, int] | None:
    """Total (tx, rx) bytes over all InfiniBand/RoCE ports, or None without any."""
    ports = sorted((sys_root / "class" / "infiniband").glob("*/ports/*/counters"))
    if not ports:
        return None
    tx = sum((_read_int(p / "port_xmit_data") or 0) for p in ports) * 4
    rx = sum((_read_int(p / "port_rcv_data") or 0) for p in ports) * 4
    return tx, rx


class HostCollector:
    """One ``host`` device; ``sys_root`` is ``/sys`` except in tests."""

    metrics = METRICS

    def __init__(self, node_id: str, sys_root: str | Path = "/sys"):
        import psutil

        self._psutil = psutil
        self.sys_root = Path(sys_root)
        total = int(psutil.virtual_memory().total)
        self.devices = [Device(m.device_id(node_id, "host", 0), 0, "host", "host", total)]
        self.rates = RateTracker()
        psutil.cpu_percent(interval=None)  # prime: the next call measures since now

    def sample(self, now: float) -> np.ndarray:
        """[1, M] float64 of ``metrics``; rates are NaN on the first call."""
        vm = self._psutil.virtual_memory()
        tx, rx = net_bytes(self.sys_root)
        ib = infiniband_bytes(self.sys_root)
        nan = float("nan")
        row = [
            self._psutil.cpu_percent(interval=None) / 100.0,
            float(vm.total - vm.available),
            float(vm.total),
            self.rates.rate("net_tx", tx, now),
            self.rates.rate("net_rx", rx, now),
            self.rates.rate("ib_tx", ib[0], now) if ib else nan,
            self.rates.rate("ib_rx", ib[1], now) if ib else nan,
            1.0,
        ]
        return np.array([row], dtype=np.float64)

    def close(self) -> None:
        pass
