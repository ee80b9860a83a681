"""NVML and npu-smi/hccn_tool collectors, fed at the hardware edge only."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from moeplane.agents import metrics as m
from moeplane.agents.collectors.ascend import (
    AscendCollector,
    NpuSmiParseError,
    parse_hccn_stat,
    parse_npu_smi_info,
)
from moeplane.agents.collectors.nvml import NvmlCollector

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def col(collector, values, name):
    return values[:, collector.metrics.index(name)]


# ---------------------------------------------------------------------- npu-smi


def test_parse_910b_eight_cards():
    chips = parse_npu_smi_info(fixture("npu-smi-info-910b-8.txt"))
    assert [c.device_index for c in chips] == list(range(8))
    c0 = chips[0]
    assert (c0.name, c0.health, c0.power_w, c0.temperature_c) == ("910B", "OK", 70.0, 34.0)
    assert (c0.aicore_percent, c0.hbm_used_mb, c0.hbm_total_mb) == (0.0, 1365.0, 32768.0)
    assert (c0.memory_used_mb, c0.memory_total_mb) == (1197.0, 13553.0)
    assert (c0.used_mb, c0.total_mb) == (1365.0, 32768.0)  # HBM is the device memory
    assert chips[7].bus_id == "0000:02:00.0" and chips[7].power_w == 65.6


def test_parse_310p_with_device_column_na_power_and_process_table():
    (chip,) = parse_npu_smi_info(fixture("npu-smi-info-310p3-na-power.txt"))
    assert (chip.npu_id, chip.device_index, chip.name) == (6, 0, "310P3")
    assert math.isnan(chip.power_w) and chip.temperature_c == 50.0
    assert (chip.used_mb, chip.total_mb) == (1839.0, 21525.0)
    two = parse_npu_smi_info(fixture("npu-smi-info-310p3-2.txt"))
    assert [(c.npu_id, c.device_index) for c in two] == [(0, 0), (1, 1)]


def test_parse_rejects_unrelated_text():
    with pytest.raises(NpuSmiParseError):
        parse_npu_smi_info("dcmi module initialize failed. ret is -8005\n")


def test_ascend_collector_pipeline_from_recorded_outputs():
    stat = fixture("hccn-tool-stat.txt")
    bumped = stat.replace("mac_tx_total_oct_num:412345678901",
                          "mac_tx_total_oct_num:412355678901")
    npu_smi = fixture("npu-smi-info-910b-8.txt")
    device0 = [stat, bumped]  # 10 MB more sent by device 0 between the two rounds

    def run(argv):
        if argv[0] == "npu-smi":
            return npu_smi
        assert argv[1:] in (["-i", argv[2], "-stat", "-g"],)
        return device0.pop(0) if argv[2] == "0" else stat

    c = AscendCollector("node-9", run=run, hccn_tool="hccn_tool")
    assert c.devices[3].device_id == "node-9/npu3" and c.devices[3].kind == "ascend"
    assert c.devices[0].memory_total_bytes == 32768 * m.MIB
    first = c.sample(100.0)
    second = c.sample(102.0)
    assert col(c, second, m.MEMORY_USED_BYTES)[0] == 1365 * m.MIB
    assert col(c, second, m.POWER_WATTS)[1] == 66.9
    assert (col(c, second, m.HEALTH_OK) == 1).all()
    assert math.isnan(col(c, first, m.ROCE_TX)[0])
    assert col(c, second, m.ROCE_TX)[0] == pytest.approx(10_000_000 / 2)
    assert col(c, second, m.ROCE_RX)[0] == 0.0
    assert parse_hccn_stat(stat)["roce_tx_err_pkt_num"] == 0


# ---------------------------------------------------------------------- NVML


class NVMLError(Exception):
    pass


class FakeNvml:
    """An NVML stand-in with pynvml's function names; two GPUs, one without ECC support."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.nvlink_kib = {0: [1000, 1000], 1: [0, 0]}
        self.pending_events: list = []

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return f"h{i}"

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=80 * m.GIB, used=12 * m.GIB, free=68 * m.GIB)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        return 61

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return 512_345  # milliwatts

    def nvmlDeviceGetPcieThroughput(self, h, counter):  # noqa: N802
        if h == "h1":
            raise NVMLError("Not Supported")
        return 2000 if counter == 0 else 3000  # KB/s

    def nvmlDeviceGetFieldValues(self, h, fields):  # noqa: N802
        i = int(h[1:])
        kib = self.nvlink_kib[i]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=kib[k]))
                for k in range(len(fields))]

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):  # noqa: N802
        if h == "h1":
            raise NVMLError("Not Supported")
        return 0

    def nvmlEventSetCreate(self):  # noqa: N802
        return "events"

    def nvmlDeviceRegisterEvents(self, h, types, events):  # noqa: N802
        pass

    def nvmlEventSetWait_v2(self, events, timeout_ms):  # noqa: N802
        if not self.pending_events:
            raise NVMLError("Timeout")
        return self.pending_events.pop(0)

    def nvmlEventSetFree(self, events):  # noqa: N802
        pass

    def nvmlShutdown(self):  # noqa: N802
        pass


def test_nvml_collector_pipeline_on_a_stand_in():
    nv = FakeNvml()
    c = NvmlCollector("node-1", nv)
    assert [d.device_id for d in c.devices] == ["node-1/gpu0", "node-1/gpu1"]
    assert c.devices[0].model == "NVIDIA H100 80GB HBM3" and c.devices[0].kind == "nvidia"
    first = c.sample(10.0)
    nv.nvlink_kib[0] = [1000 + 2 * 500_000, 1000 + 2 * 250_000]  # KiB over 2 s
    second = c.sample(12.0)
    assert col(c, second, m.UTILIZATION_RATIO).tolist() == [0.87, 0.87]
    assert col(c, second, m.POWER_WATTS)[0] == pytest.approx(512.345)
    assert col(c, second, m.PCIE_TX)[0] == 2000 * 1024
    assert math.isnan(col(c, second, m.PCIE_TX)[1])  # not supported on that GPU
    assert math.isnan(col(c, first, m.NVLINK_TX)[0])
    assert col(c, second, m.NVLINK_TX)[0] == pytest.approx(500_000 * 1024)
    assert col(c, second, m.NVLINK_RX)[0] == pytest.approx(250_000 * 1024)
    assert (col(c, second, m.HEALTH_OK) == 1).all()
    nv.pending_events.append(SimpleNamespace(device="h1", eventData=79))
    third = c.sample(13.0)
    assert col(c, third, m.HEALTH_OK).tolist() == [1.0, 0.0]
    assert col(c, c.sample(14.0), m.HEALTH_OK).tolist() == [1.0, 0.0]  # sticky


def test_nvml_collector_reads_a_real_gpu():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed "
                                 "(the moeplane[nvidia] extra)")
    try:
        c = NvmlCollector.open("node-real")
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU/driver here: {exc}")
    try:
        assert c.devices, "NVML reports no GPU"
        c.sample(0.0)
        values = c.sample(1.0)
        util = col(c, values, m.UTILIZATION_RATIO)
        assert ((util >= 0) & (util <= 1)).all()
        assert (col(c, values, m.MEMORY_TOTAL_BYTES) > 0).all()
        assert np.isfinite(col(c, values, m.TEMPERATURE_CELSIUS)).all()
    finally:
        c.close()
