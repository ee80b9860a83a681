"""Two agents and ``moeplane simulate`` as real processes, against the fake control plane."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.procs import Proc
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array, encode_array
from tests.agents.fake_ingest import FakeIngest
from tests.agents.procs import start_agent, stop_all, wait_path
from tests.agents.procs import start_simulate as start_sim_process
from tests.conftest import free_port

L, E, K, TOKENS, G = 2, 8, 2, 64, 2


@pytest.fixture
def ingest():
    server = FakeIngest(free_port()).start()
    yield server
    server.stop()


def start_simulate(tmp_path, *extra: str) -> Proc:
    return start_sim_process(
        tmp_path, "--job-id", "j1", "--nodes", "2", "--gpus-per-node", str(G), "--layers", str(L),
        "--experts", str(E), "--top-k", str(K), "--tokens-per-step", str(TOKENS),
        "--step-time", "0.05", "--seed", "3",
        "--agent-socket-template", str(tmp_path / "{node}.sock"), *extra)


def plan_reports(store, state):
    return sorted((node, m.plan_report.epoch, m.plan_report.step)
                  for (node, _), m in store.stored.items()
                  if m.WhichOneof("body") == "plan_report" and m.plan_report.state == state)


def test_simulated_job_reports_per_node_loads_and_applies_a_plan_on_every_rank(
        ingest, tmp_path):
    agents = [start_agent(tmp_path, ingest.port, f"node-{i}", "--job-id", "j1",
                          "--ranks", f"{i * G}-{i * G + G - 1}", "--step-deadline", "5")
              for i in range(2)]
    sim = None
    try:
        for i, a in enumerate(agents):
            wait_path(tmp_path / f"node-{i}.sock", a)
        sim = start_simulate(tmp_path)
        ingest.wait_for(lambda s: len(s.loads) >= 2 * 5)
        # a plan that moves experts around (a rotation of the identity placement)
        phy2log = np.tile(np.roll(np.arange(E, dtype=np.int64), 3), (L, 1))
        ingest.send_plan(pb.PlacementPlan(job_id="j1", epoch=1, phy2log=encode_array(phy2log),
                                          slots_per_rank=E // (2 * G), not_before_step=8))
        applied = ingest.wait_for(lambda s: len(plan_reports(s, pb.PLAN_STATE_APPLIED)) == 2
                                  and plan_reports(s, pb.PLAN_STATE_APPLIED))
        ingest.wait_for(lambda s: len(s.loads) >= 2 * 20)
    finally:
        codes = stop_all(sim, *agents)
    assert codes == [0, 0, 0]
    store = ingest.store
    # the job shape reached the control plane in a hello (mid-stream once ranks attached)
    shapes = {(h.node_id, h.job.layers, h.job.experts, h.job.world_size) for h in store.hellos}
    assert ("node-0", L, E, 2 * G) in shapes and ("node-1", L, E, 2 * G) in shapes
    received = plan_reports(store, pb.PLAN_STATE_RECEIVED)
    assert [(n, e) for n, e, _ in received] == [("node-0", 1), ("node-1", 1)]
    # both nodes switched at the same step, no earlier than not_before_step
    assert applied[0][2] == applied[1][2] >= 8
    steps_by_node = {n: sorted(s for (_, node, s) in store.loads if node == n)
                     for n in ("node-0", "node-1")}
    for node, (ranks, steps) in zip(("node-0", "node-1"),
                                    (([0, 1], steps_by_node["node-0"]),
                                     ([2, 3], steps_by_node["node-1"])), strict=True):
        assert steps[:20] == list(range(20)), node
        for step in steps[:20]:
            msg = store.loads[("j1", node, step)]
            assert list(msg.ranks) == ranks and list(msg.missing_ranks) == []
            counts = decode_array(msg.counts, "counts", shape=(L, E))
            assert (counts.sum(axis=1) == TOKENS * K * G).all()
    stats = store.step_stats
    for step in range(20):
        rows = [stats[("j1", step, r)] for r in range(2 * G)]
        assert len({r.step_time_s for r in rows}) == 1  # synchronous ranks: one step time
        assert all(0 <= r.host_bound_ratio <= 1 and r.tokens == TOKENS for r in rows)


def test_a_rank_that_never_reports_is_listed_missing_after_the_deadline(ingest, tmp_path):
    # the agent expects ranks 0-2, the job has only ranks 0-1 on this node
    agent = start_agent(tmp_path, ingest.port, "node-0", "--job-id", "j1", "--ranks", "0-2",
                        "--step-deadline", "0.3")
    sim = None
    try:
        wait_path(tmp_path / "node-0.sock", agent)
        sim = start_simulate(tmp_path, "--steps", "3", "--nodes", "1")
        ingest.wait_for(lambda s: len(s.loads) >= 1)
        sim.popen.wait(30)  # its 3 steps done: it exits by itself
    finally:
        codes = stop_all(sim, agent)
    assert codes == [0, 0]
    msg = next(iter(ingest.store.loads.values()))
    assert list(msg.missing_ranks) == [2]


@pytest.mark.slow
def test_control_plane_outage_during_a_job_loses_no_step_and_stores_each_once(
        ingest, tmp_path):
    agents = [start_agent(tmp_path, ingest.port, f"node-{i}", "--job-id", "j1",
                          "--ranks", f"{i * G}-{i * G + G - 1}", "--step-deadline", "5")
              for i in range(2)]
    sim = None
    try:
        for i, a in enumerate(agents):
            wait_path(tmp_path / f"node-{i}.sock", a)
        sim = start_simulate(tmp_path, "--steps", "40")
        ingest.wait_for(lambda s: len(s.loads) >= 2 * 5)
        ingest.stop()
        before = len(ingest.store.loads)
        assert sim.popen.wait(30) == 0  # the job ran on while the control plane was down
        ingest.start()
        ingest.wait_for(lambda s: len(s.loads) == 2 * 40 and len(s.step_stats) == 2 * G * 40)
    finally:
        codes = stop_all(sim if sim is not None and sim.running() else None, *agents)
    assert codes[1:] == [0, 0]
    store = ingest.store
    assert before < 2 * 40
    kinds = [(node, m.WhichOneof("body"), m.loads.step) for (node, _), m in store.stored.items()
             if m.WhichOneof("body") == "loads"]
    assert len(kinds) == len(set(kinds)) == 2 * 40  # every step of every node stored once
    assert sorted({s for (_, _, s) in store.loads}) == list(range(40))
