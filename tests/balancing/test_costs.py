"""The per-round cost tables give bitwise the costs of the per-lookup gathers."""

import numpy as np
import pytest

from moeplane.controlplane.balancing.costs import GAIN, LOSE, CostTables, pair_cost


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("cross_weight", [0.0, 0.5, 2.0])
def test_tables_match_pair_cost(nodes, weighted, cross_weight):
    rng = np.random.default_rng(nodes * 10 + weighted)
    layers, gpus, experts = 3, 8, 11
    code = rng.integers(0, 6, size=(layers, gpus, experts)).astype(np.int16)
    node_of_gpu = np.arange(gpus) // (gpus // nodes)
    node_has = None
    if nodes > 1:
        node_has = rng.random((layers, nodes, experts)) < 0.5
    gpu_weight = rng.random(gpus) * 2 + 0.1 if weighted else None
    tables = CostTables(node_has, node_of_gpu, cross_weight)
    tables.update(code, gpu_weight)
    lid = rng.integers(0, layers, size=200)
    g = rng.integers(0, gpus, size=200)
    e = rng.integers(0, experts, size=200)
    key = (lid * gpus + g) * experts + e
    args = (code, node_has, node_of_gpu, cross_weight, gpu_weight, lid)
    for table, which in ((tables.gain, GAIN), (tables.lose, LOSE)):
        expected = pair_cost(*args, g, e, which)
        assert np.array_equal(table[key], expected)
        assert table[key].tobytes() == expected.tobytes()
