"""The node agent's relay of its ranks' RL reports: merged into one ``RLReport`` per flush.

Each rank's SDK sends its own reports (20-odd spans a step); the control plane's cost is mostly
per message, so the agent holds them and sends one report per node every flush interval (or
sooner, at ``max_spans`` spans or ``max_load_bytes`` of phase-load counts). Columns are concatenated; phase and role names are the union of the
ranks' name tables (an unknown name travels on for the control plane to refuse by name).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array, encode_array

INT_COLUMNS = ("step", "rank", "version", "phase", "role", "tokens")
COLUMNS = (*INT_COLUMNS, "start", "end")


def _columns(spans: pb.RLSpans) -> dict[str, np.ndarray]:
    """The report's columns, validated for shape and dtype (ValueError naming the field)."""
    if not spans.HasField("step"):
        return {}
    n = decode_array(spans.step, "rl.spans.step", ndim=1, kinds="iu").shape[0]
    return {c: decode_array(getattr(spans, c), f"rl.spans.{c}", shape=(n,),
                            kinds="iu" if c in INT_COLUMNS else "f") for c in COLUMNS}


class RLRelay:
    """Pending reports of one job; ``emit(AgentMessage)`` sends the merged one."""

    def __init__(self, emit: Callable[[pb.AgentMessage], object], *, max_spans: int = 8192,
                 max_load_bytes: int = 8 << 20):
        self.emit = emit
        self.max_spans = max_spans
        self.max_load_bytes = max_load_bytes  # well under the uplink's 32 MiB message limit
        self._pending: list[tuple[pb.RLReport, dict[str, np.ndarray]]] = []
        self._spans = 0
        self._load_bytes = 0

    def add(self, report: pb.RLReport) -> None:
        """Hold ``report`` (its job_id set); flush at ``max_spans`` or ``max_load_bytes``.
        Raises ValueError naming a malformed column (nothing of it is kept)."""
        cols = _columns(report.spans)
        self._pending.append((report, cols))
        self._spans += len(cols.get("step", ()))
        self._load_bytes += sum(len(p.counts.data) for p in report.phase_loads)
        if self._spans >= self.max_spans or self._load_bytes >= self.max_load_bytes:
            self.flush()

    def flush(self) -> int | None:
        """Send what is pending as one report per job; returns the seq of the last (None: none)."""
        pending, self._pending, self._spans, self._load_bytes = self._pending, [], 0, 0
        seq = None
        for job in dict.fromkeys(r.job_id for r, _ in pending):
            seq = self.emit(pb.AgentMessage(rl=merge([(r, c) for r, c in pending if r.job_id == job])))
        return seq


def merge(parts: list[tuple[pb.RLReport, dict[str, np.ndarray]]]) -> pb.RLReport:
    """One report holding every part's spans, syncs, batches and phase loads."""
    out = pb.RLReport(job_id=parts[0][0].job_id)
    phase_names: dict[str, int] = {}
    role_names: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {c: [] for c in COLUMNS}
    for report, c in parts:
        out.syncs.extend(report.syncs)
        out.batches.extend(report.batches)
        out.phase_loads.extend(report.phase_loads)
        if not c:
            continue
        for name, table, field in ((report.spans.phase_names, phase_names, "phase"),
                                   (report.spans.role_names, role_names, "role")):
            remap = np.array([table.setdefault(n, len(table)) for n in name] + [255], dtype=np.int64)
            idx = c[field].astype(np.int64)
            # an index out of this part's table stays out of range (255) for the control plane to refuse
            c = c | {field: remap[np.where((idx >= 0) & (idx < len(name)), idx, len(name))]}
        for k in COLUMNS:
            cols[k].append(c[k])
    if cols["step"]:
        out.spans.phase_names.extend(phase_names)
        out.spans.role_names.extend(role_names)
        dtypes = {"step": np.int64, "rank": np.int32, "version": np.int64, "phase": np.uint8, "role": np.uint8,
                  "tokens": np.int64, "start": np.float64, "end": np.float64}
        for k in COLUMNS:
            getattr(out.spans, k).CopyFrom(encode_array(np.concatenate(cols[k]).astype(dtypes[k])))
    return out
