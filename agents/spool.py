"""The agent's bounded on-disk spool: every message it has numbered but not seen acknowledged.

One SQLite file (WAL mode) under the spool directory holds:

- ``next_seq``: the per-node sequence counter, kept across restarts, strictly increasing;
- every unacknowledged ``AgentMessage`` (serialized, with its seq), replayed in seq order;
- drop counters.

A message leaves the spool when the control plane acknowledges its seq (stored, duplicate or
rejected for good). When the spool is over ``max_messages`` or ``max_bytes``, the oldest
device samples are dropped first; expert loads, step statistics, plan reports and hellos only
when no samples are left. Drops are counted (persisted) and logged, never silent.

Writes survive a killed process (WAL, ``synchronous=NORMAL``); not necessarily a power loss.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from moeplane.controlplane.wire import moeplane_pb2 as pb

log = logging.getLogger(__name__)

SPOOL_FILE = "spool.sqlite"
PRIORITY = {"samples": 0}  # everything else: 1 (kept longest)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    priority INTEGER NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_priority ON messages (priority, seq);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class Spool:
    """Sequence counter and unacknowledged messages of one node, in ``directory``."""

    def __init__(self, directory: str | Path, *, max_messages: int = 200_000,
                 max_bytes: int = 256 << 20):
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("max_messages and max_bytes must be >= 1")
        self.path = Path(directory) / SPOOL_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._recount()

    # ------------------------------------------------------------------ counters

    def _meta(self, key: str, default: int = 0) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value)
        )

    @property
    def next_seq(self) -> int:
        """The seq the next message will get (1 for a fresh spool)."""
        return self._meta("next_seq", 1)

    @property
    def dropped_samples(self) -> int:
        return self._meta("dropped_samples")

    @property
    def dropped_other(self) -> int:
        return self._meta("dropped_other")

    @property
    def dropped_total(self) -> int:
        return self.dropped_samples + self.dropped_other

    def allocate_seq(self) -> int:
        """Take one seq without storing a message (for a connection's opening hello)."""
        with self._txn():
            seq = self.next_seq
            self._set_meta("next_seq", seq + 1)
        return seq

    def advance_past(self, seq: int) -> int:
        """Renumber pending messages to follow ``seq`` when the counter is behind it.

        Used when the control plane has stored seqs up to ``seq`` that this spool never issued
        (the spool was lost): reusing them would make new messages look like duplicates.
        Returns how many pending messages were renumbered.
        """
        with self._txn():
            if seq < self.next_seq:
                return 0
            rows = self.db.execute("SELECT seq, payload FROM messages ORDER BY seq").fetchall()
            self.db.execute("DELETE FROM messages")
            new = seq + 1
            for _, payload in rows:
                msg = pb.AgentMessage.FromString(payload)
                msg.seq = new
                self._insert(new, msg.WhichOneof("body") or "", msg.SerializeToString())
                new += 1
            self._set_meta("next_seq", new)
            self._recount()
        log.warning("spool counter was behind the control plane (seq %d): renumbered %d "
                    "pending messages", seq, len(rows))
        return len(rows)

    # ------------------------------------------------------------------ messages

    def append(self, msg: pb.AgentMessage) -> int:
        """Number ``msg`` (sets ``msg.seq``), store it durably, enforce bounds; return its seq."""
        body = msg.WhichOneof("body")
        if body is None:
            raise ValueError("msg has no body")
        with self._txn():
            seq = self.next_seq
            msg.seq = seq
            payload = msg.SerializeToString()
            self._insert(seq, body, payload)
            self._set_meta("next_seq", seq + 1)
            self.count += 1
            self.bytes += len(payload)
            self._enforce_bounds()
        return seq

    def _insert(self, seq: int, body: str, payload: bytes) -> None:
        self.db.execute(
            "INSERT INTO messages (seq, kind, priority, payload) VALUES (?, ?, ?, ?)",
            (seq, body, PRIORITY.get(body, 1), payload),
        )

    def _recount(self) -> None:
        self.count, self.bytes = self.db.execute(
            "SELECT count(*), coalesce(sum(length(payload)), 0) FROM messages"
        ).fetchone()

    def _enforce_bounds(self) -> None:
        dropped_samples = dropped_other = 0
        while self.count > self.max_messages or self.bytes > self.max_bytes:
            row = self.db.execute(
                "SELECT seq, priority, length(payload) FROM messages "
                "ORDER BY priority, seq LIMIT 1"
            ).fetchone()
            if row is None:
                break
            self.db.execute("DELETE FROM messages WHERE seq = ?", (row[0],))
            self.count -= 1
            self.bytes -= row[2]
            if row[1] == 0:
                dropped_samples += 1
            else:
                dropped_other += 1
        if dropped_samples:
            self._set_meta("dropped_samples", self.dropped_samples + dropped_samples)
        if dropped_other:
            self._set_meta("dropped_other", self.dropped_other + dropped_other)
        if dropped_samples or dropped_other:
            log.warning("spool full: dropped %d samples and %d other messages "
                        "(totals %d, %d)", dropped_samples, dropped_other,
                        self.dropped_samples, self.dropped_other)

    def pending(self, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        """Up to ``limit`` unacknowledged (seq, serialized message) with seq > after_seq."""
        return self.db.execute(
            "SELECT seq, payload FROM messages WHERE seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()

    def get(self, seq: int) -> bytes | None:
        """The serialized message ``seq`` while it is pending, else None."""
        row = self.db.execute("SELECT payload FROM messages WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else row[0]

    def ack(self, seqs: list[int]) -> int:
        """Forget acknowledged messages; return how many were pending."""
        if not seqs:
            return 0
        with self._txn():
            removed = 0
            for seq in seqs:
                row = self.db.execute(
                    "DELETE FROM messages WHERE seq = ? RETURNING length(payload)", (seq,)
                ).fetchone()
                if row is not None:
                    removed += 1
                    self.bytes -= row[0]
            self.count -= removed
        return removed

    def _txn(self) -> _Txn:
        return _Txn(self.db)

    def close(self) -> None:
        self.db.close()


class _Txn:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
