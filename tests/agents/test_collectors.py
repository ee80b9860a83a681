from __future__ import annotations

import sys

import numpy as np
import pytest

from moeplane.agents import messages
from moeplane.agents import metrics as m
from moeplane.agents.collectors import make_collector
from moeplane.agents.collectors.host import HostCollector
from moeplane.agents.collectors.sim import SimCollector
from moeplane.controlplane.wire.arrays import decode_array


def column(c, values, name):
    return values[:, list(c.metrics).index(name)]


def test_sim_devices_are_consistent_slowly_varying_and_seeded():
    c = SimCollector("node-2", devices=8, seed=11)
    assert [d.device_id for d in c.devices][:2] == ["node-2/gpu0", "node-2/gpu1"]
    rounds = np.array([c.sample(1000.0 + t) for t in range(300)])  # [T, D, M]
    util = rounds[:, :, c.metrics.index(m.UTILIZATION_RATIO)]
    power = rounds[:, :, c.metrics.index(m.POWER_WATTS)]
    temp = rounds[:, :, c.metrics.index(m.TEMPERATURE_CELSIUS)]
    used = rounds[:, :, c.metrics.index(m.MEMORY_USED_BYTES)]
    total = rounds[:, :, c.metrics.index(m.MEMORY_TOTAL_BYTES)]
    assert ((util >= 0) & (util <= 1)).all()
    assert (used < total).all() and (used > 0).all()
    assert np.abs(np.diff(util, axis=0)).max() < 0.15           # slowly varying
    assert np.corrcoef(util.ravel(), power.ravel())[0, 1] > 0.9  # power follows utilization
    # temperature lags power: it correlates better with earlier power than with current power
    assert np.corrcoef(temp[30:].ravel(), power[:-30].ravel())[0, 1] > 0.5
    assert (temp > 25).all() and (temp < 95).all()
    assert (rounds[:, :, c.metrics.index(m.HEALTH_OK)] == 1).all()
    again = SimCollector("node-2", devices=8, seed=11)
    assert np.array_equal(again.sample(1000.0), rounds[0])


def test_sim_device_running_a_host_bound_rank_drifts_to_lower_utilization():
    c = SimCollector("n", devices=2, seed=3, util_tau_s=5.0)
    c.follow_host_bound({"n/gpu1": 0.6})
    rounds = np.array([c.sample(float(t)) for t in range(60)])
    util = rounds[-10:, :, c.metrics.index(m.UTILIZATION_RATIO)].mean(axis=0)
    assert util[1] == pytest.approx(0.35, abs=0.1) and util[0] > util[1] + 0.1


def fake_sys(root, tx, rx, ib_words=None):
    for nic, (t, r) in {"eth0": (tx, rx), "lo": (10**12, 10**12)}.items():
        d = root / "class" / "net" / nic / "statistics"
        d.mkdir(parents=True, exist_ok=True)
        (d / "tx_bytes").write_text(f"{t}\n")
        (d / "rx_bytes").write_text(f"{r}\n")
    if ib_words is not None:
        d = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
        d.mkdir(parents=True, exist_ok=True)
        (d / "port_xmit_data").write_text(f"{ib_words[0]}\n")
        (d / "port_rcv_data").write_text(f"{ib_words[1]}\n")


def test_host_collector_rates_from_sysfs_counters(tmp_path):
    fake_sys(tmp_path, 1000, 5000, ib_words=(100, 200))
    c = HostCollector("node-0", sys_root=tmp_path)
    first = c.sample(10.0)
    assert np.isnan(column(c, first, m.NET_TX)).all()  # no rate without a previous reading
    fake_sys(tmp_path, 3000, 6000, ib_words=(600, 1200))
    second = c.sample(12.0)
    assert column(c, second, m.NET_TX)[0] == pytest.approx(1000.0)  # lo is not counted
    assert column(c, second, m.NET_RX)[0] == pytest.approx(500.0)
    assert column(c, second, m.ROCE_TX)[0] == pytest.approx(1000.0)  # 4-byte words
    assert column(c, second, m.ROCE_RX)[0] == pytest.approx(2000.0)
    assert 0 <= column(c, second, m.UTILIZATION_RATIO)[0] <= 1
    assert column(c, second, m.MEMORY_USED_BYTES)[0] <= column(c, second,
                                                               m.MEMORY_TOTAL_BYTES)[0]
    assert c.devices[0].device_id == "node-0/host0" and c.devices[0].kind == "host"


def test_samples_message_leaves_out_columns_never_measured():
    values = np.array([[0.5, np.nan, 1.0], [0.6, np.nan, np.nan]])
    msg = messages.samples(5.0, ["a", "b"], ["x", "y", "z"], values).samples
    assert list(msg.metrics) == ["x", "z"]
    got = decode_array(msg.values, "v", shape=(2, 2), finite=False)
    assert got[0].tolist() == [0.5, 1.0] and np.isnan(got[1, 1])


def test_make_collector_names_the_bad_choice():
    with pytest.raises(ValueError, match="collector must be one of"):
        make_collector("tpu", "n")


def test_auto_detection_prefers_nvml_then_npu_smi_then_host(tmp_path, monkeypatch):
    from moeplane.agents.collectors import detect

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVIDIA driver bindings here
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect() == "host"
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    assert detect() == "ascend"
