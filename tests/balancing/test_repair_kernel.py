"""Helpers of the compiled repair kernel against plain numpy: top-k selection and the
holders of each expert. (The kernel as a whole is checked through ``repair_search`` in
``test_repair.py``.)"""

import subprocess
import sys

import numpy as np

from moeplane.controlplane.balancing.placement import gpu_expert_counts
from moeplane.controlplane.balancing.repair_primitives import _holders, _top


def test_top_k_is_largest_first_ties_to_the_lower_index_and_skips_minus_inf():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(0, 40))
        k = int(rng.integers(0, 12))
        vals = rng.integers(-3, 4, size=max(n, 1)).astype(np.float64)
        vals[rng.random(vals.shape) < 0.2] = -np.inf
        out = np.zeros(max(k, 1), dtype=np.int64)
        got = _top(vals, n, k, out)
        want = sorted((i for i in range(n) if vals[i] != -np.inf), key=lambda i: (-vals[i], i))
        assert list(out[:got]) == want[:k]


def test_holders_list_each_gpu_holding_an_expert_once_with_its_replicas():
    rng = np.random.default_rng(1)
    layers, gpus, spg, experts = 3, 6, 4, 10
    phy = rng.integers(0, experts, size=(layers, gpus * spg)).astype(np.int64)
    cnt = gpu_expert_counts(phy, gpus, experts).astype(np.int32)
    h_start = np.zeros(experts + 1, dtype=np.int64)
    h_g = np.zeros(gpus * spg, dtype=np.int64)
    h_c = np.zeros(gpus * spg, dtype=np.int64)
    for lay in range(layers):
        _holders(phy, cnt, lay, gpus, spg, experts, h_start, h_g, h_c,
                 np.zeros(experts, dtype=np.int64))
        for e in range(experts):
            gpus_e = h_g[h_start[e]:h_start[e + 1]]
            np.testing.assert_array_equal(gpus_e, np.nonzero(cnt[lay, :, e])[0])
            np.testing.assert_array_equal(h_c[h_start[e]:h_start[e + 1]], cnt[lay, gpus_e, e])


def _python(code: str) -> str:
    """Stdout of ``code`` run by a fresh interpreter (numba not yet imported)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_the_planner_does_not_load_numba():
    """The training SDK and the simulator import ``moeplane.controlplane.balancing``; only a process
    that runs the repair search pays for numba and LLVM."""
    assert _python("import sys, moeplane.controlplane.balancing; print('numba' in sys.modules)") == "False"


_CACHE_DIR_AFTER_IMPORT = (
    "os.environ.pop('NUMBA_CACHE_DIR', None)\n"
    "from moeplane.controlplane.balancing.repair import _kernel\n"
    "_kernel()\n"
    "print(os.environ.get('NUMBA_CACHE_DIR', 'unset'))\n"
)


def test_numba_cache_goes_to_a_temporary_directory_when_nothing_else_is_writable():
    """A read-only install run by a user without a home: numba would refuse to decorate the
    kernel (no cache locator); the planner points its cache at a temporary directory."""
    code = "import os; os.access = lambda *a, **k: False\n" + _CACHE_DIR_AFTER_IMPORT
    assert "moeplane-numba-" in _python(code)


def test_numba_cache_stays_beside_the_source_when_that_is_writable():
    assert _python("import os\n" + _CACHE_DIR_AFTER_IMPORT) == "unset"
