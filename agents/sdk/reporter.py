"""Per-step load counts and step statistics, sent to the node agent without blocking the step.

What a step costs the training loop (:meth:`Reporter.end_step`): a device-side ``clone`` and
``zero_`` of the ``[L, E]`` counter (the MoE blocks already bincount their router indices into
it, see :func:`moeplane.agents.sdk.moe.attach_counter`), a few clock reads, and an append to a bounded
queue. A background thread does the rest: waits for the device copy, makes the one small copy
to the host, encodes ``RankStep`` and writes it on the gRPC stream ``NodeLocal.Attach`` (Unix
socket ``unix:PATH``; ``RankHello`` first). Plans the agent streams back
(``RankControl.plan``) go to ``on_plan`` (e.g. :meth:`moeplane.agents.sdk.applier.PlanApplier.submit`);
``send_report`` sends ``PlanReport`` back. When the queue is full the oldest step is dropped
and counted (``dropped``); when the agent is away the thread reconnects with backoff. Delivery
is at most once: the agent's per-step deadline marks ranks that miss a step.

Host-bound ratio: the share of a step in which the device waited on the host. Wrap host-side
work the device waits for (data loading, host preprocessing) in ``with reporter.host_region():``.

- CUDA: events are recorded on the current stream at the region's edges; on the device timeline
  the gap between them is time the device sat idle waiting for the host (when the device still
  had queued work, both events complete back to back and the gap is ~0). Ratio = sum of gaps /
  device time between consecutive ``end_step`` events. Read in the background thread.
- CPU: the device *is* the host, so the ratio is the wall time spent inside host regions over
  the wall time of the step (``time.perf_counter``), i.e. the share of the step not spent in
  torch compute.

Memory breakdown (:attr:`Reporter.memory`, bytes): parameters, gradients, optimizer state
(tensors in ``optimizer.state``), activation peak from ``with reporter.activations():`` around
forward+backward (CUDA: peak allocated above the region's start; CPU: bytes of tensors saved
for backward, deduplicated by storage, the model's parameters excluded).

Memory offload (``offload=`` a :class:`moeplane.agents.sdk.memory.runner.MemoryOffload` of the model's
layers): ``activations()`` measures each layer, ``end_step`` attaches the step's
``MemoryProfile`` to ``RankStep.memory`` (at most once per the offload's profile interval) and
then runs the offload's step boundary, where a pushed ``RankControl.offload`` is applied and
its ``OffloadReport`` queued for the agent.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import torch
from torch import nn

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc
from moeplane.controlplane.wire.arrays import encode_array

log = logging.getLogger(__name__)


@dataclass
class _Step:
    step: int
    counts: torch.Tensor  # [L, E] int64 snapshot (device)
    step_time_s: float
    host_s: float
    tokens: int
    timestamp: float
    end_event: object = None  # torch.cuda.Event at the step end (CUDA)
    start_event: object = None  # previous step end event (CUDA)
    regions: tuple = ()  # (begin, end) CUDA event pairs
    memory: pb.MemoryProfile | None = None


def memory_breakdown(model: nn.Module, optimizer=None) -> dict[str, int]:
    """Bytes held by parameters, gradients and optimizer state (tensors only)."""

    def size(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    params = list(model.parameters())
    state = 0
    if optimizer is not None:
        for entry in optimizer.state.values():
            state += sum(size(v) for v in entry.values() if torch.is_tensor(v))
    return {
        "parameters": sum(size(p) for p in params),
        "gradients": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer_state": state,
    }


class Reporter:
    """Collects per-step statistics of one rank and streams them to the node agent.

    Args:
        counter: ``[L, E]`` int64 load counter filled by the MoE blocks (device tensor); None
            when :func:`moeplane.torch.attach` supplies it (``attach(model, reporter=...)``
            calls :meth:`bind_counter`).
        rank: global rank.
        job: the job's shape (``JobSpec``; ``job_id``, ``layers``, ``experts`` required;
            ``groups`` = K with ``world_size`` and ``ranks_per_node`` keeps every replica of
            expert group g (experts ``g*E/K .. (g+1)*E/K-1``) on one node in the job's plans).
        socket_path: the agent's Unix socket; None measures without sending.
        device_id: this rank's device as the agent names it ("" when unknown).
        on_plan: called (on the receive thread) with every ``PlacementPlan`` from the agent.
        model, optimizer: for the memory breakdown (optional).
        offload: runs offload decisions and profiles the layers (optional, see above).
        max_pending: steps queued before the oldest is dropped.
        clock: unix seconds for timestamps; perf: monotonic seconds for durations.
    """

    def __init__(
        self,
        counter: torch.Tensor | None,
        *,
        rank: int,
        job: pb.JobSpec,
        socket_path: str | None = None,
        device_id: str = "",
        on_plan: Callable[[pb.PlacementPlan], object] | None = None,
        model: nn.Module | None = None,
        optimizer=None,
        offload=None,
        max_pending: int = 64,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
    ):
        self.rank, self.job, self.device_id = rank, job, device_id
        self.counter: torch.Tensor | None = None
        self.cuda = False
        self._before_snapshot: Callable[[], object] | None = None
        if counter is not None:
            self.bind_counter(counter)
        self.socket_path = socket_path
        self.on_plan = on_plan
        self.model, self.optimizer = model, optimizer
        self.offload = offload
        if offload is not None and offload.on_report is None:
            offload.on_report = self.send_report
        self.clock, self.perf = clock, perf
        self.dropped = 0
        self.sent_steps = 0
        self.rejected: list[pb.Ack] = []
        self.last: dict[str, float] = {}
        self.memory: dict[str, int] = {}
        self._items: collections.deque = collections.deque(maxlen=max_pending)
        self._cond = threading.Condition()
        self._closing = False
        self._abandon = False
        self._closed = threading.Event()  # wakes the reconnect backoff on close
        self._generation = 0
        self._call = None
        self._thread: threading.Thread | None = None
        self._last_end = perf()
        self._host_s = 0.0
        self._regions: list = []
        self._last_event = None

    # ------------------------------------------------------------------ training-loop side

    def bind_counter(self, counter: torch.Tensor,
                     before_snapshot: Callable[[], object] | None = None) -> None:
        """Read the loads from ``counter`` (``[L, E]`` int64, the job's shape); call
        ``before_snapshot`` at the start of every :meth:`end_step` (e.g. to fold pending
        router indices into the counter)."""
        if counter.dim() != 2 or tuple(counter.shape) != (self.job.layers, self.job.experts):
            raise ValueError(f"counter: shape {tuple(counter.shape)} != job [{self.job.layers}, "
                             f"{self.job.experts}]")
        self.counter, self.cuda, self._before_snapshot = counter, counter.is_cuda, before_snapshot

    def start(self) -> Reporter:
        """Start the sender thread (no-op without a socket)."""
        if self.socket_path and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="moeplane-reporter",
                                            daemon=True)
            self._thread.start()
        self._last_end = self.perf()
        return self

    @contextlib.contextmanager
    def host_region(self) -> Iterator[None]:
        """Mark host work the device waits for (see the module docstring)."""
        begin = self.perf()
        if self.cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        try:
            yield
        finally:
            self._host_s += self.perf() - begin
            if self.cuda:
                ev1 = torch.cuda.Event(enable_timing=True)
                ev1.record()
                self._regions.append((ev0, ev1))

    @contextlib.contextmanager
    def activations(self) -> Iterator[None]:
        """Measure the activation peak of the enclosed forward (and backward)."""
        if self.offload is not None:  # it measures per layer (its hooks would hide ours)
            try:
                with self.offload.measure():
                    yield
            finally:
                self.memory["activation_peak"] = self.offload.profiler.activation_peak_bytes
            return
        if self.cuda:
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                yield
            finally:
                self.memory["activation_peak"] = torch.cuda.max_memory_allocated() - base
            return
        # parameters saved for backward are not activations
        seen: set[int] = (
            {p.untyped_storage().data_ptr() for p in self.model.parameters()}
            if self.model is not None
            else set()
        )
        total = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total[0] += storage.nbytes()
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        finally:
            self.memory["activation_peak"] = total[0]

    def end_step(self, step: int, tokens: int = 0) -> None:
        """Close step ``step``: snapshot and reset the counter, queue the statistics."""
        now = self.perf()
        step_time, host_s = now - self._last_end, self._host_s
        self._last_end, self._host_s = now, 0.0
        if self.counter is None:
            raise RuntimeError("Reporter: no load counter (pass one, or attach(model, reporter=...))")
        if self._before_snapshot is not None:
            self._before_snapshot()
        snap = self.counter.clone()
        self.counter.zero_()
        item = _Step(step, snap, step_time, host_s, tokens, self.clock())
        if self.cuda:
            item.end_event = torch.cuda.Event(enable_timing=True)
            item.end_event.record()
            item.start_event, self._last_event = self._last_event, item.end_event
            item.regions, self._regions = tuple(self._regions), []
        self.last = {"step": step, "step_time_s": step_time,
                     "host_bound_ratio": min(1.0, host_s / step_time) if step_time > 0 else 0.0}
        if self.model is not None:
            self.memory.update(memory_breakdown(self.model, self.optimizer))
        if self.offload is not None:
            item.memory = self.offload.profile(self.device_id, self.rank)
            if item.memory is not None:
                self.memory["activation_peak"] = item.memory.activations_peak_bytes
        self._put(item)
        if self.offload is not None:
            self.offload.step_boundary(step)  # its report goes out through send_report

    def send_report(self, report: pb.PlanReport | pb.OffloadReport | pb.RLReport) -> None:
        """Queue a ``PlanReport``, an ``OffloadReport`` or an ``RLReport`` (see
        :mod:`moeplane.agents.sdk.rl`) for the agent (any thread)."""
        self._put(report)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, end the stream, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._closed.set()
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():  # the agent is away or slow: give up on what is queued
            with self._cond:
                self._abandon = True
                self._cond.notify_all()
            if self._call is not None:
                self._call.cancel()
            self._thread.join(timeout)

    def _put(self, item) -> None:
        with self._cond:
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append(item)
            self._cond.notify()

    # ------------------------------------------------------------------ sender thread

    def _run(self) -> None:
        channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        stub = pb_grpc.NodeLocalStub(channel)
        backoff = 0.05
        try:
            while True:
                with self._cond:
                    self._generation += 1
                    generation = self._generation
                    self._cond.notify_all()  # retire the previous stream's request generator
                    if self._closing and (self._abandon or not self._items):
                        return
                self._call = stub.Attach(self._requests(generation))
                try:
                    for control in self._call:
                        backoff = 0.05
                        self._handle(control)
                    with self._cond:
                        if self._closing:
                            return
                except grpc.RpcError as exc:
                    log.debug("node agent stream ended: %s", exc)
                with self._cond:
                    if self._closing and (self._abandon or not self._items):
                        return
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        finally:
            channel.close()

    def _handle(self, control: pb.RankControl) -> None:
        body = control.WhichOneof("body")
        if body == "offload" and self.offload is not None:
            self.offload.submit(control.offload)
        elif body == "plan" and self.on_plan is not None:
            try:
                self.on_plan(control.plan)
            except Exception:  # a faulty callback must not end the stream
                log.exception("on_plan failed for epoch %d", control.plan.epoch)
        elif body == "ack" and control.ack.code != 0:
            self.rejected.append(control.ack)
            log.warning("agent rejected step %d: %s", control.ack.seq, control.ack.message)

    def _requests(self, generation: int) -> Iterator[pb.RankMessage]:
        yield pb.RankMessage(hello=pb.RankHello(job=self.job, rank=self.rank,
                                                device_id=self.device_id))
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._items or self._closing or self._generation != generation
                )
                if self._generation != generation or not self._items:
                    return
                item = self._items.popleft()
            if isinstance(item, pb.PlanReport):
                yield pb.RankMessage(plan_report=item)
            elif isinstance(item, pb.OffloadReport):
                yield pb.RankMessage(offload_report=item)
            elif isinstance(item, pb.RLReport):
                yield pb.RankMessage(rl=item)
            else:
                yield pb.RankMessage(step=self._encode(item))
                self.sent_steps += 1

    def _encode(self, item: _Step) -> pb.RankStep:
        ratio = min(1.0, item.host_s / item.step_time_s) if item.step_time_s > 0 else 0.0
        if item.end_event is not None:
            item.end_event.synchronize()
            if item.start_event is not None:
                device_ms = item.start_event.elapsed_time(item.end_event)
                waited = sum(b.elapsed_time(e) for b, e in item.regions)
                ratio = min(1.0, waited / device_ms) if device_ms > 0 else 0.0
        counts = item.counts.cpu().numpy()
        stats = pb.RankStepStats(rank=self.rank, step_time_s=item.step_time_s,
                                 host_bound_ratio=max(0.0, ratio), tokens=item.tokens)
        return pb.RankStep(step=item.step, counts=encode_array(counts), stats=stats,
                           timestamp=item.timestamp, memory=item.memory)
