"""Group-limited placement: every replica of a group's experts on the node its group is on.

DeepSeek-V3-style models send each token to experts of a few groups only (node-limited
routing) and rely on each group sitting on one node. Experts ``g*E/K .. (g+1)*E/K-1`` form
group ``g`` of ``K``. As EPLB's hierarchical policy: per layer, the groups are packed onto the
nodes, ``K / N`` each, heaviest group first onto the lightest node that has room; then each
node's experts are placed on its own GPUs (``G / N`` GPUs, their slots only).

- ``node_of_group(loads, groups, nodes)``: ``[L, K]`` node of each group;
- ``grouped_placement(loads, gpus, slots_per_gpu, nodes, groups, place)``: ``phy2log [L, G*S]``
  with each node's part placed by ``place(node_loads [L, E_n], gpus_n, slots_per_gpu)``;
- ``eplb_hierarchical(...)``: the same with EPLB's greedy inside each node (the reference).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moeplane.controlplane.balancing.eplb import eplb_greedy

__all__ = ["check_groups", "eplb_hierarchical", "grouped_placement", "mapping_of",
           "node_of_group"]


def check_groups(groups: int, experts: int, gpus: int, slots_per_gpu: int, nodes: int) -> None:
    """ValueError naming ``groups`` unless K divides E, N divides K and every node's slots
    hold its groups' experts."""
    if experts % groups:
        raise ValueError(f"groups = {groups} does not divide the {experts} experts")
    if groups % nodes:
        raise ValueError(f"groups = {groups} is not a multiple of nodes = {nodes}")
    per_node = experts // nodes
    if (gpus // nodes) * slots_per_gpu < per_node:
        raise ValueError(
            f"groups = {groups}: a node's {gpus // nodes * slots_per_gpu} slots cannot hold "
            f"its {per_node} experts"
        )


def node_of_group(loads: np.ndarray, groups: int, nodes: int) -> np.ndarray:
    """Node of each group per layer: ``loads [L, E]`` -> int64 ``[L, K]``; each node gets
    ``K / N`` groups, the heaviest first onto the lightest node with room (ties: lowest)."""
    num_layers, experts = loads.shape
    group_load = loads.reshape(num_layers, groups, experts // groups).sum(axis=2)
    order = np.argsort(-group_load, axis=1, kind="stable")
    rows = np.arange(num_layers)
    node_load = np.zeros((num_layers, nodes))
    room = np.full((num_layers, nodes), groups // nodes)
    out = np.empty((num_layers, groups), dtype=np.int64)
    for k in range(groups):
        g = order[:, k]
        pick = np.argmin(np.where(room > 0, node_load, np.inf), axis=1)
        out[rows, g] = pick
        node_load[rows, pick] += group_load[rows, g]
        room[rows, pick] -= 1
    return out


def mapping_of(current: np.ndarray, gpus: int, slots_per_gpu: int, nodes: int,
               groups: int, experts: int) -> np.ndarray | None:
    """The node of each group in ``current [L, G*S]`` (int64 ``[L, K]``), or None unless every
    group's replicas are on one node and every node holds ``K / N`` groups."""
    num_layers, num_slots = current.shape
    node = (np.arange(num_slots) // slots_per_gpu) // (gpus // nodes)
    held = np.zeros((num_layers, groups, nodes), dtype=bool)
    held[np.arange(num_layers)[:, None], current // (experts // groups), node[None, :]] = True
    if (held.sum(axis=2) != 1).any():
        return None
    mapping = held.argmax(axis=2)
    counts = (mapping[:, :, None] == np.arange(nodes)).sum(axis=1)
    return mapping if (counts == groups // nodes).all() else None


def grouped_placement(
    loads: np.ndarray,
    gpus: int,
    slots_per_gpu: int,
    nodes: int,
    groups: int,
    place: Callable[..., np.ndarray],
    current: np.ndarray | None = None,
) -> np.ndarray:
    """``loads [L, E]`` -> ``phy2log [L, G*S]`` int64, each group on one node; node ``n``'s
    slots ``n*G/N*S .. (n+1)*G/N*S-1`` hold only its groups' experts, placed by
    ``place(node_loads, gpus_n, slots_per_gpu)``. With ``current [L, G*S]`` (whose groups
    each sit on one node: ``mapping_of``), the groups stay on their nodes and ``place`` also
    gets the node's current slots, in the node's own expert numbering, as ``current=``."""
    num_layers, experts = loads.shape
    size = experts // groups
    if current is None:
        mapping = node_of_group(loads, groups, nodes)  # [L, K]
    else:
        mapping = mapping_of(current, gpus, slots_per_gpu, nodes, groups, experts)
    per_node = gpus // nodes
    span = per_node * slots_per_gpu
    out = np.empty((num_layers, gpus * slots_per_gpu), dtype=np.int64)
    for n in range(nodes):
        mine = np.sort(np.argsort(mapping != n, axis=1, kind="stable")[:, : groups // nodes])
        ids = (mine[:, :, None] * size + np.arange(size)).reshape(num_layers, -1)  # [L, E_n]
        node_loads = np.take_along_axis(loads, ids, axis=1)
        if current is None:
            local = place(node_loads, per_node, slots_per_gpu)
        else:
            block = current[:, n * span:(n + 1) * span]
            mine_cur = np.stack([np.searchsorted(ids[lay], block[lay])
                                 for lay in range(num_layers)])
            local = place(node_loads, per_node, slots_per_gpu, current=mine_cur)
        out[:, n * span:(n + 1) * span] = np.take_along_axis(ids, local, axis=1)
    return out


def eplb_hierarchical(
    loads: np.ndarray, gpus: int, slots_per_gpu: int, nodes: int, groups: int
) -> np.ndarray:
    """EPLB's hierarchical policy: groups packed onto nodes, EPLB's greedy inside each node:
    ``loads [L, E]`` -> ``phy2log [L, G*S]``."""
    return grouped_placement(np.asarray(loads, dtype=np.float64), gpus, slots_per_gpu, nodes,
                             groups, eplb_greedy)
