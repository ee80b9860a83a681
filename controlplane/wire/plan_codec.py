"""``PlacementPlan`` on the wire: narrow dtypes, deltas, and the receiving side.

A placement is ``phy2log[L, G*S]``: the logical expert held by each physical slot. A full plan
carries it in the smallest integer dtype holding its largest id (uint8 for E <= 256, so a
58 x 1,024-slot plan is 59 KB instead of 475 KB as int64). A delta (``base_epoch > 0``) carries
only the slots that changed against the plan of epoch ``base_epoch`` that the same stream
delivered last: ``changed_slots[K]`` (flat row-major indices into ``[L, G*S]``, strictly
increasing) and ``changed_experts[K]``, so a plan that moves K slots costs O(K) bytes.

The sender (``moeplane.controlplane.ingest.planpush``) builds both variants once per published plan;
each receiver of ``Ingest.Connect`` keeps a :class:`PlanReceiver` per stream.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array, encode_array


class UnknownBase(WireError):
    """A delta against a plan this receiver does not hold (it must not be applied)."""


def narrow_dtype(low: int, high: int) -> np.dtype:
    """Smallest wire dtype holding every integer in ``[low, high]``: uint8, uint16, int32, int64."""
    if low >= 0 and high < 1 << 8:
        return np.dtype(np.uint8)
    if low >= 0 and high < 1 << 16:
        return np.dtype(np.uint16)
    if low >= -(1 << 31) and high < 1 << 31:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def encode_narrow(array: np.ndarray) -> pb.NDArray:
    """Pack an integer array in the smallest dtype holding its values (see :func:`narrow_dtype`)."""
    arr = np.asarray(array)
    if arr.dtype.kind not in "iu":
        raise WireError("dtype", f"{arr.dtype} is not an integer type")
    dtype = narrow_dtype(int(arr.min()), int(arr.max())) if arr.size else np.dtype(np.uint8)
    return encode_array(arr.astype(dtype, copy=False))


def full_plan(job_id: str, epoch: int, phy2log: np.ndarray, slots_per_rank: int,
              not_before_step: int) -> pb.PlacementPlan:
    """A full plan: ``phy2log[L, G*S]`` (any integer dtype) sent in its narrowest dtype."""
    return pb.PlacementPlan(job_id=job_id, epoch=epoch, phy2log=encode_narrow(phy2log),
                            slots_per_rank=slots_per_rank, not_before_step=not_before_step)


def delta_plan(plan: pb.PlacementPlan, phy2log: np.ndarray, base_epoch: int,
               base: np.ndarray) -> pb.PlacementPlan | None:
    """The delta of full ``plan`` (its placement ``phy2log[L, G*S]``) against ``base[L, G*S]``,
    the placement of epoch ``base_epoch``; None when the shapes differ (only a full plan fits)."""
    if base.shape != phy2log.shape or not 0 < base_epoch < plan.epoch:
        return None
    changed = np.flatnonzero(phy2log.reshape(-1) != base.reshape(-1))
    return pb.PlacementPlan(
        job_id=plan.job_id, epoch=plan.epoch, slots_per_rank=plan.slots_per_rank,
        not_before_step=plan.not_before_step, base_epoch=base_epoch,
        changed_slots=encode_narrow(changed),
        changed_experts=encode_narrow(phy2log.reshape(-1)[changed]),
    )


def decode_full(plan: pb.PlacementPlan) -> np.ndarray:
    """``phy2log[L, G*S]`` of a full plan: a writable copy in its wire dtype (any integer
    dtype; uint8 for E <= 256 from the control plane, so the copy is L*G*S bytes). Raises
    WireError naming the field when it is not a plan at all (shape, dtype, negative ids)."""
    if plan.base_epoch:
        raise WireError("plan.base_epoch", f"a delta (base_epoch {plan.base_epoch}) where a full plan is required")
    if plan.slots_per_rank < 1:
        raise WireError("plan.slots_per_rank", f"must be >= 1, got {plan.slots_per_rank}")
    arr = decode_array(plan.phy2log, "plan.phy2log", ndim=2, kinds="iu", nonnegative=True)
    if arr.shape[1] % plan.slots_per_rank:
        raise WireError("plan.phy2log.shape",
                        f"{arr.shape[1]} slots is not a multiple of slots_per_rank {plan.slots_per_rank}")
    return np.array(arr)  # own the bytes: the message may go, the placement stays


class PlanReceiver:
    """The receiving end of one ``Ingest.Connect`` stream: turns each plan, full or delta, into
    the full placement and keeps it as the base of the next delta. One per stream: a new stream
    starts with no base (the control plane sends its first plan in full)."""

    def __init__(self) -> None:
        self.job_id = ""
        self.epoch = 0
        self.slots_per_rank = 0
        self.phy2log: np.ndarray | None = None  # [L, G*S], the last plan received

    def receive(self, plan: pb.PlacementPlan) -> np.ndarray:
        """Full ``phy2log[L, G*S]`` of ``plan``, a new array in the smallest integer dtype that
        held its ids on the wire (uint8 for E <= 256; ``astype(np.int64)`` where int64 is
        wanted); it becomes the base of the next delta.

        Raises :class:`UnknownBase` for a delta against a plan this stream did not deliver
        last, WireError naming the field for a malformed one. The base is then unchanged.
        """
        full = self._apply_delta(plan) if plan.base_epoch else decode_full(plan)
        self.job_id, self.epoch, self.slots_per_rank = plan.job_id, plan.epoch, plan.slots_per_rank
        self.phy2log = full
        return full

    def _apply_delta(self, plan: pb.PlacementPlan) -> np.ndarray:
        base_epoch = plan.base_epoch
        if self.phy2log is None or plan.job_id != self.job_id or base_epoch != self.epoch:
            held = f"epoch {self.epoch} of job {self.job_id!r}" if self.phy2log is not None else "no plan"
            raise UnknownBase(
                "plan.base_epoch",
                f"delta for epoch {plan.epoch} of job {plan.job_id!r} is against base_epoch "
                f"{base_epoch}, but this stream holds {held}; not applied",
            )
        if plan.slots_per_rank != self.slots_per_rank:
            raise UnknownBase(
                "plan.slots_per_rank",
                f"delta against base_epoch {base_epoch} has {plan.slots_per_rank} slots per rank, "
                f"the base has {self.slots_per_rank}; not applied",
            )
        slots = decode_array(plan.changed_slots, "plan.changed_slots", ndim=1, kinds="iu")
        experts = decode_array(plan.changed_experts, "plan.changed_experts", ndim=1,
                               shape=(slots.shape[0],), kinds="iu", nonnegative=True)
        full = self.phy2log.astype(np.result_type(self.phy2log.dtype, experts.dtype))  # a copy
        flat = full.reshape(-1)
        if slots.size:
            if slots.size > 1 and not (np.diff(slots.astype(np.int64)) > 0).all():
                raise WireError("plan.changed_slots", "must be strictly increasing")
            if int(slots[0]) < 0 or int(slots[-1]) >= flat.size:
                raise WireError("plan.changed_slots", f"indices outside [0, {flat.size})")
            flat[slots] = experts
        return full


def plan_message(plan: dict, not_before_step: int) -> bytes:
    """Serialized full PlacementPlan of a stored plan (a dict with job_id, epoch, phy2log
    [L, G*S], slots_per_rank): phy2log in the smallest integer dtype holding its ids (uint8
    for E <= 256). The bus carries it; ingest derives deltas."""
    return full_plan(plan["job_id"], plan["epoch"], plan["phy2log"], plan["slots_per_rank"],
                     not_before_step).SerializeToString()
