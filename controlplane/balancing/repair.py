"""Repair search: bring every GPU of each layer under a load level with the fewest moves.

Where ``search.local_search`` relieves the most loaded GPU of a layer, this search scores
every candidate step by how much it lowers the layer's *potential* per weighted move:

    sum_g max(0, load_g - level) + w * level * [load_g > level]

the total excess over the level plus ``_COUNT_WEIGHT`` (w) of the level for each GPU still
above it. A step that relieves several GPUs at once (one more replica of an expert whose
replicas sit on several GPUs above the level) counts for all of them, a step that pushes
another GPU over the level pays for it, and a step that brings a GPU under the level
outranks one that only trims the excess of several (what costs moves is the number of GPUs
still over the level). A layer with no step that lowers the potential goes on with the
excess alone (w = 0), and stops once no step lowers that either.

Candidates of an evaluation (numba loops in ``repair_kernel.py``, one layer at a time,
layers taking turns):

- *re-points*: a slot whose expert x has >= 2 replicas (the ``_SOURCES`` slots whose loss
  of x costs the least potential) gets one more replica of an expert y (the ``_Y_CHOICES``
  experts whose extra replica takes the most potential off their holders); x's other
  holders rise, y's holders drop, the slot's GPU trades its share of x for one of y;
- *swaps* of a slot of each of the ``_HEAVY`` most loaded GPUs (above the level) with a slot
  of the lightest GPUs (about ``_PARTNER_SLOTS`` slots).

Every candidate is scored exactly on the layer's current state: potential removed / weighted
moves (a move whose weights must come from another node costs ``1 + cross_weight``, and a
GPU that already receives more copies than the mean costs more: ``search.receive_weight``);
a step that costs no move is priced at ``_MIN_COST`` of one. An evaluation takes the best
step and then, best first, those scoring at least ``_KEEP`` of it that touch no GPU a step
taken before touches (the slot's GPU and the holders of both experts of a re-point, both
GPUs of a swap), whose exact scores therefore still hold.

A layer stops once its balancedness is at or below its level (``levels [L]``), when no step
lowers its excess, or after ``max_rounds`` evaluations. Every state is recorded as a
``search.Trajectory`` point, so the selection (``selection.py``) picks per layer how far to
go, as for ``local_search``.

The constants were chosen on the simulator's drift at 58x256 / 64x5 and 32x9 (seeds 0-3, two
windows) and the random-walk family: see docs/design-planner.md.

Shapes: L layers, E experts, G GPUs, S slots per GPU, N = G*S slots.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from moeplane.controlplane.balancing.placement import gpu_expert_counts
from moeplane.controlplane.balancing.search import RECEIVE_SMOOTH, Trajectory, node_holdings

__all__ = ["repair_search"]

_COUNT_WEIGHT = 0.06  # each GPU above the level also counts this share of the level
_SOURCES = 48  # slots a re-point may take, per evaluation (the cheapest donors)
_Y_CHOICES = 32  # candidate experts for a re-point, by the potential their replica removes
_PARTNER_SLOTS = 160  # slots of the lightest GPUs a heavy GPU may swap with, about
_HEAVY = 2  # most loaded GPUs whose slots are offered for swaps, per evaluation
_MIN_COST = 0.1  # a step that costs no move is scored as if it cost this share of a move
_KEEP = 0.4  # a further step of an evaluation needs this share of its best score
_BUFFER = 32  # best steps an evaluation keeps to choose from


def repair_search(
    loads: np.ndarray,
    start: np.ndarray,
    gpus: int,
    *,
    reference: np.ndarray,
    levels: np.ndarray,
    node_of_gpu: np.ndarray | None = None,
    cross_weight: float = 0.0,
    max_rounds: int,
) -> Trajectory:
    """Repair ``start [L, G*S]`` for ``loads [L, E]`` (float64, >= 0) toward ``levels [L]``
    (balancedness), counting moves against ``reference [L, G*S]``; at most ``max_rounds``
    evaluations per layer.

    ``node_of_gpu [G]``: node of each GPU, in blocks (GPU g on node g // (G / nodes); None:
    one node); a move whose expert no GPU of the destination's node held in the reference
    costs ``1 + cross_weight``. Returns the visited states (``Trajectory``: steps and points
    as ``local_search`` records them).
    """
    repair_layers = _kernel()
    w = np.ascontiguousarray(loads, dtype=np.float64)
    num_experts = w.shape[1]
    spg = start.shape[1] // gpus
    ref_has = gpu_expert_counts(reference, gpus, num_experts) > 0  # [L, G, E]
    if node_of_gpu is None:
        node_of_gpu = np.zeros(gpus, dtype=np.int64)
    node_of_gpu = np.ascontiguousarray(node_of_gpu, dtype=np.int64)
    node_has = node_holdings(ref_has, node_of_gpu)  # [L, nodes, E]
    steps, points = repair_layers(
        w, np.array(start, dtype=np.int64), ref_has, node_has, node_of_gpu,
        float(cross_weight), np.ascontiguousarray(levels, dtype=np.float64), int(gpus),
        int(max_rounds), float(_COUNT_WEIGHT), _SOURCES, _Y_CHOICES,
        -(-_PARTNER_SLOTS // spg), max(1, min(_HEAVY, gpus // 8)), float(_MIN_COST),
        float(_KEEP), _BUFFER, float(RECEIVE_SMOOTH),
    )
    return Trajectory(start=np.array(start, dtype=np.int64), steps=steps, points=points)


def _kernel():
    """``repair_kernel.repair_layers``, imported on first use: numba (and LLVM) load only in
    a process that plans incrementally, not in every importer of ``moeplane.controlplane.balancing``
    (the training SDK, the simulator).

    numba refuses to compile a cached function when it can write neither next to the source
    (``__pycache__``) nor in the user's cache directory, as for a read-only install run by a
    user without a home: numba's cache then goes to a temporary directory instead (an
    explicit ``NUMBA_CACHE_DIR`` always wins)."""
    if "numba" not in sys.modules and "NUMBA_CACHE_DIR" not in os.environ:
        here = os.path.dirname(os.path.abspath(__file__))
        if not (_writable(os.path.join(here, "__pycache__"))
                or _writable(os.path.join(os.path.expanduser("~"), ".cache", "numba"))):
            os.environ["NUMBA_CACHE_DIR"] = os.path.join(
                tempfile.gettempdir(), f"moeplane-numba-{os.getuid()}")
    from moeplane.controlplane.balancing.repair_kernel import repair_layers

    return repair_layers


def _writable(path: str) -> bool:
    """Whether ``path``, or the nearest of its parents that exists, is writable."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.access(path, os.W_OK)


def warm_up() -> None:
    """Compile the repair kernel now, or load it from numba's on-disk cache (about 8 s the
    first time on a machine, about 0.3 s in a later process, numba's import included): the
    first plan then runs at full speed."""
    gpus, spg, experts = 4, 3, 8
    loads = np.arange(1.0, 1.0 + 2 * experts).reshape(2, experts)
    start = np.tile(np.arange(gpus * spg) % experts, (2, 1)).astype(np.int64)
    repair_search(loads, start, gpus, reference=start, levels=np.ones(2), max_rounds=2)
