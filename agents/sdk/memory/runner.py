"""Run pushed memory-offload decisions in a training rank and report what they saved.

``MemoryOffload(layers, names, model=..., optimizer=...)`` owns a :class:`LayerProfiler` of
the layers. The reporter (:class:`moeplane.agents.sdk.reporter.Reporter` with ``offload=``) wraps
forward and backward in :meth:`measure`, asks :meth:`profile` for the step's
``MemoryProfile`` (at most once per ``profile_interval_s``), hands every
``RankControl.offload`` to :meth:`submit` (any thread) and calls :meth:`step_boundary` at the
end of every step (training thread). At the first boundary after a decision arrived:

1. undo the actions in effect (a decision is the complete set to have in effect);
2. ``apply_actions(layers, actions_of(decision), names, optimizer)``;
3. run the next step with it, then report APPLIED with the device's peak and the bytes it
   kept off the device (:func:`moeplane.agents.sdk.memory.wire.measured_saving` between the step
   before and the step after);

or, when applying fails, report FAILED with the error, with every action undone.
Decisions are handled once per ``decision_id``; an older decision than the one in effect is
ignored. ``kinds`` limits the action kinds this model accepts: layers that run collectives in
forward (e.g. expert-parallel all_to_all) must not be recomputed by one rank alone, so such
jobs pass ``kinds=("swap_activations", "offload_optimizer")`` and a decision asking for
recomputation is reported FAILED.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from torch import nn

from moeplane.agents.sdk.memory.apply import KINDS, AppliedMemory, MemoryReport, apply_actions
from moeplane.agents.sdk.memory.profiler import LayerProfiler
from moeplane.agents.sdk.memory.swap import SwappedLayer
from moeplane.agents.sdk.memory.wire import (
    actions_of,
    applied_names,
    measured_saving,
    offload_report,
)
from moeplane.controlplane.wire import moeplane_pb2 as pb

log = logging.getLogger(__name__)


class MemoryOffload:
    """Offload decisions for ``layers`` (an ``nn.ModuleList`` the model runs, forward order).

    names: what decisions call each layer (default ``"0"``, ``"1"``, ...).
    optimizer: needed for ``offload_optimizer`` actions.
    capacity_bytes: device capacity to report (default: the device's, or the host's on CPU).
    on_report: called with each ``OffloadReport`` (training thread; keep it non-blocking).
    profile_interval_s: at most one profile per this many seconds (``monotonic`` clock).
    """

    def __init__(self, layers: nn.ModuleList, names: Sequence[str] | None = None, *,
                 model: nn.Module | None = None, optimizer=None,
                 capacity_bytes: int | None = None, micro_batch_size: int = 0,
                 on_report: Callable[[pb.OffloadReport], None] | None = None,
                 profile_interval_s: float = 1.0, kinds: Sequence[str] = KINDS,
                 monotonic: Callable[[], float] = time.monotonic):
        self.layers = layers
        self.names = [str(i) for i in range(len(layers))] if names is None else list(names)
        self.optimizer = optimizer
        self.profiler = LayerProfiler(list(layers), self.names, model=model,
                                      optimizer=optimizer, capacity_bytes=capacity_bytes,
                                      micro_batch_size=micro_batch_size)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"kinds: unknown {sorted(unknown)} (known: {', '.join(KINDS)})")
        self.kinds = tuple(kinds)
        self.on_report = on_report
        self.profile_interval_s = profile_interval_s
        self.monotonic = monotonic
        self.handle: AppliedMemory | None = None
        self.decision: pb.OffloadDecision | None = None  # in effect
        self.reports: list[pb.OffloadReport] = []
        self._lock = threading.Lock()
        self._pending: pb.OffloadDecision | None = None
        self._seen: set[int] = set()
        self._checking: tuple[pb.OffloadDecision, MemoryReport] | None = None
        self._last_profile: float | None = None

    # ------------------------------------------------------------------ any thread

    def submit(self, decision: pb.OffloadDecision) -> bool:
        """Queue ``decision`` for the next step boundary; False for one already handled."""
        with self._lock:
            newest = max([d.decision_id for d in (self._pending, self.decision) if d] or [0])
            if decision.decision_id in self._seen or decision.decision_id <= newest:
                return False
            self._seen.add(decision.decision_id)
            self._pending = decision
            return True

    # ------------------------------------------------------------------ training thread

    def measure(self):
        """Context manager around forward and backward of a step."""
        return self.profiler.measure()

    def applied(self) -> list[str]:
        """``"kind:layer"`` of the actions in effect."""
        return applied_names(self.decision) if self.decision is not None else []

    def profile(self, device_id: str = "", rank: int = 0) -> pb.MemoryProfile | None:
        """The last step's profile, or None when one was given less than the interval ago."""
        now = self.monotonic()
        if self._last_profile is not None and now - self._last_profile < self.profile_interval_s:
            return None
        self._last_profile = now
        return self.profiler.profile(device_id, rank, self.applied(), self._optimizer_host())

    def _optimizer_host(self) -> int:
        offload = self.handle.offload if self.handle is not None else None
        return offload.host_bytes if offload is not None else 0

    def _now(self) -> MemoryReport:
        """What the last measured step kept where (bytes)."""
        used = self.profiler.update_used(self._optimizer_host())
        return MemoryReport(
            activation_device_bytes=self.profiler.device_activation_bytes,
            activation_host_bytes=sum(m.host_bytes for m in self.layers
                                      if isinstance(m, SwappedLayer)),
            optimizer_host_bytes=self._optimizer_host(),
            cuda_peak_bytes=used if self.profiler.cuda else None)

    def step_boundary(self, step: int) -> pb.OffloadReport | None:
        """Call after step ``step`` (after ``optimizer.step()``). Returns a report when one
        was made at this boundary (also given to ``on_report``)."""
        report = None
        if self._checking is not None:
            decision, before = self._checking
            self._checking = None
            after = self._now()
            report = self._report(offload_report(
                decision, step=step, used_bytes=self.profiler.used_bytes,
                saved_bytes=measured_saving(before, after)))
        with self._lock:
            decision, self._pending = self._pending, None
        if decision is not None:
            failed = self._apply(decision, step + 1)
            if failed is not None:
                report = self._report(failed)
        return report

    def _apply(self, decision: pb.OffloadDecision, first_step: int) -> pb.OffloadReport | None:
        before = self._now()
        self._undo()
        try:
            actions = actions_of(decision)
            for i, a in enumerate(actions):
                if a.kind not in self.kinds:
                    raise ValueError(f"decision.actions[{i}].kind: {a.kind!r} is not allowed "
                                     f"for this model (allowed: {', '.join(self.kinds)})")
            self.handle = apply_actions(self.layers, actions, self.names, self.optimizer)
        except (ValueError, RuntimeError) as exc:
            log.warning("offload decision %d not applied: %s", decision.decision_id, exc)
            for i, original in enumerate(self.profiler.modules):  # whatever got wrapped
                if self.layers[i] is not original:
                    self.layers[i] = original
            return offload_report(decision, step=first_step, error=str(exc) or type(exc).__name__)
        self.decision = decision
        self.profiler.wrappers = {i: m for i, m in enumerate(self.layers)
                                  if m is not self.profiler.modules[i]}
        self._checking = (decision, before)
        self._last_profile = None  # the next step's profile shows the new actions at once
        log.info("offload decision %d applied: %s", decision.decision_id, self.applied())
        return None

    def _undo(self) -> None:
        if self.handle is not None:
            self.handle.undo()
        self.handle, self.decision = None, None
        self.profiler.wrappers = {}
        self._checking = None

    def _report(self, report: pb.OffloadReport) -> pb.OffloadReport:
        self.reports.append(report)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def close(self) -> None:
        """Undo every action and remove the profiler's hooks."""
        self._undo()
        self.profiler.close()
