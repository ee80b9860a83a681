"""The expert placement planner: ``plan_placement`` and the ``Plan`` it returns.

Fresh (no ``current``): EPLB's greedy (``eplb.py``) refined by local search (``search.py``),
never less balanced than EPLB's greedy on the same loads.

Incremental (with ``current``), by default (``search="repair"``): ``repair.repair_search``
from ``current`` works on every GPU above EPLB's greedy + ``tolerance`` on the new loads,
taking the steps that remove the most excess load per move. The visited states are then
chosen across layers steepest balance-per-move first, until the mean balancedness is within
``tolerance`` of EPLB's greedy (``select_mean``). A layer that the selection leaves more than
``reshuffle_above`` above EPLB's greedy takes the most balanced state its search reached; if
that too is above, EPLB's greedy with its GPUs renumbered to keep as many of the current
(GPU, expert) pairs as possible (``match_gpus``).

With ``max_moves``, or with ``search="relieve"``, the search is ``search.local_search``: per
layer, the step with the most balance per move for its most loaded GPUs (each layer stops
``tolerance / 2`` above EPLB's greedy, or, once the goal is in reach, when its steps get
flatter than the selection needs). With ``max_moves`` the states are chosen to spend the
budget where it buys the most balance (``select_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.balancing.eplb import eplb_greedy
from moeplane.controlplane.balancing.groups import check_groups, grouped_placement, mapping_of
from moeplane.controlplane.balancing.placement import (
    gpu_loads,
    identity_placement,
    layer_balancedness,
    match_gpus,
    replica_counts,
)
from moeplane.controlplane.balancing.repair import repair_search
from moeplane.controlplane.balancing.search import local_search
from moeplane.controlplane.balancing.selection import select_budget, select_mean
from moeplane.controlplane.balancing.slots import keep_slots, slot_changes
from moeplane.controlplane.balancing.transfers import plan_transfers
from moeplane.controlplane.balancing.validate import check_count, check_loads, check_placement

__all__ = ["SEARCHES", "Plan", "fresh_placement", "plan_placement", "runs_repair"]

_LAYER_STOP = 0.5  # a layer's search stops this share of the tolerance above its fresh plan
SEARCHES = ("repair", "relieve")  # incremental searches, the default first
_FRESH_ROUNDS = 4  # local-search rounds after EPLB greedy (each: one step per layer)


@dataclass(frozen=True, eq=False)
class Plan:
    """A placement decision, as data. Arrays are read-only.

    - ``phy2log [L, G*S]`` int64: logical expert of each physical slot;
    - ``replica_counts [L, E]`` int64: replicas of each logical expert;
    - ``gpu_loads [L, G]`` float64: predicted tokens per GPU under ``phy2log``;
    - ``layer_balancedness_before / _after [L]``: max / mean GPU load per layer, of the
      baseline (``current``, or the identity placement ``slot % E`` when there is none) and
      of ``phy2log``; ``balancedness_before / _after``: their means;
    - ``moves_per_layer [L]``, ``moves``: (GPU, logical expert) pairs new against the
      baseline, i.e. expert weights copied onto a GPU; ``cross_node_moves``: those whose
      weights come from another node;
    - ``transfers [M, 4]`` int64 rows (layer, destination slot, logical expert, source GPU),
      one per move; ``cross_node [M]`` bool per transfer;
    - ``slot_changes_per_layer [L]``, ``slot_changes``: slots needing a copy within their GPU
      (their expert changed to one the GPU already held), counted apart from moves. An
      incremental plan keeps every staying expert in its slot (``slots.keep_slots``), so these
      are only the extra replicas a GPU makes of an expert it holds.
    """

    phy2log: np.ndarray
    replica_counts: np.ndarray
    gpu_loads: np.ndarray
    layer_balancedness_before: np.ndarray
    layer_balancedness_after: np.ndarray
    balancedness_before: float
    balancedness_after: float
    moves_per_layer: np.ndarray
    moves: int
    cross_node_moves: int
    transfers: np.ndarray
    cross_node: np.ndarray
    gpus: int
    slots_per_gpu: int
    nodes: int
    incremental: bool
    slot_changes_per_layer: np.ndarray
    slot_changes: int


def fresh_placement(loads: np.ndarray, gpus: int, slots_per_gpu: int) -> np.ndarray:
    """EPLB greedy then local search: ``loads [L, E]`` float64 -> ``phy2log [L, G*S]``.

    Expects validated input (see ``plan_placement``)."""
    start = eplb_greedy(loads, gpus, slots_per_gpu)
    traj = local_search(loads, start, gpus, max_steps=_FRESH_ROUNDS)
    return traj.placement(np.full(loads.shape[0], np.iinfo(np.int64).max))


def runs_repair(incremental: bool, max_moves: int | None, search: str) -> bool:
    """Whether ``plan_placement`` with these arguments runs ``repair.repair_search`` (the
    compiled search): incremental, no ``max_moves``, ``search="repair"``."""
    return incremental and max_moves is None and search == "repair"


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


def plan_placement(
    loads: np.ndarray,
    *,
    gpus: int,
    slots_per_gpu: int,
    nodes: int = 1,
    current: np.ndarray | None = None,
    max_moves: int | None = None,
    tolerance: float = 0.01,
    reshuffle_above: float = 0.05,
    cross_node_weight: float = 0.5,
    search: str = "repair",
    groups: int | None = None,
) -> Plan:
    """Place ``loads [L, E]`` (tokens per logical expert; float or int, finite, >= 0) on
    ``gpus`` GPUs of ``slots_per_gpu`` slots each (G*S >= E), spread over ``nodes`` nodes
    (G divisible by nodes; GPU g on node g // (G / nodes)).

    ``current [L, G*S]`` integer: the placement in force; given, the plan is incremental.
    ``max_moves``: most moves in total (needs ``current``). ``tolerance``: an incremental
    plan stops once its mean balancedness is within this of EPLB's greedy on ``loads``.
    ``reshuffle_above``: a layer left more than this above EPLB's greedy takes its search's
    best state, or if still above, EPLB's greedy with GPUs renumbered (only without
    ``max_moves``). ``cross_node_weight``: extra cost of a cross-node move when ranking
    steps (0: none). ``search``: how an incremental plan without ``max_moves`` finds its
    steps, ``"repair"`` (``repair.repair_search``: every GPU above EPLB's greedy +
    ``tolerance``, by the steps that remove the most excess per move; the default) or
    ``"relieve"`` (``search.local_search``: the most loaded GPUs of each layer first; more
    moves for the same balance). ``groups`` = K: experts ``g*E/K .. (g+1)*E/K-1`` form
    group ``g``, and every replica of a group stays on one node (``groups.grouped_placement``:
    groups packed onto nodes as EPLB's hierarchical policy, then each node planned on its own
    GPUs; with ``current`` whose groups each sit on one node, each node incrementally, else a
    fresh grouped plan; not with ``max_moves``). Pure and deterministic. Raises ValueError
    naming the argument on bad input.
    """
    w = check_loads(loads)
    gpus = check_count("gpus", gpus)
    slots_per_gpu = check_count("slots_per_gpu", slots_per_gpu)
    nodes = check_count("nodes", nodes)
    num_layers, num_experts = w.shape
    num_slots = gpus * slots_per_gpu
    if num_slots < num_experts:
        raise ValueError(
            f"gpus * slots_per_gpu = {num_slots} is fewer than the {num_experts} experts in loads"
        )
    if gpus % nodes:
        raise ValueError(f"nodes = {nodes} does not divide gpus = {gpus}")
    for name, value in (
        ("tolerance", tolerance),
        ("reshuffle_above", reshuffle_above),
        ("cross_node_weight", cross_node_weight),
    ):
        if not (isinstance(value, int | float) and np.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if max_moves is not None:
        max_moves = check_count("max_moves", max_moves, minimum=0)
        if current is None:
            raise ValueError("max_moves needs current (a fresh plan has no moves to limit)")
    cur = None
    if current is not None:
        cur = check_placement("current", current, num_layers, num_slots, num_experts)
    if groups is not None:
        groups = check_count("groups", groups)
        check_groups(groups, num_experts, gpus, slots_per_gpu, nodes)
        if max_moves is not None:
            raise ValueError("groups: max_moves is not supported with groups")

    baseline = cur if cur is not None else identity_placement(num_layers, num_experts, num_slots)
    if groups is not None:
        keeps = cur is not None and mapping_of(
            cur, gpus, slots_per_gpu, nodes, groups, num_experts) is not None
        if keeps:  # each node planned incrementally on its own GPUs
            def place(node_loads, node_gpus, spg, current):
                return plan_placement(
                    node_loads, gpus=node_gpus, slots_per_gpu=spg, current=current,
                    tolerance=tolerance, reshuffle_above=reshuffle_above, search=search,
                ).phy2log
            new = grouped_placement(w, gpus, slots_per_gpu, nodes, groups, place, cur)
        else:  # fresh, or a current placement that splits a group: regroup from scratch
            new = grouped_placement(w, gpus, slots_per_gpu, nodes, groups, fresh_placement)
    elif cur is None:
        new = fresh_placement(w, gpus, slots_per_gpu)
    else:
        # the incremental reference is EPLB's greedy alone: local search would tighten the
        # target it sets and cost as much time again
        fresh = eplb_greedy(w, gpus, slots_per_gpu)
        new = _incremental(
            w, cur, fresh, gpus, nodes, max_moves, tolerance, reshuffle_above, cross_node_weight,
            search,
        )

    if cur is not None:
        new = keep_slots(cur, new, gpus)
    per_gpu = gpu_loads(w, new, gpus)
    before = layer_balancedness(gpu_loads(w, baseline, gpus))
    after = layer_balancedness(per_gpu)
    transfers, cross = plan_transfers(baseline, new, gpus, num_experts, nodes)
    moves = np.bincount(transfers[:, 0], minlength=num_layers)  # one transfer per move
    changes = slot_changes(baseline, new, gpus)
    return Plan(
        phy2log=_readonly(new),
        replica_counts=_readonly(replica_counts(new, num_experts)),
        gpu_loads=_readonly(per_gpu),
        layer_balancedness_before=_readonly(before),
        layer_balancedness_after=_readonly(after),
        balancedness_before=float(before.mean()),
        balancedness_after=float(after.mean()),
        moves_per_layer=_readonly(moves),
        moves=int(moves.sum()),
        cross_node_moves=int(cross.sum()),
        transfers=_readonly(transfers),
        cross_node=_readonly(cross),
        gpus=gpus,
        slots_per_gpu=slots_per_gpu,
        nodes=nodes,
        incremental=cur is not None,
        slot_changes_per_layer=_readonly(changes),
        slot_changes=int(changes.sum()),
    )


def _incremental(
    w: np.ndarray,
    cur: np.ndarray,
    fresh: np.ndarray,
    gpus: int,
    nodes: int,
    max_moves: int | None,
    tolerance: float,
    reshuffle_above: float,
    cross_node_weight: float,
    search: str,
) -> np.ndarray:
    num_layers = w.shape[0]
    num_slots = cur.shape[1]
    fresh_bal = layer_balancedness(gpu_loads(w, fresh, gpus))
    node_of_gpu = np.arange(gpus) // (gpus // nodes)
    if runs_repair(True, max_moves, search):
        traj = repair_search(
            w, cur, gpus, reference=cur, node_of_gpu=node_of_gpu,
            cross_weight=cross_node_weight if nodes > 1 else 0.0,
            levels=fresh_bal + tolerance,
            max_rounds=max(8, num_slots // 2),
        )
    else:
        traj = local_search(
            w,
            cur,
            gpus,
            reference=cur,
            node_of_gpu=node_of_gpu,
            cross_weight=cross_node_weight if nodes > 1 else 0.0,
            target=fresh_bal + _LAYER_STOP * tolerance,
            goal=None if max_moves is not None else float(fresh_bal.mean()) + tolerance,
            max_steps=max(8, num_slots // 2),
        )
    pts = traj.points
    layer = pts[:, 0].astype(np.int64)
    steps = pts[:, 1].astype(np.int64)
    cost = pts[:, 2]
    bal = pts[:, 3]
    if max_moves is not None:
        pick = select_budget(layer, cost, bal, num_layers, max_moves)
        return traj.placement(steps[pick])
    pick = select_mean(layer, cost, bal, num_layers, float(fresh_bal.mean()) + tolerance)
    limit = fresh_bal + reshuffle_above
    stuck = bal[pick] > limit
    if stuck.any():
        # a layer the selection left far above its fresh plan first takes the most balanced
        # state its search reached (fewest moves among equals); only a layer that local
        # steps cannot bring within the limit takes EPLB's greedy (a full reshuffle)
        order = np.lexsort((cost, bal, layer))
        first = np.searchsorted(layer[order], np.arange(num_layers))
        best = order[first]
        pick = np.where(stuck & (bal[best] <= limit), best, pick)
        stuck = bal[pick] > limit
    new = traj.placement(steps[pick])
    if stuck.any():
        new[stuck] = match_gpus(cur[stuck], fresh[stuck], gpus, w.shape[1])
    return new

