"""What a load-generator run observed: messages sent and acknowledged, latencies, plans.

Plain data that crosses process boundaries as dicts; ``merge`` sums the parts and
``summary`` reduces them to the numbers a benchmark reports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

KINDS = ("loads", "samples", "step_stats", "plan_report")


@dataclass
class Stats:
    """Observations of one process. Latencies in seconds; times are unix seconds."""

    sent: Counter = field(default_factory=Counter)  # kind -> messages sent
    acked: Counter = field(default_factory=Counter)  # kind -> acked OK (stored or duplicate)
    duplicates: int = 0
    errors: Counter = field(default_factory=Counter)  # ack code -> count
    error_messages: list[str] = field(default_factory=list)
    counters_acked: int = 0  # expert counters in loads acked OK
    samples_acked: int = 0  # device samples (D × M values) in frames acked OK
    ack_latency_s: list[float] = field(default_factory=list)
    plans: list[tuple[str, int, float]] = field(default_factory=list)  # (node, epoch, received at)
    acked_seqs: dict[str, list[int]] = field(default_factory=dict)  # node -> seqs acked OK
    reconnects: int = 0
    stream_errors: list[str] = field(default_factory=list)
    max_lag_s: float = 0.0  # how far sends fell behind their schedule
    started_at: float = 0.0
    ended_at: float = 0.0

    def as_dict(self) -> dict:
        return {
            "sent": dict(self.sent), "acked": dict(self.acked), "duplicates": self.duplicates,
            "errors": {str(k): v for k, v in self.errors.items()},
            "error_messages": self.error_messages[:20], "counters_acked": self.counters_acked,
            "samples_acked": self.samples_acked, "ack_latency_s": self.ack_latency_s,
            "plans": self.plans, "acked_seqs": self.acked_seqs, "reconnects": self.reconnects,
            "stream_errors": self.stream_errors[:20], "max_lag_s": self.max_lag_s,
            "started_at": self.started_at, "ended_at": self.ended_at,
        }


def merge(parts: list[dict]) -> dict:
    """Combine the ``as_dict`` of several processes into one."""
    out: dict = {
        "sent": Counter(), "acked": Counter(), "duplicates": 0, "errors": Counter(),
        "error_messages": [], "counters_acked": 0, "samples_acked": 0, "ack_latency_s": [],
        "plans": [], "acked_seqs": {}, "reconnects": 0, "stream_errors": [], "max_lag_s": 0.0,
        "started_at": min((p["started_at"] for p in parts), default=0.0),
        "ended_at": max((p["ended_at"] for p in parts), default=0.0),
    }
    for p in parts:
        for key in ("sent", "acked", "errors"):
            out[key].update(p[key])
        for key in ("duplicates", "counters_acked", "samples_acked", "reconnects"):
            out[key] += p[key]
        for key in ("error_messages", "ack_latency_s", "plans", "stream_errors"):
            out[key].extend(p[key])
        out["acked_seqs"].update(p["acked_seqs"])
        out["max_lag_s"] = max(out["max_lag_s"], p["max_lag_s"])
    for key in ("sent", "acked", "errors"):
        out[key] = dict(out[key])
    return out


def percentiles(values, qs=(50, 99)) -> dict[str, float | None]:
    """``{"p50": ..., "p99": ...}`` of ``values`` (None when empty)."""
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q}": (float(np.percentile(arr, q)) if arr.size else None) for q in qs}


def summary(merged: dict) -> dict:
    """The headline numbers of a merged run (rates over the run's wall time)."""
    wall = max(merged["ended_at"] - merged["started_at"], 1e-9)
    lat = percentiles(merged["ack_latency_s"])
    return {
        "wall_s": round(wall, 3),
        "sent": merged["sent"],
        "acked": merged["acked"],
        "duplicates": merged["duplicates"],
        "errors": merged["errors"],
        "counters_acked": merged["counters_acked"],
        "counters_per_s": merged["counters_acked"] / wall,
        "samples_acked": merged["samples_acked"],
        "samples_per_s": merged["samples_acked"] / wall,
        "ack_latency_ms_p50": None if lat["p50"] is None else lat["p50"] * 1e3,
        "ack_latency_ms_p99": None if lat["p99"] is None else lat["p99"] * 1e3,
        "plans_received": len(merged["plans"]),
        "reconnects": merged["reconnects"],
        "max_lag_s": merged["max_lag_s"],
        "error_messages": merged["error_messages"][:5],
        "stream_errors": merged["stream_errors"][:5],
    }
