"""RL phase spans from training code, handed to a background sender without blocking.

    from moeplane.torch import Reporter, attach_rl, phase, policy_version, consumed_batch

    attach_rl(reporter.send_report, job_id="grpo-1", rank=rank, role="hybrid")
    policy_version(0)
    for step in range(steps):
        with phase("generate", step=step) as span:
            responses = rollout(prompts)
            span.tokens = count_tokens(responses)   # tokens may be set inside the block
        with phase("train_update", step=step):
            train(responses)
        consumed_batch(step, trained_version=v, sample_versions=versions_of(responses), bound=1)
        with phase("weight_sync", step=step):
            sync_weights()
        policy_version(v + 1)

Expert loads by phase (an MoE policy): give the recorder a watch of the model
(``watch = moeplane.torch.attach(model)``, not bound to a reporter) and every ``with phase(...)``
block's expert loads are taken from it at the block's start and end and sent as ``PhaseLoads``
(rollout's routing beside training's)::

    watch = attach(model)
    attach_rl(reporter.send_report, job_id="grpo-1", rank=rank, role="hybrid", watch=watch)
    with phase("generate", step=step):       # loads counted in here: "generate" of this step
        responses = model.generate(prompts)

What the model routes outside any phase block is dropped (taken at the next block's start); a
block inside another one credits what was counted before it to the outer one. A step's loads
per phase are summed (a phase may run in several blocks) and sent once the rank enters a later
step (``phase(..., step=s)``), or on :meth:`PhaseRecorder.flush` with ``final=True`` and
:func:`detach_rl`: the control plane stores one row per (rank, step, phase). Each block's start
and end cost one ``Watch.take`` (a host copy of ``[L, E]``, which waits for the device).

A :class:`PhaseRecorder` keeps spans in memory and hands an ``RLReport`` to ``send`` (e.g.
:meth:`moeplane.agents.sdk.reporter.Reporter.send_report`, an append to its bounded queue that
its sender thread writes on the node-agent stream) every ``flush_spans`` spans or
``flush_interval_s`` seconds, whichever comes first, and on :meth:`PhaseRecorder.flush`. The
module-level :func:`phase`, :func:`policy_version`, :func:`consumed_batch` and
:func:`weight_sync` use the recorder :func:`attach_rl` installed; before that they do nothing
(training code runs unchanged without an agent). Needs no torch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from moeplane.agents.rlreport import phase_loads, rl_report
from moeplane.controlplane.rl.phases import PHASE_CODE, ROLE_CODE, Spans
from moeplane.controlplane.wire import moeplane_pb2 as pb


@dataclass
class Span:
    """The open span of a ``with phase(...)`` block; set ``tokens`` inside it."""

    tokens: int = 0


class PhaseRecorder:
    """Phase spans, policy versions, weight syncs and consumed batches of one rank.

    Args:
        send: called with each ``RLReport`` (from the thread that triggers the flush); must not
            block, e.g. ``Reporter.send_report``.
        job_id, rank, role: who records (role: one of ``phases.ROLES``).
        flush_spans, flush_interval_s: flush after this many spans or seconds.
        clock: unix seconds.
        watch: an object whose ``take()`` returns the expert loads ``[L, E]`` (integers >= 0)
            counted since its last call, e.g. ``moeplane.torch.attach(model)``; each phase
            block's loads are then sent too (see the module docstring). None: spans only.
    """

    def __init__(self, send: Callable[[pb.RLReport], object], *, job_id: str, rank: int,
                 role: str = "hybrid", flush_spans: int = 256, flush_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time, watch=None):
        if role not in ROLE_CODE:
            raise ValueError(f"role: {role!r} is not one of {', '.join(ROLE_CODE)}")
        if rank < 0:
            raise ValueError(f"rank: {rank} < 0")
        self.send, self.job_id, self.rank, self.role = send, job_id, rank, ROLE_CODE[role]
        self.flush_spans, self.flush_interval_s, self.clock = flush_spans, flush_interval_s, clock
        self.version = 0
        self.step = 0
        self._rows: list[tuple] = []  # (step, version, phase, start, end, tokens)
        self._syncs: list[pb.WeightSync] = []
        self._batches: list[pb.ConsumedBatch] = []
        self.watch = watch
        self._loads: dict[tuple[int, str], tuple[np.ndarray, float]] = {}  # (step, phase) -> ([L, E], end)
        self._open: list[tuple[int, str]] = []  # (step, phase) of the open blocks, innermost last
        self._lock = threading.Lock()
        self._last_flush = clock()
        self.sent_reports = 0

    def policy_version(self, version: int) -> None:
        """The policy version this rank holds from now on (never decreasing)."""
        if version < self.version:
            raise ValueError(f"policy_version: {version} is below the current {self.version}")
        self.version = int(version)

    @contextlib.contextmanager
    def phase(self, name: str, *, step: int | None = None, tokens: int = 0) -> Iterator[Span]:
        """Record the enclosed block as one span of phase ``name`` (of ``step``, default: the
        last step given)."""
        code = PHASE_CODE.get(name)
        if code is None:
            raise ValueError(f"phase: {name!r} is not one of {', '.join(PHASE_CODE)}")
        if step is not None:
            self.step = int(step)
        key = (self.step, name)
        if self.watch is not None:
            self._count_loads(None)  # what was routed before the block: the outer block's, or dropped
            self._open.append(key)
        span, start = Span(tokens), self.clock()
        try:
            yield span
        finally:
            end = self.clock()
            if self.watch is not None:
                self._open.pop()
                self._count_loads(key, end)
            self.add_span(name, start, end, step=key[0], tokens=span.tokens)

    def _count_loads(self, key: tuple[int, str] | None, end: float | None = None) -> None:
        """Take the watch's loads and add them to ``key``'s (None: the innermost open block's,
        or dropped when none is open)."""
        counts = np.asarray(self.watch.take())
        key = key if key is not None else (self._open[-1] if self._open else None)
        if key is None or not counts.any():
            return
        ts = self.clock() if end is None else end
        with self._lock:
            prev = self._loads.get(key)
            if prev is not None:
                counts, ts = counts + prev[0], max(ts, prev[1])
            self._loads[key] = (counts.astype(np.int64), ts)

    def add_span(self, name: str, start: float, end: float, *, step: int, tokens: int = 0,
                 version: int | None = None) -> None:
        """Record a span measured elsewhere (unix seconds)."""
        row = (int(step), self.version if version is None else int(version), PHASE_CODE[name],
               float(start), float(end), int(tokens))
        with self._lock:
            self._rows.append(row)
            due = len(self._rows) >= self.flush_spans or end - self._last_flush >= self.flush_interval_s
        if due:
            self.flush()

    def weight_sync(self, *, step: int, from_version: int, to_version: int, bytes: int, start: float,
                    pause_s: float = 0.0, transfer_s: float = 0.0, resume_s: float = 0.0) -> None:
        with self._lock:
            self._syncs.append(pb.WeightSync(
                step=step, rank=self.rank, from_version=from_version, to_version=to_version, bytes=bytes,
                start=start, pause_s=pause_s, transfer_s=transfer_s, resume_s=resume_s))

    def consumed_batch(self, step: int, *, trained_version: int, sample_versions: Sequence[int] | np.ndarray,
                       bound: int = -1, dropped: int = 0, partial: int = 0) -> None:
        """The batch step ``step`` trains on: ``sample_versions`` [B] the policy version that
        generated each sample; its lag is ``trained_version - version``."""
        lag = trained_version - np.asarray(sample_versions, dtype=np.int64)
        with self._lock:
            self._batches.append(pb.ConsumedBatch(
                step=step, rank=self.rank, trained_version=trained_version, samples=int(lag.size),
                lag_min=int(lag.min()) if lag.size else 0, lag_mean=float(lag.mean()) if lag.size else 0.0,
                lag_max=int(lag.max()) if lag.size else 0, bound=bound, dropped=dropped, partial=partial,
                timestamp=self.clock()))

    def flush(self, final: bool = False) -> None:
        """Hand what is recorded to ``send`` as one RLReport (nothing when empty): the spans,
        syncs and batches, and the phase loads of the steps before the current one (``final``:
        of every step)."""
        with self._lock:
            rows, syncs, batches = self._rows, self._syncs, self._batches
            self._rows, self._syncs, self._batches = [], [], []
            done = [k for k in self._loads if final or (k[0] < self.step and k not in self._open)]
            loads = [phase_loads(step, self.rank, name, *self._loads.pop((step, name)))
                     for step, name in sorted(done)]
            self._last_flush = self.clock()
        if not (rows or syncs or batches or loads):
            return
        spans = None
        if rows:
            step, version, phase, start, end, tokens = zip(*rows, strict=True)
            n = len(rows)
            spans = Spans.build(step, [self.rank] * n, version, phase, [self.role] * n, start, end, tokens)
        self.send(rl_report(self.job_id, spans, syncs, batches, loads))
        self.sent_reports += 1


_recorder: PhaseRecorder | None = None


def attach_rl(send: Callable[[pb.RLReport], object], **kwargs) -> PhaseRecorder:
    """Install the recorder the module-level functions use (see :class:`PhaseRecorder`)."""
    global _recorder
    _recorder = PhaseRecorder(send, **kwargs)
    return _recorder


def detach_rl() -> None:
    """Flush (every step's phase loads too) and remove the installed recorder."""
    global _recorder
    if _recorder is not None:
        _recorder.flush(final=True)
    _recorder = None


@contextlib.contextmanager
def phase(name: str, *, step: int | None = None, tokens: int = 0) -> Iterator[Span]:
    """``with phase("generate", tokens=n):`` on the installed recorder (a no-op without one)."""
    if _recorder is None:
        if name not in PHASE_CODE:
            raise ValueError(f"phase: {name!r} is not one of {', '.join(PHASE_CODE)}")
        yield Span(tokens)
        return
    with _recorder.phase(name, step=step, tokens=tokens) as span:
        yield span


def policy_version(version: int) -> None:
    if _recorder is not None:
        _recorder.policy_version(version)


def consumed_batch(step: int, **kwargs) -> None:
    if _recorder is not None:
        _recorder.consumed_batch(step, **kwargs)


def weight_sync(**kwargs) -> None:
    if _recorder is not None:
        _recorder.weight_sync(**kwargs)
