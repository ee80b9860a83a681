"""Apply placement plans in a running job: validate, agree on the step, migrate, swap, report.

Protocol
    Plans arrive on any thread (the reporter's receive thread calls :meth:`PlanApplier.submit`).
    ``submit`` validates a plan at once; a bad plan (wrong shape, unknown expert id, slot count
    not matching the model, an epoch not newer than the running one, another job) is rejected
    with a clear error and reported FAILED; training continues on the running placement.

    At every step boundary every rank calls :meth:`PlanApplier.step_boundary` (a collective).
    One ``all_reduce(MAX)`` over ``[epoch, -epoch, digest, -digest, rejected epoch,
    not_before_step]`` tells all ranks whether they all hold the same pending plan. The first
    boundary where they do, and the next step is at least ``not_before_step``, is the switch
    step for all of them: no rank switches alone. A plan that another rank rejected is dropped
    everywhere; plans that differ between ranks under one epoch fail everywhere.

    Switching stages the new expert weights and optimizer state (:mod:`moeplane.agents.sdk.migration`),
    votes (``all_reduce(MIN)`` of each rank's success), then commits on every rank or on none,
    and reports APPLIED (with the first step that runs the new placement) or FAILED.

GPU jobs should pass a gloo ``control_group`` so that the per-step agreement stays on the host.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from moeplane.agents.sdk import migration
from moeplane.agents.sdk.moe import ExpertSlots
from moeplane.agents.sdk.placement import PlacementError, check_phy2log
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array

_NONE = -1


class PlanRejected(ValueError):
    """A plan the applier will not run. ``field`` names the offending part of the plan."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class _Pending:
    epoch: int
    phy2log: np.ndarray
    not_before_step: int
    digest: int


class PlanApplier:
    """Runs placement plans for a list of MoE blocks (one per layer, in layer order).

    Args:
        blocks: the model's MoE blocks (:class:`ExpertSlots`), ``blocks[l]`` is layer ``l``.
        optimizer: the optimizer whose per-slot state moves with the experts (or None).
        job_id: this job; plans for another job are rejected ("" accepts any).
        epoch: epoch of the running placement (plans must be newer).
        group: expert-parallel group (migration traffic).
        control_group: group for the per-step agreement (default ``group``).
        on_report: called with every ``PlanReport`` (any thread; keep it non-blocking).
    """

    def __init__(
        self,
        blocks: list[ExpertSlots],
        optimizer=None,
        *,
        job_id: str = "",
        epoch: int = 0,
        group=None,
        control_group=None,
        on_report: Callable[[pb.PlanReport], None] | None = None,
    ):
        if not blocks:
            raise ValueError("blocks: no MoE blocks")
        self.blocks = list(blocks)
        self.optimizer = optimizer
        self.job_id = job_id
        self.group = group
        self.control_group = control_group if control_group is not None else group
        self.on_report = on_report
        self.reports: list[pb.PlanReport] = []
        self.last_staged: migration.Staged | None = None
        self._epoch = epoch
        self._lock = threading.Lock()
        self._pending: _Pending | None = None
        self._rejected = _NONE
        first = self.blocks[0]
        self.layers = len(self.blocks)
        self.experts = first.num_experts
        self.world_size = first.world_size
        self.slots_per_rank = first.slots_per_rank

    @property
    def epoch(self) -> int:
        """Epoch of the running placement."""
        return self._epoch

    def phy2log(self) -> np.ndarray:
        """``[L, G*S]`` running placement."""
        return np.stack([b.phy2log_row for b in self.blocks])

    # ------------------------------------------------------------------ intake (any thread)

    def validate(self, plan: pb.PlacementPlan) -> np.ndarray:
        """Check ``plan`` against the model; return its ``phy2log[L, G*S]`` or raise."""
        if self.job_id and plan.job_id and plan.job_id != self.job_id:
            raise PlanRejected("plan.job_id", f"{plan.job_id!r} is not this job ({self.job_id!r})")
        if plan.epoch <= self._epoch:
            raise PlanRejected(
                "plan.epoch", f"epoch {plan.epoch} is not newer than the running {self._epoch}"
            )
        if plan.slots_per_rank != self.slots_per_rank:
            raise PlanRejected(
                "plan.slots_per_rank",
                f"{plan.slots_per_rank} slots per rank, the model has {self.slots_per_rank}",
            )
        try:
            arr = decode_array(plan.phy2log, "plan.phy2log", ndim=2, kinds="iu")  # any integer dtype
            return check_phy2log(
                arr,
                layers=self.layers,
                experts=self.experts,
                world_size=self.world_size,
                slots_per_rank=self.slots_per_rank,
            )
        except WireError as exc:
            raise PlanRejected(exc.field, exc.problem) from exc
        except PlacementError as exc:
            raise PlanRejected(f"plan.{exc.field}", exc.problem) from exc

    def submit(self, plan: pb.PlacementPlan) -> bool:
        """Queue ``plan`` for the next agreed step boundary; False (and a report) if rejected."""
        with self._lock:
            if self._pending is not None and plan.epoch == self._pending.epoch:
                return True  # a resend of the plan already waiting
            try:
                phy2log = self.validate(plan)
            except PlanRejected as exc:
                self._rejected = max(self._rejected, plan.epoch)
                error = str(exc)
            else:
                digest = zlib.crc32(phy2log.tobytes()) ^ (plan.not_before_step & 0xFFFFFFFF)
                if self._pending is None or plan.epoch > self._pending.epoch:
                    self._pending = _Pending(plan.epoch, phy2log, plan.not_before_step, digest)
                return True
        self._report(plan.epoch, pb.PLAN_STATE_FAILED, -1, error)
        return False

    # ------------------------------------------------------------------ step boundary (collective)

    def step_boundary(self, step: int) -> pb.PlanReport | None:
        """Call on every rank after step ``step``; switches when all ranks agree.

        Returns the report when a plan was applied or failed at this boundary, else None.
        """
        with self._lock:
            pending, rejected = self._pending, self._rejected
        epoch = pending.epoch if pending else _NONE
        digest = pending.digest if pending else _NONE
        not_before = pending.not_before_step if pending else _NONE
        vec = torch.tensor([epoch, -epoch, digest, -digest, rejected, not_before], dtype=torch.int64)
        dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=self.control_group)
        max_epoch, min_epoch, max_digest, min_digest, max_rejected, switch_not_before = (
            int(vec[0]),
            -int(vec[1]),
            int(vec[2]),
            -int(vec[3]),
            int(vec[4]),
            int(vec[5]),
        )
        if pending is None:
            return None
        if max_rejected >= pending.epoch:
            self._drop(pending)
            return self._report(
                pending.epoch, pb.PLAN_STATE_FAILED, step + 1, "plan.epoch: rejected by another rank"
            )
        if min_epoch != max_epoch or step + 1 < switch_not_before:
            return None  # not every rank has it yet, or too early
        if min_digest != max_digest:
            self._drop(pending)
            return self._report(
                pending.epoch,
                pb.PLAN_STATE_FAILED,
                step + 1,
                f"plan.phy2log: ranks hold different plans under epoch {pending.epoch}",
            )
        return self._switch(pending, step + 1)

    def _switch(self, pending: _Pending, first_step: int) -> pb.PlanReport:
        error = ""
        staged = None
        try:
            staged = migration.stage(self.blocks, self.optimizer, pending.phy2log, self.group)
        except (RuntimeError, ValueError) as exc:  # staging failed on this rank
            error = f"migration: {exc}"
        vote = torch.tensor([0 if error else 1], dtype=torch.int64)
        dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=self.control_group)
        self._drop(pending)
        if staged is None or int(vote[0]) == 0:
            return self._report(
                pending.epoch, pb.PLAN_STATE_FAILED, first_step, error or "migration: failed on a peer"
            )
        migration.commit(self.blocks, self.optimizer, staged)
        self._epoch = pending.epoch
        self.last_staged = staged
        return self._report(pending.epoch, pb.PLAN_STATE_APPLIED, first_step, "")

    def _drop(self, pending: _Pending) -> None:
        with self._lock:
            if self._pending is pending:
                self._pending = None

    def _report(self, epoch: int, state: int, step: int, error: str) -> pb.PlanReport:
        report = pb.PlanReport(job_id=self.job_id, epoch=epoch, state=state, step=step, error=error)
        self.reports.append(report)
        if self.on_report is not None:
            self.on_report(report)
        return report
