"""The SDK's placement checks and slot tables (no torch)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from moeplane.agents.sdk.placement import (
    PlacementError,
    check_phy2log,
    migration_sources,
    replica_table,
)


def test_replica_table_lists_slots_per_expert_in_order():
    slots, count = replica_table(np.array([2, 0, 2, 1, 2, 0]), 4)
    assert count.tolist() == [2, 1, 3, 0]
    assert slots.tolist() == [[1, 5, -1], [3, -1, -1], [0, 2, 4], [-1, -1, -1]]


def test_migration_sources_copy_locally_when_possible_and_spread_remote_reads():
    old = np.array([0, 1, 2, 3, 0, 1])  # S=2: rank0 {0,1} rank1 {2,3} rank2 {0,1}
    new = np.array([1, 0, 0, 2, 0, 3])
    src = migration_sources(old, new, 2)
    assert src[0] == 1 and src[1] == 0  # rank 0 keeps both, swapped locally
    assert src[3] == 2  # rank 1 keeps expert 2
    assert old[src[2]] == 0 and src[2] // 2 != 1  # expert 0 fetched from a holder
    assert src[4] == 4 and src[5] == 3  # rank 2 keeps 0 locally, fetches 3 from rank 1
    assert (old[src] == new).all()


@pytest.mark.parametrize(
    ("phy2log", "message"),
    [
        (np.zeros((1, 3), dtype=np.int64), "shape"),
        (np.array([[0, 1, 2, 9]]), "unknown expert id 9"),
        (np.array([[0, 1, 2, 2]]), "no slot for expert"),
        (np.array([[0.0, 1.0, 2.0, 3.0]]), "not an integer"),
    ],
)
def test_check_phy2log_names_what_is_wrong(phy2log, message):
    with pytest.raises(PlacementError, match=message) as info:
        check_phy2log(phy2log, layers=1, experts=4, world_size=2, slots_per_rank=2)
    assert info.value.field == "phy2log"


def test_importing_the_sdk_package_does_not_import_torch():
    code = "import sys, moeplane.agents.sdk, moeplane.agents.sdk.placement; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
