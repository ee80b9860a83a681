"""A simulated job that declares expert groups (``moeplane simulate --groups K``), end to end
with real processes: ``moeplane serve``, one ``moeplane agent`` per node; every plan the
controller makes and the job applies keeps each group's replicas on one node."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.procs import spawn, start_serve, wait_until

NODES, GPN, L, E, K, TOP_K, TOKENS = 2, 4, 4, 12, 4, 2, 256  # S = ceil(12 / 8) = 2
pytestmark = pytest.mark.slow


def nodes_of_groups(phy2log: np.ndarray) -> list[list[set[int]]]:
    node = np.arange(phy2log.shape[1]) // (phy2log.shape[1] // NODES)
    group = phy2log // (E // K)
    return [[set(node[group[lay] == g].tolist()) for g in range(K)] for lay in range(L)]


def test_simulated_job_with_groups_applies_plans_that_keep_them(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 'g.sqlite'}")
    procs = [serve]
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        for i in range(NODES):
            procs.append(spawn(f"agent-{i}", [
                "agent", "--node-id", f"node-{i}", "--server", serve.grpc, "--collector", "sim",
                "--devices", str(GPN), "--job-id", "grouped",
                "--ranks", f"{i * GPN}-{(i + 1) * GPN - 1}",
                "--local-socket", str(tmp_path / f"a{i}.sock"),
                "--spool-dir", str(tmp_path / f"spool{i}"), "--interval", "0.2"], tmp_path))
        sim = spawn("simulate", [
            "simulate", "--job-id", "grouped", "--nodes", str(NODES), "--gpus-per-node", str(GPN),
            "--layers", str(L), "--experts", str(E), "--top-k", str(TOP_K), "--groups", str(K),
            "--tokens-per-step", str(TOKENS), "--step-time", "0.1", "--steps", "30",
            "--agent-socket-template", str(tmp_path / "a{i}.sock")], tmp_path)
        procs.append(sim)
        assert sim.popen.wait(120) == 0, sim.output()
        job = api.get("/jobs/grouped").json()
        assert (job["groups"], job["ranks_per_node"], job["world_size"]) == (K, GPN, NODES * GPN)
        applied = wait_until(lambda: [p for p in api.get("/jobs/grouped/plans").json()
                                      if p["status"] == "applied"], 30, "an applied plan")
        # the identity placement the job started with splits groups 0 and 1 over both nodes
        ident = np.tile(np.arange(NODES * GPN * 2) % E, (L, 1))
        assert any(len(n) == 2 for row in nodes_of_groups(ident) for n in row)
        for plan in applied:
            phy2log = np.array(api.get(f"/jobs/grouped/plans/{plan['epoch']}").json()["phy2log"])
            where = nodes_of_groups(phy2log)
            assert all(len(n) == 1 for row in where for n in row), (plan["epoch"], where)
    finally:
        api.close()
        for p in reversed(procs):
            p.stop()
