"""A live control plane (real server on the shared loop) with a few hours of recent history."""

from __future__ import annotations

import math
import time

import pytest

from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.store import plans as P
from tests.controlplane.serverthread import running_server
from tests.history.data import EXPERTS, LAYERS, RANKS, fill

HOURS = 2.5


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('hist') / 'm.sqlite'}"
    # no controller: its own plans for job "j" would join the one the tests count
    with running_server(url, controller_interval_s=1e9) as srv:
        t0 = math.floor((time.time() - 3 * 3600) / 3600) * 3600
        srv["t0"] = t0
        srv["data"] = fill(srv["engine"], t0, HOURS * 3600)
        srv["epoch"] = P.create_plan(srv["engine"], "j", identity_placement(LAYERS, EXPERTS, RANKS * (EXPERTS // RANKS)),
                                     world_size=RANKS, slots_per_rank=EXPERTS // RANKS, reason="test")
        srv["base"] = f"http://127.0.0.1:{srv['http_port']}"
        yield srv
