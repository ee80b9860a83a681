"""The RL phase and role vocabulary, and the span table every layer passes around.

Stored codes are indices into :data:`PHASES` and :data:`ROLES`: append new names, never reorder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PHASES = (
    "generate", "reward", "logprob_old", "logprob_ref", "values", "advantage", "train_update",
    "weight_sync", "offload", "onload", "wait", "checkpoint", "validate",
)
ROLES = ("hybrid", "rollout", "trainer", "reference", "reward")
PHASE_CODE = {name: i for i, name in enumerate(PHASES)}
ROLE_CODE = {name: i for i, name in enumerate(ROLES)}

# What each phase is, for the idle analysis: productive work, overhead counted apart, or waiting.
PRODUCTIVE = frozenset(("generate", "reward", "logprob_old", "logprob_ref", "values", "advantage",
                        "train_update", "validate", "checkpoint"))
SYNC = frozenset(("weight_sync",))
SWITCH = frozenset(("offload", "onload"))
WAIT = frozenset(("wait",))
TRAINER_PHASES = frozenset(("logprob_old", "logprob_ref", "values", "advantage", "train_update"))

COLUMNS = ("step", "rank", "version", "phase", "role", "start", "end", "tokens")


@dataclass(frozen=True)
class Spans:
    """N phase spans as columns (row i is one span).

    step int64 [N]; rank int32 [N] (-1: the whole job); version int64 [N] (policy version);
    phase int8 [N] and role int8 [N] (codes into PHASES, ROLES); start, end float64 [N] (unix
    seconds, end >= start); tokens int64 [N]; node object [N] (node id strings, or None when the
    source does not say).
    """

    step: np.ndarray
    rank: np.ndarray
    version: np.ndarray
    phase: np.ndarray
    role: np.ndarray
    start: np.ndarray
    end: np.ndarray
    tokens: np.ndarray
    node: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def take(self, index) -> Spans:
        """The rows selected by ``index`` (a boolean mask [N] or integer indices)."""
        return Spans(*(getattr(self, c)[index] for c in COLUMNS),
                     node=None if self.node is None else self.node[index])

    @staticmethod
    def build(step, rank, version, phase, role, start, end, tokens, node=None) -> Spans:
        """Columns from any sequences; ``phase``/``role`` as codes or names."""
        def codes(values, table):
            values = list(values)
            return np.array([table[v] if isinstance(v, str) else int(v) for v in values],
                            dtype=np.int8)

        n = len(list(step)) if not isinstance(step, np.ndarray) else step.shape[0]
        return Spans(
            np.asarray(step, dtype=np.int64).reshape(n), np.asarray(rank, dtype=np.int32).reshape(n),
            np.asarray(version, dtype=np.int64).reshape(n), codes(phase, PHASE_CODE),
            codes(role, ROLE_CODE), np.asarray(start, dtype=np.float64).reshape(n),
            np.asarray(end, dtype=np.float64).reshape(n), np.asarray(tokens, dtype=np.int64).reshape(n),
            None if node is None else np.asarray(node, dtype=object).reshape(n),
        )


def empty_spans() -> Spans:
    return Spans.build([], [], [], [], [], [], [], [])
