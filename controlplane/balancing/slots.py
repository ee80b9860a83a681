"""Plans that keep what stays: an expert that stays on a GPU keeps its slot (vLLM's rule).

A placement only says which experts each GPU holds; within a GPU the slot order is free. So a
plan can reorder each GPU's slots to leave every expert that stays on the GPU in the slot it
had, and a staying expert costs no copy at all, not even one within the GPU.

- ``keep_slots(reference, phy2log, gpus)``: ``phy2log [L, G*S]`` with each GPU's slots
  reordered so that the most slots keep ``reference [L, G*S]``'s expert;
- ``slot_changes(reference, phy2log, gpus)``: per layer, the slots that need a copy within their
  GPU: their expert changed, and the new one was already on that GPU (in another slot). Moves
  (``placement.count_moves``: an expert new to a GPU) are counted apart.
"""

from __future__ import annotations

import numpy as np

__all__ = ["keep_slots", "slot_changes"]


def _blocks(shape: tuple[int, int], gpus: int) -> np.ndarray:
    """``[L, G*S]`` index ``layer * G + gpu`` of each slot's GPU."""
    layers, num_slots = shape
    spg = num_slots // gpus
    return np.arange(layers)[:, None] * gpus + (np.arange(num_slots) // spg)[None, :]


def _occurrence(key: np.ndarray) -> np.ndarray:
    """For each element of ``key [L, N]`` (row-major), how many earlier elements share it."""
    flat = key.ravel()
    order = np.argsort(flat, kind="stable")
    sk = flat[order]
    occ = np.empty(flat.size, dtype=np.int64)
    occ[order] = np.arange(flat.size) - np.searchsorted(sk, sk, "left")
    return occ.reshape(key.shape)


def keep_slots(reference: np.ndarray, phy2log: np.ndarray, gpus: int) -> np.ndarray:
    """``phy2log [L, G*S]`` with every GPU's slots reordered to keep ``reference [L, G*S]``'s
    expert wherever the GPU still holds it: int64 ``[L, G*S]``, the same experts on every GPU.

    A slot keeps its expert when the GPU holds at least as many replicas of it in ``phy2log``
    as ``reference`` has in that slot and before it (slot order); the GPU's other experts fill
    its other slots in ``phy2log``'s order. Inputs are validated placements of one shape."""
    ref = np.asarray(reference, dtype=np.int64)
    new = np.asarray(phy2log, dtype=np.int64)
    experts = int(max(ref.max(initial=0), new.max(initial=0))) + 1
    blk = _blocks(new.shape, gpus)
    size = int(blk.max(initial=0) + 1) * experts
    ref_key, new_key = blk * experts + ref, blk * experts + new
    have_new = np.bincount(new_key.ravel(), minlength=size)
    have_ref = np.bincount(ref_key.ravel(), minlength=size)
    keep = _occurrence(ref_key) < have_new[ref_key]
    kept = np.minimum(have_new, have_ref)
    rest = _occurrence(new_key) >= kept[new_key]  # entries not placed by keeping a slot
    out = np.where(keep, ref, -1).ravel()
    # both in row-major order, hence by GPU, with as many of each per GPU
    out[np.flatnonzero(~keep.ravel())] = new.ravel()[np.flatnonzero(rest.ravel())]
    return out.reshape(new.shape)


def slot_changes(reference: np.ndarray, phy2log: np.ndarray, gpus: int) -> np.ndarray:
    """Copies within a GPU per layer: slots of ``phy2log [L, G*S]`` whose expert differs from
    ``reference [L, G*S]``'s and was on that GPU in ``reference``: int64 ``[L]``."""
    ref = np.asarray(reference, dtype=np.int64)
    new = np.asarray(phy2log, dtype=np.int64)
    experts = int(max(ref.max(initial=0), new.max(initial=0))) + 1
    blk = _blocks(new.shape, gpus)
    had = np.bincount((blk * experts + ref).ravel(), minlength=int(blk.max() + 1) * experts) > 0
    changed = new != ref
    return (changed & had[blk * experts + new]).sum(axis=1).astype(np.int64)
