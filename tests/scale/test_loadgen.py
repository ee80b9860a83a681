"""The load generator against a real control plane over gRPC: what it reports acknowledged is
exactly what the store holds; bad configuration names its argument."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from moeplane.controlplane.loadgen import messages
from moeplane.controlplane.loadgen.config import LoadgenConfig
from moeplane.controlplane.loadgen.runner import run_async, split
from moeplane.controlplane.loadgen.stats import merge, summary
from moeplane.controlplane.store import queries as q
from tests import aio
from tests.controlplane.serverthread import running_server


def small(port: int, **kw) -> LoadgenConfig:
    base = dict(targets=(f"127.0.0.1:{port}",), job_id="lg", nodes=3, ranks_per_node=2, layers=4,
                experts=8, step_time_s=0.25, sample_interval_s=0.2, metrics=3, duration_s=1.0)
    return LoadgenConfig(**(base | kw))


@pytest.mark.parametrize("per_rank", [True, False])
def test_acknowledged_loads_and_samples_are_stored(database_url, per_rank):
    with running_server(database_url) as srv:
        cfg = small(srv["grpc_port"], per_rank=per_rank)
        out = summary(merge([aio.run(run_async(cfg))]))
        engine = srv["engine"]
        steps = q.loads_history(engine, "lg", q.Range(), None)
    assert out["errors"] == {} and out["duplicates"] == 0, out
    assert out["sent"] == out["acked"], out
    parts = cfg.nodes * (cfg.ranks_per_node if per_rank else 1)
    assert out["acked"]["loads"] == 4 * parts  # 4 steps of 0.25 s in 1 s
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    pool = messages.count_pool(cfg)
    for r in steps:
        assert r["nodes_reported"] == parts
        want = np.zeros((4, 8), np.int64)
        for n in range(cfg.nodes):
            for g in messages.loads(cfg, n, r["step"], 0.0, pool):
                want += np.frombuffer(g.counts.data, dtype="<i4").reshape(4, 8)
        np.testing.assert_array_equal(r["counts"], want)
    assert out["counters_acked"] == 4 * parts * 32
    frames = out["acked"]["samples"]
    assert frames >= cfg.nodes * 4
    assert q.sample_count(srv["engine"]) == frames * cfg.ranks_per_node * cfg.metrics


def test_split_covers_every_node_once():
    cfg = LoadgenConfig(nodes=10)
    parts = split(cfg, 3, start_at=5.0)
    ids = [p.node_id(n) for p in parts for n in range(p.node_offset, p.node_offset + p.nodes)]
    assert ids == [cfg.node_id(n) for n in range(10)]
    assert {p.total_nodes for p in parts} == {10} and {p.start_at for p in parts} == {5.0}


@pytest.mark.parametrize(("kw", "name"), [
    ({"nodes": 0}, "nodes"), ({"step_time_s": -1}, "step_time_s"), ({"dtype": "float32"}, "dtype"),
    ({"targets": ()}, "targets"),
])
def test_bad_config_names_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        LoadgenConfig(**kw)


def test_cli_rejects_bad_input_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "moeplane.controlplane.cli.main", "loadgen", "--nodes", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nodes" in r.stderr
