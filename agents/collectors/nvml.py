"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Per GPU: utilization, memory used/total, temperature, power, PCIe TX/RX throughput (NVML
reports KB/s), NVLink data throughput (cumulative KiB counters; reported as rates from
deltas), and health: 0 after an uncorrected volatile ECC error or a critical XID event (sticky
until the agent restarts). A call NVML does not support on this GPU yields NaN.

The NVML module is injected (``nvml``), so tests feed an NVML stand-in and run everything
after it for real.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from moeplane.agents import metrics as m
from moeplane.agents.collectors.base import Device, RateTracker

log = logging.getLogger(__name__)

METRICS = (
    m.UTILIZATION_RATIO, m.MEMORY_USED_BYTES, m.MEMORY_TOTAL_BYTES, m.TEMPERATURE_CELSIUS,
    m.POWER_WATTS, m.PCIE_TX, m.PCIE_RX, m.NVLINK_TX, m.NVLINK_RX, m.HEALTH_OK,
)
FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}


class NvmlCollector:
    """Every GPU NVML sees, as device ``{node}/gpu{index}``."""

    metrics = METRICS

    @classmethod
    def open(cls, node_id: str) -> NvmlCollector:
        import pynvml  # the moeplane[nvidia] extra

        pynvml.nvmlInit()
        return cls(node_id, pynvml)

    def __init__(self, node_id: str, nvml):
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                        for i in range(nvml.nvmlDeviceGetCount())]
        self.devices = []
        for i, h in enumerate(self.handles):
            name = nvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            total = int(nvml.nvmlDeviceGetMemoryInfo(h).total)
            self.devices.append(Device(m.device_id(node_id, "gpu", i), i, "nvidia", name, total))
        self.rates = RateTracker()
        self.unhealthy: set[int] = set()
        self.events = self._register_xid_events()

    def _call(self, fn, *args) -> float:
        try:
            return float(fn(*args))
        except self.nvml.NVMLError:
            return math.nan

    def _register_xid_events(self):
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
            for h in self.handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
            return events
        except nv.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            return None

    def _drain_xid_events(self) -> None:
        nv = self.nvml
        while self.events is not None:
            try:
                event = nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                return
            for i, h in enumerate(self.handles):
                if event.device == h:
                    if i not in self.unhealthy:
                        log.error("GPU %d: critical XID %s", i, event.eventData)
                    self.unhealthy.add(i)

    def _ecc_ok(self, h) -> bool:
        nv = self.nvml
        try:
            return nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC) == 0
        except nv.NVMLError:
            return True  # ECC not supported or disabled: no evidence of a fault

    def _nvlink_kib(self, h) -> tuple[float, float]:
        nv = self.nvml
        try:
            values = nv.nvmlDeviceGetFieldValues(h, [FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX])
        except nv.NVMLError:
            return math.nan, math.nan
        out = [float(v.value.ullVal) if v.nvmlReturn == 0 else math.nan for v in values]
        return out[0], out[1]

    def sample(self, now: float) -> np.ndarray:
        """[D, M] float64 of ``metrics``; NVLink rates are NaN on the first call."""
        nv = self.nvml
        self._drain_xid_events()
        out = np.full((len(self.handles), len(METRICS)), np.nan)
        for i, h in enumerate(self.handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
            except nv.NVMLError:
                util = math.nan
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                used, total = float(mem.used), float(mem.total)
            except nv.NVMLError:
                used = total = math.nan
            tx_kib, rx_kib = self._nvlink_kib(h)
            healthy = i not in self.unhealthy and self._ecc_ok(h)
            out[i] = [
                util, used, total,
                self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                self._call(nv.nvmlDeviceGetPowerUsage, h) / 1000.0,
                self._call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024,
                self._call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024,
                self.rates.rate(f"nvl_tx{i}", tx_kib * 1024, now) if tx_kib == tx_kib
                else math.nan,
                self.rates.rate(f"nvl_rx{i}", rx_kib * 1024, now) if rx_kib == rx_kib
                else math.nan,
                1.0 if healthy else 0.0,
            ]
        return out

    def close(self) -> None:
        nv = self.nvml
        try:
            if self.events is not None:
                nv.nvmlEventSetFree(self.events)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
