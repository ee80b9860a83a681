"""Every agent test ends with none of its processes running (see ``procs.reap``)."""

from __future__ import annotations

import pytest

from tests.agents.procs import reap


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    yield
    reap()
