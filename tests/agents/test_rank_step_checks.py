"""A rank's step that ingest would refuse is refused at the agent, for that rank only.

Ingest rejects a whole node message when one rank's statistics are bad (negative tokens, a
timestamp that is not a unix time); the agent checks each rank's step first so one bad rank
costs only its own report and the node's other ranks still reach the control plane.
"""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from tests.agents.test_local_endpoint import Rank


def step(n: int, counts: np.ndarray, *, tokens: int = 9, timestamp: float = 1.7e9) -> pb.RankMessage:
    return pb.RankMessage(step=pb.RankStep(
        step=n, counts=encode_array(counts), timestamp=timestamp,
        stats=pb.RankStepStats(step_time_s=0.5, host_bound_ratio=0.25, tokens=tokens)))


@pytest.mark.parametrize("bad, field", [
    ({"tokens": -1}, "step.stats.tokens"),
    ({"timestamp": float("nan")}, "step.timestamp"),
    ({"timestamp": -5.0}, "step.timestamp"),
])
def test_bad_rank_statistics_are_refused_and_the_other_ranks_still_count(local_agent, bad, field):
    server, channel = local_agent
    r0, r1 = Rank(channel, 0), Rank(channel, 1)
    r0.outbox.put(step(3, np.full((2, 4), 2, np.int64), **bad))
    ack = next(r0.responses).ack
    assert ack.code == 3 and field in ack.message, ack.message
    r0.outbox.put(step(3, np.full((2, 4), 2, np.int64)))
    r1.outbox.put(step(3, np.full((2, 4), 5, np.int64)))
    loads = server.wait(lambda s: s.get("/jobs/j1/loads/latest"), what="step 3")
    assert loads["step"] == 3 and np.array_equal(loads["counts"], np.full((2, 4), 7))
    assert server.rows("SELECT ranks FROM load_parts WHERE job_id = 'j1'") == [("0,1",)]
    stats = server.wait(lambda s: len(got := (s.get("/jobs/j1/steps") or [])) == 2 and got,
                        what="both ranks' step statistics")
    assert sorted((r["rank"], r["tokens"]) for r in stats) == [(0, 9), (1, 9)]
    r0.close()
    r1.close()
