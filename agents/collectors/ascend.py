"""Ascend NPUs through ``npu-smi info`` and, where present, ``hccn_tool`` (RoCE counters).

The parsers are pure (text in, records out) and tested on recorded real outputs; the collector
runs the tools through an injectable ``run(argv) -> stdout``.

``npu-smi info`` prints one block per NPU: a line with the NPU id, name, health, power (W),
temperature (C) and hugepages, then one line per chip with the chip id, (on some models) the
logical device id, the bus id, AI Core utilization (%), ``Memory-Usage(MB)`` and (on
910-class models) ``HBM-Usage(MB)``. ``hccn_tool -i <dev> -stat -g`` prints ``name:value``
counters, among them ``mac_tx_total_oct_num`` / ``mac_rx_total_oct_num`` (bytes).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from moeplane.agents import metrics as m
from moeplane.agents.collectors.base import Device, RateTracker

METRICS = (
    m.UTILIZATION_RATIO, m.MEMORY_USED_BYTES, m.MEMORY_TOTAL_BYTES, m.TEMPERATURE_CELSIUS,
    m.POWER_WATTS, m.ROCE_TX, m.ROCE_RX, m.HEALTH_OK,
)

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


class NpuSmiParseError(ValueError):
    """``npu-smi info`` output this parser does not understand."""


@dataclass(frozen=True)
class NpuChip:
    """One chip of ``npu-smi info``. Memory in MiB as printed; NaN where the tool prints NA."""

    npu_id: int
    chip_id: int
    device_index: int
    name: str
    health: str
    power_w: float
    temperature_c: float
    aicore_percent: float
    memory_used_mb: float
    memory_total_mb: float
    hbm_used_mb: float
    hbm_total_mb: float
    bus_id: str

    @property
    def used_mb(self) -> float:
        """Device memory in use: HBM when the model reports it, else ``Memory-Usage``."""
        return self.hbm_used_mb if self.hbm_total_mb > 0 else self.memory_used_mb

    @property
    def total_mb(self) -> float:
        return self.hbm_total_mb if self.hbm_total_mb > 0 else self.memory_total_mb


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # "NA", "-"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_npu_smi_info(text: str) -> list[NpuChip]:
    """Chips listed by ``npu-smi info``, in output order. Raises NpuSmiParseError."""
    chips: list[NpuChip] = []
    npu: tuple[int, str, str, float, float] | None = None
    seen_header = False
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        if len(cells) < 3:
            continue
        if "Process id" in line or "Process name" in line:
            break  # the process table follows the device table
        if cells[0].startswith("NPU") or cells[0].startswith("Chip"):
            seen_header = True
            continue
        first = cells[0].split()
        if not first or not first[0].isdigit():
            continue
        if _BUS_ID.match(cells[1]):
            if npu is None:
                raise NpuSmiParseError(f"chip line before any NPU line: {line!r}")
            values = cells[2].split()
            aicore = _num(values[0]) if values else math.nan
            usages = [(float(a), float(b)) for a, b in _USAGE.findall(cells[2])]
            mem = usages[0] if usages else (math.nan, math.nan)
            hbm = usages[1] if len(usages) > 1 else (0.0, 0.0)
            chip_id = int(first[0])
            device_index = int(first[1]) if len(first) > 1 and first[1].isdigit() else npu[0]
            chips.append(NpuChip(npu[0], chip_id, device_index, npu[1], npu[2], npu[3], npu[4],
                                 aicore, mem[0], mem[1], hbm[0], hbm[1], cells[1]))
        else:
            values = cells[2].split()
            npu = (int(first[0]), " ".join(first[1:]), cells[1],
                   _num(values[0]) if values else math.nan,
                   _num(values[1]) if len(values) > 1 else math.nan)
    if not seen_header:
        raise NpuSmiParseError("no npu-smi device table header found")
    return chips


def parse_hccn_stat(text: str) -> dict[str, int]:
    """``name:value`` counters of ``hccn_tool -i <dev> -stat -g``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[name.strip()] = int(value.strip())
    return out


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10).stdout


class AscendCollector:
    """Every NPU chip of the node as device ``{node}/npu{device_index}``."""

    metrics = METRICS

    def __init__(self, node_id: str, run: Callable[[list[str]], str] = _run,
                 hccn_tool: str | None = None):
        self.run = run
        self.hccn_tool = hccn_tool if hccn_tool is not None else shutil.which("hccn_tool")
        chips = parse_npu_smi_info(run(["npu-smi", "info"]))
        if not chips:
            raise RuntimeError("npu-smi lists no NPU")
        self.devices = [
            Device(m.device_id(node_id, "npu", c.device_index), c.device_index, "ascend",
                   f"Ascend{c.name}", int(c.total_mb * m.MIB) if c.total_mb == c.total_mb
                   else 0)
            for c in chips
        ]
        self.rates = RateTracker()

    def _roce(self, index: int, now: float) -> tuple[float, float]:
        if not self.hccn_tool:
            return math.nan, math.nan
        try:
            stats = parse_hccn_stat(self.run([self.hccn_tool, "-i", str(index), "-stat", "-g"]))
        except (OSError, subprocess.SubprocessError):
            return math.nan, math.nan
        tx, rx = stats.get("mac_tx_total_oct_num"), stats.get("mac_rx_total_oct_num")
        return (math.nan if tx is None else self.rates.rate(f"tx{index}", tx, now),
                math.nan if rx is None else self.rates.rate(f"rx{index}", rx, now))

    def sample(self, now: float) -> np.ndarray:
        """[D, M] float64 of ``metrics``; a chip missing from this round's output is NaN."""
        chips = {c.device_index: c for c in parse_npu_smi_info(self.run(["npu-smi", "info"]))}
        out = np.full((len(self.devices), len(METRICS)), np.nan)
        for row, dev in enumerate(self.devices):
            c = chips.get(dev.index)
            if c is None:
                out[row, METRICS.index(m.HEALTH_OK)] = 0.0
                continue
            tx, rx = self._roce(dev.index, now)
            out[row] = [c.aicore_percent / 100.0, c.used_mb * m.MIB, c.total_mb * m.MIB,
                        c.temperature_c, c.power_w, tx, rx, 1.0 if c.health == "OK" else 0.0]
        return out

    def close(self) -> None:
        pass
