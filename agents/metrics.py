"""Metric names (units in the name) and device identifiers shared by all collectors."""

from __future__ import annotations

UTILIZATION_RATIO = "utilization_ratio"
MEMORY_USED_BYTES = "memory_used_bytes"
MEMORY_TOTAL_BYTES = "memory_total_bytes"
TEMPERATURE_CELSIUS = "temperature_celsius"
POWER_WATTS = "power_watts"
HOST_BOUND_RATIO = "host_bound_ratio"
PCIE_TX = "pcie_tx_bytes_per_second"
PCIE_RX = "pcie_rx_bytes_per_second"
NVLINK_TX = "nvlink_tx_bytes_per_second"
NVLINK_RX = "nvlink_rx_bytes_per_second"
HCCS_TX = "hccs_tx_bytes_per_second"
HCCS_RX = "hccs_rx_bytes_per_second"
ROCE_TX = "roce_tx_bytes_per_second"
ROCE_RX = "roce_rx_bytes_per_second"
NET_TX = "net_tx_bytes_per_second"
NET_RX = "net_rx_bytes_per_second"
HEALTH_OK = "health_ok"
SPOOL_DROPPED_TOTAL = "agent_spool_dropped_total"

GIB = 1 << 30
MIB = 1 << 20


def device_id(node_id: str, kind: str, index: int) -> str:
    """Cluster-unique device id, e.g. ``device_id("node-0", "gpu", 3) == "node-0/gpu3"``."""
    return f"{node_id}/{kind}{index}"
