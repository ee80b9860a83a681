"""Follow framework log files and send their records as ``RLReport`` messages.

:class:`LineTail` reads the complete lines appended to a file since the last read (a line
without its newline yet waits for the next read; a file that shrank was rewritten and is read
from the start). :class:`Follower` polls its sources every ``poll_s`` seconds, parses each new
line, counts a malformed one in ``malformed`` (and logs it) and goes on with the next, and hands
one report per poll to ``emit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from moeplane.agents.follow import areal, verl
from moeplane.agents.rlreport import rl_report
from moeplane.controlplane.rl.phases import Spans
from moeplane.controlplane.wire import moeplane_pb2 as pb

log = logging.getLogger(__name__)

KINDS = ("verl", "areal")
MAX_READ = 16 << 20  # bytes read per file per poll


class LineTail:
    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.line_no = 0
        self._partial = b""

    def read(self) -> list[tuple[int, bytes]]:
        """(line number, line) of each complete new line; [] when the file is missing."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:  # truncated or replaced: start over
                self.offset, self.line_no, self._partial = 0, 0, b""
            if size == self.offset:
                return []
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(MAX_READ)
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        out = []
        for line in lines:
            self.line_no += 1
            if line.strip():
                out.append((self.line_no, line))
        return out


def parse_follow(text: str) -> tuple[str, Path]:
    """``verl=PATH`` or ``areal=DIR`` -> (kind, path); ValueError naming what is wrong."""
    kind, sep, path = text.partition("=")
    if not sep or kind not in KINDS or not path:
        raise ValueError(f"--follow: {text!r} is not verl=PATH or areal=DIR")
    return kind, Path(path)


class Follower:
    """One ``--follow`` source. ``job_id()`` names the job (the agent's); ``clock`` unix s."""

    def __init__(self, kind: str, path: Path, emit: Callable[[pb.AgentMessage], object], *,
                 job_id: Callable[[], str], clock: Callable[[], float] = time.time, poll_s: float = 1.0):
        if kind not in KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind, self.path, self.emit, self.job_id = kind, Path(path), emit, job_id
        self.clock, self.poll_s = clock, poll_s
        self.malformed = 0
        self.spans_sent = 0
        self._tails: dict[Path, LineTail] = {}
        self._verl = verl.VerlRecords()
        self._anchor: float | None = None  # AReaL: unix time of the tracers' ts == 0

    def _files(self) -> list[Path]:
        if self.kind == "verl":
            return [self.path]
        return sorted(self.path.rglob("traces-r*.jsonl")) if self.path.is_dir() else []

    def poll(self) -> pb.RLReport | None:
        """Read what is new in every file; return it as one report (None: nothing new)."""
        now = self.clock()
        rows: list[tuple] = []
        syncs: list[pb.WeightSync] = []
        batches: list[pb.ConsumedBatch] = []
        raw: list[tuple] = []  # AReaL rows with times in tracer microseconds
        for path in self._files():
            tail = self._tails.setdefault(path, LineTail(path))
            match = areal.RANK_FILE.search(path.name)
            file_rank = int(match.group(1)) if match else None
            new = tail.read()
            if self.kind == "verl":
                steps, errors = self._verl.parse_many([line for _no, line in new], now)
                for step in steps:
                    rows += step.spans
                    syncs += step.syncs
                    batches += step.batches
                for i, error in errors:
                    self.malformed += 1
                    log.warning("%s:%d: malformed verl record skipped: %s", path, new[i][0], error)
                continue
            for line_no, line in new:
                try:
                    ev = areal.parse_event(line, file_rank)
                except ValueError as exc:  # json.JSONDecodeError is one
                    self.malformed += 1
                    log.warning("%s:%d: malformed AReaL event skipped: %s", path, line_no, exc)
                    continue
                if ev is not None:
                    raw.append(ev)
        if raw:
            if self._anchor is None:
                self._anchor = now - max(r[5] for r in raw) / 1e6
            role = "hybrid"
            rows += [(s, r, v, p, role, self._anchor + a / 1e6, self._anchor + b / 1e6, tok)
                     for s, r, v, p, a, b, tok in raw]
        if not (rows or syncs or batches):
            return None
        spans = Spans.build(*zip(*rows, strict=True)) if rows else None
        self.spans_sent += len(rows)
        return rl_report(self.job_id(), spans, syncs, batches)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set; each report goes to ``emit`` as an AgentMessage."""
        while not stop.is_set():
            report = self.poll()
            if report is not None:
                self.emit(pb.AgentMessage(rl=report))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
