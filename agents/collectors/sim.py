"""Synthetic accelerator devices whose metrics are consistent with each other.

Utilization is a slowly varying mean-reverting process; power follows utilization; the die
temperature lags power through a first-order thermal model; memory use drifts slowly below the
total; PCIe and NVLink traffic scale with utilization. Seeded; time comes in as ``now``.
"""

from __future__ import annotations

import numpy as np

from moeplane.agents import metrics as m
from moeplane.agents.collectors.base import Device

MODEL = "moeplane-sim H100-like 80GB"
MEMORY_TOTAL = 80 * m.GIB
IDLE_W, TDP_W = 70.0, 700.0
AMBIENT_C, C_PER_W, THERMAL_TAU_S = 30.0, 0.075, 30.0
PCIE_PEAK, NVLINK_PEAK = 25e9, 400e9

METRICS = (
    m.UTILIZATION_RATIO, m.MEMORY_USED_BYTES, m.MEMORY_TOTAL_BYTES, m.TEMPERATURE_CELSIUS,
    m.POWER_WATTS, m.PCIE_TX, m.PCIE_RX, m.NVLINK_TX, m.NVLINK_RX, m.HEALTH_OK,
)


class SimCollector:
    """``devices`` synthetic GPUs on node ``node_id`` (device ids ``{node}/gpu{i}``)."""

    metrics = METRICS

    def __init__(self, node_id: str, devices: int = 8, seed: int = 0,
                 util_tau_s: float = 60.0):
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        self.devices = [
            Device(m.device_id(node_id, "gpu", i), i, "sim", MODEL, MEMORY_TOTAL)
            for i in range(devices)
        ]
        self.rng = np.random.default_rng(seed)
        self.util_tau_s = util_tau_s
        self.util_mean = self.rng.uniform(0.55, 0.9, devices)
        self.util = self.util_mean.copy()
        self.mem_frac = self.rng.uniform(0.6, 0.85, devices)
        self.temp = AMBIENT_C + C_PER_W * (IDLE_W + (TDP_W - IDLE_W) * self.util)
        self.last: float | None = None

    def follow_host_bound(self, host_bound: dict[str, float]) -> None:
        """Let a device that runs a rank drift toward ``0.95 - host_bound_ratio`` utilization
        (a device waiting on its host computes less). host_bound: device_id -> [0, 1]."""
        for i, d in enumerate(self.devices):
            if d.device_id in host_bound:
                self.util_mean[i] = float(np.clip(0.95 - host_bound[d.device_id], 0.05, 1.0))

    def sample(self, now: float) -> np.ndarray:
        """[D, M] float64 of ``metrics`` at unix time ``now``."""
        D = len(self.devices)
        dt = 1.0 if self.last is None else max(1e-3, now - self.last)
        self.last = now
        a = min(1.0, dt / self.util_tau_s)
        noise = self.rng.standard_normal(D)
        self.util = np.clip(
            self.util + a * (self.util_mean - self.util) + 0.12 * np.sqrt(a) * noise, 0, 1
        )
        self.mem_frac = np.clip(
            self.mem_frac + 0.002 * np.sqrt(a) * self.rng.standard_normal(D), 0.3, 0.97
        )
        power = IDLE_W + (TDP_W - IDLE_W) * self.util ** 0.9 + self.rng.normal(0, 5.0, D)
        steady = AMBIENT_C + C_PER_W * power
        self.temp = self.temp + min(1.0, dt / THERMAL_TAU_S) * (steady - self.temp)
        jitter = self.rng.uniform(0.9, 1.1, (4, D))
        out = np.empty((D, len(METRICS)))
        out[:, 0] = self.util
        out[:, 1] = np.floor(self.mem_frac * MEMORY_TOTAL)
        out[:, 2] = MEMORY_TOTAL
        out[:, 3] = self.temp
        out[:, 4] = power
        out[:, 5] = PCIE_PEAK * 0.2 * self.util * jitter[0]
        out[:, 6] = PCIE_PEAK * 0.3 * self.util * jitter[1]
        out[:, 7] = NVLINK_PEAK * 0.5 * self.util * jitter[2]
        out[:, 8] = NVLINK_PEAK * 0.5 * self.util * jitter[3]
        out[:, 9] = 1.0
        return out

    def close(self) -> None:
        pass
