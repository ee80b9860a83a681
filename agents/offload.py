"""The node's share of the memory-offload loop: profiles up, decisions down, reports up.

- Up: each rank's ``RankStep.memory`` is kept as that rank's latest profile (device id and rank
  taken from its ``RankHello``, so they are the ones the node announced); at most once per
  ``interval_s`` the latest profile of every rank that sent one since is emitted as one
  ``AgentMessage.memory = MemoryProfiles`` with the node's free host memory.
- Down: ``ControlMessage.offload`` goes to the rank running the decision's device (or, when
  no rank names that device, the decision's rank) as ``RankControl.offload``. Decisions are
  deduplicated by ``decision_id`` (the control plane resends pushed ones after every hello);
  the newest decision of each device is kept and given to a rank that attaches later. The
  agent reports RECEIVED for each new decision.
- Up: a rank's ``RankMessage.offload_report`` is emitted as ``AgentMessage.offload_report``.

Pure bookkeeping: time comes in as ``now`` (monotonic seconds) and ``clock()`` (unix seconds);
free host memory from ``host_free()`` (bytes); everything sent goes through ``emit``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from moeplane.controlplane.memory.codec import profile_record
from moeplane.controlplane.wire import moeplane_pb2 as pb


def check_profile(profile: pb.MemoryProfile) -> None:
    """What the control plane would refuse for the whole node (its own check, run here per
    rank); ValueError names the field under ``step.memory``."""
    profile_record(profile, "step.memory", job_id="", node_id="", step=0, ts=0.0)


class OffloadRelay:
    """Memory profiles and offload decisions of one node.

    interval_s: at least this many seconds between two ``MemoryProfiles`` (0: every step).
    remember: decision ids remembered for deduplication.
    """

    def __init__(self, emit: Callable[[pb.AgentMessage], int], *, interval_s: float,
                 host_free: Callable[[], int], clock: Callable[[], float],
                 remember: int = 4096):
        if not math.isfinite(interval_s) or interval_s < 0:
            raise ValueError(f"interval_s: must be >= 0, got {interval_s}")
        self.emit = emit
        self.interval_s = interval_s
        self.host_free = host_free
        self.clock = clock
        self.remember = remember
        self.pending: dict[int, tuple[int, pb.MemoryProfile]] = {}  # rank -> (step, profile)
        self.last_sent: float | None = None
        self.seen: OrderedDict[int, None] = OrderedDict()
        self.latest: dict[str, pb.OffloadDecision] = {}  # device_id -> newest decision

    # ------------------------------------------------------------------ profiles up

    def add_profile(self, rank: int, device_id: str, step: int,
                    profile: pb.MemoryProfile) -> None:
        """Keep ``profile`` as the latest of ``rank``; ValueError names a bad field."""
        if not device_id:
            raise ValueError("step.memory: the rank's hello named no device_id, so its memory "
                             "cannot be attributed to a device of this node")
        check_profile(profile)
        kept = pb.MemoryProfile()
        kept.CopyFrom(profile)
        kept.device_id, kept.rank = device_id, rank
        self.pending[rank] = (step, kept)

    def due_at(self) -> float | None:
        """Monotonic time at which :meth:`flush` sends something (None: nothing pending)."""
        if not self.pending:
            return None
        return -math.inf if self.last_sent is None else self.last_sent + self.interval_s

    def flush(self, job_id: str, now: float, force: bool = False) -> int | None:
        """Emit the pending profiles when due (or ``force``); return the message's seq."""
        due = self.due_at()
        if due is None or not job_id or (now < due and not force):
            return None
        ranks = sorted(self.pending)
        msg = pb.AgentMessage(memory=pb.MemoryProfiles(
            job_id=job_id, step=max(self.pending[r][0] for r in ranks), timestamp=self.clock(),
            host_free_bytes=max(0, int(self.host_free())),
            devices=[self.pending[r][1] for r in ranks],
        ))
        self.pending.clear()
        self.last_sent = now
        return self.emit(msg)

    # ------------------------------------------------------------------ decisions down

    def on_decision(self, decision: pb.OffloadDecision) -> bool:
        """Record a decision from the control plane; False for one already received."""
        if decision.decision_id in self.seen:
            return False
        self.seen[decision.decision_id] = None
        while len(self.seen) > self.remember:
            self.seen.popitem(last=False)
        newest = self.latest.get(decision.device_id)
        if newest is None or decision.decision_id > newest.decision_id:
            self.latest[decision.device_id] = decision
        self.emit(pb.AgentMessage(offload_report=pb.OffloadReport(
            job_id=decision.job_id, decision_id=decision.decision_id,
            device_id=decision.device_id, state=pb.PLAN_STATE_RECEIVED)))
        return True

    def for_device(self, device_id: str) -> pb.OffloadDecision | None:
        """The newest decision of ``device_id`` (for a rank that attaches)."""
        return self.latest.get(device_id)

    # ------------------------------------------------------------------ reports up

    def report(self, rank: int, device_id: str, job_id: str, report: pb.OffloadReport) -> int:
        """Emit a rank's report; ValueError names a field that does not fit the rank."""
        if report.decision_id <= 0:
            raise ValueError(f"offload_report.decision_id: must be positive, got "
                             f"{report.decision_id}")
        if report.device_id and report.device_id != device_id:
            raise ValueError(f"offload_report.device_id: {report.device_id!r} is not the device "
                             f"of rank {rank} ({device_id!r})")
        if not device_id:
            raise ValueError("offload_report.device_id: the rank's hello named no device_id")
        out = pb.OffloadReport()
        out.CopyFrom(report)
        out.device_id = device_id
        out.job_id = out.job_id or job_id
        return self.emit(pb.AgentMessage(offload_report=out))
