"""Two agents and ``moeplane simulate`` as real processes, against a real control plane
(``moeplane serve`` on SQLite)."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.procs import Proc
from tests.agents.procs import start_agent, stop_all, wait_path
from tests.agents.procs import start_simulate as start_sim_process
from tests.agents.server import Server

L, E, K, TOKENS, G = 2, 8, 2, 64, 2


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path).start()
    yield srv
    srv.close()


def parts(server: Server) -> list[tuple[int, str, str, str]]:
    """(step, node, ranks, missing ranks) of every stored load part of job j1."""
    return server.rows("SELECT step, node_id, ranks, missing_ranks FROM load_parts "
                       "WHERE job_id = 'j1' ORDER BY step, node_id")


def start_simulate(tmp_path, *extra: str) -> Proc:
    return start_sim_process(
        tmp_path, "--job-id", "j1", "--nodes", "2", "--gpus-per-node", str(G), "--layers", str(L),
        "--experts", str(E), "--top-k", str(K), "--tokens-per-step", str(TOKENS),
        "--step-time", "0.05", "--seed", "3",
        "--agent-socket-template", str(tmp_path / "{node}.sock"), *extra)


def test_simulated_job_reports_per_node_loads_and_applies_a_plan_on_every_rank(
        server, tmp_path):
    agents = [start_agent(tmp_path, server.port, f"node-{i}", "--job-id", "j1",
                          "--ranks", f"{i * G}-{i * G + G - 1}", "--step-deadline", "5")
              for i in range(2)]
    sim = None
    try:
        for i, a in enumerate(agents):
            wait_path(tmp_path / f"node-{i}.sock", a)
        sim = start_simulate(tmp_path)
        server.wait(lambda s: len(parts(s)) >= 2 * 5, what="5 steps of both nodes")
        # the job shape reached the control plane in a hello (mid-stream once ranks attached)
        job = server.api.get("/jobs/j1").json()
        assert (job["layers"], job["experts"], job["world_size"]) == (L, E, 2 * G)
        # a plan that moves experts around (a rotation of the identity placement)
        epoch = server.push_plan("j1", np.tile(np.roll(np.arange(E), 3), (L, 1)))
        server.wait(lambda s: s.plan("j1", epoch)["status"] == "applied", what="the plan applied")
        server.wait(lambda s: len(parts(s)) >= 2 * 20, what="20 steps of both nodes")
    finally:
        codes = stop_all(sim, *agents)
    assert codes == [0, 0, 0]
    events = server.api.get(f"/jobs/j1/plans/{epoch}").json()["events"]
    applied = {e["node_id"]: e["step"] for e in events if e["status"] == "node_applied"}
    assert set(applied) == {"node-0", "node-1"}
    assert len(set(applied.values())) == 1  # both nodes switched at the same step
    for step in range(20):
        assert [p[1:] for p in parts(server) if p[0] == step] == [
            ("node-0", "0,1", ""), ("node-1", "2,3", "")]
    loads = {r["step"]: np.array(r["counts"]) for r in server.api.get(
        "/jobs/j1/loads", params={"limit": 100}).json()}
    for step in range(20):
        assert (loads[step].sum(axis=1) == TOKENS * K * 2 * G).all()  # both nodes summed
    stats = server.api.get("/jobs/j1/steps", params={"limit": 1000}).json()
    for step in range(20):
        rows = [r for r in stats if r["step"] == step]
        assert len(rows) == 2 * G
        assert len({r["step_time_s"] for r in rows}) == 1  # synchronous ranks: one step time
        assert all(0 <= r["host_bound_ratio"] <= 1 and r["tokens"] == TOKENS for r in rows)


def test_a_rank_that_never_reports_is_listed_missing_after_the_deadline(server, tmp_path):
    # the agent expects ranks 0-2, the job has only ranks 0-1 on this node
    agent = start_agent(tmp_path, server.port, "node-0", "--job-id", "j1", "--ranks", "0-2",
                        "--step-deadline", "0.3")
    sim = None
    try:
        wait_path(tmp_path / "node-0.sock", agent)
        sim = start_simulate(tmp_path, "--steps", "3", "--nodes", "1")
        server.wait(parts, what="a load part")
        sim.popen.wait(30)  # its 3 steps done: it exits by itself
    finally:
        codes = stop_all(sim, agent)
    assert codes == [0, 0]
    assert parts(server)[0][1:] == ("node-0", "0,1", "2")


@pytest.mark.slow
def test_control_plane_outage_during_a_job_loses_no_step_and_stores_each_once(
        server, tmp_path):
    agents = [start_agent(tmp_path, server.port, f"node-{i}", "--job-id", "j1",
                          "--ranks", f"{i * G}-{i * G + G - 1}", "--step-deadline", "5")
              for i in range(2)]
    sim = None
    try:
        for i, a in enumerate(agents):
            wait_path(tmp_path / f"node-{i}.sock", a)
        sim = start_simulate(tmp_path, "--steps", "40")
        server.wait(lambda s: len(parts(s)) >= 2 * 5, what="5 steps of both nodes")
        server.stop()
        before = len(parts(server))
        assert sim.popen.wait(30) == 0  # the job ran on while the control plane was down
        server.start()
        server.wait(lambda s: len(parts(s)) == 2 * 40, what="every step of both nodes")
        server.wait(lambda s: s.rows("SELECT count(*) FROM step_stats")[0][0] == 2 * G * 40,
                    what="every rank's step statistics")
    finally:
        codes = stop_all(sim if sim is not None and sim.running() else None, *agents)
    assert codes[1:] == [0, 0]
    assert before < 2 * 40
    stored = parts(server)
    assert len({(p[0], p[1]) for p in stored}) == len(stored) == 2 * 40  # each step of each node once
    assert sorted({p[0] for p in stored}) == list(range(40))
    assert server.rows("SELECT count(*), sum(nodes_reported) FROM expert_loads "
                       "WHERE job_id = 'j1'") == [(40, 80)]  # every part summed once
