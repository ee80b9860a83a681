"""REST ``/rl/timeline``: spans stored through the store's RL writer (SQLite and PostgreSQL,
whose column read is a binary COPY), binned over a real server; every cell equals the stored
spans' durations clipped to its bin, and bad input is a 4xx."""

from __future__ import annotations

import httpx
import numpy as np

from harness.simjob import SimJob
from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store.writes import StoreWriter
from tests.controlplane.serverthread import running_server


def test_binned_timeline_matches_the_stored_spans(database_url):
    rng = np.random.default_rng(5)
    n = 500
    step = rng.integers(0, 8, n)
    rank = rng.integers(-1, 6, n)  # -1: the job's per-step timers get their own row
    start = 1000.0 + step * 40.0 + rng.uniform(0, 30, n)
    end = start + rng.exponential(6.0, n)
    spans = Spans.build(step, rank, step, rng.integers(0, len(PHASES), n), rng.integers(0, 3, n), start, end,
                        np.zeros(n, dtype=int))
    with running_server(database_url) as srv:
        SimJob(StoreWriter(srv["engine"]), job_id="job-1", nodes=1).hello(1000.0)  # the job's row
        store_rl.save_report(srv["engine"], "job-1", "node-0", spans)
        with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/job-1/rl",
                          timeout=20) as api:
            got = api.get("/timeline", params={"step_start": 2, "step_end": 7, "bins": 30}).json()
            assert api.get("/timeline", params={"step_start": 2, "step_end": 7, "bins": 0}).status_code == 422
            assert api.get("/timeline", params={"step_start": 7, "step_end": 2}).status_code == 422
    m = (step >= 2) & (step < 7)
    assert got["spans"] == int(m.sum()) and got["ranks"] == sorted(set(rank[m].tolist()))
    t0, width = got["t0"], got["width_s"]
    assert t0 == start[m].min() and np.isclose(t0 + 30 * width, end[m].max())
    edges = t0 + width * np.arange(31)
    want = np.zeros((len(got["ranks"]), 30, len(PHASES)))
    for r, p, s, e in zip(rank[m], spans.phase[m], start[m], end[m], strict=True):
        overlap = np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0, None)
        want[got["ranks"].index(int(r)), :, p] += overlap
    np.testing.assert_allclose(got["busy_s"], want.sum(axis=2), rtol=0, atol=1e-6)
    top = np.where(want.sum(axis=2) > 0, want.argmax(axis=2), -1)
    assert got["dominant"] == top.tolist()
    roles = {int(k): max(int(x) for x in spans.role[m][rank[m] == k]) for k in set(rank[m].tolist())}
    assert got["roles"] == [ROLES[roles[k]] for k in got["ranks"]]
