"""Chrome-trace / Perfetto JSON of phase spans: ``{"traceEvents": [...]}``, one complete event
(``ph: "X"``) per span with pid = node, tid = rank, ``ts``/``dur`` in microseconds; metadata
events name each process (node) and thread (rank and role). Opens in ui.perfetto.dev.
"""

from __future__ import annotations

from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans

JOB_TID = 1 << 30  # the thread of rank -1 rows (a framework's per-step timers, not a device)


def chrome_trace(spans: Spans, job_id: str) -> dict:
    """The trace of ``spans`` (``node`` may be None: one process for the job)."""
    nodes = [str(n) for n in spans.node] if spans.node is not None else [job_id] * len(spans)
    pids = {name: i + 1 for i, name in enumerate(sorted(set(nodes)))}
    events: list[dict] = []
    for name, pid in pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    threads: set[tuple[int, int]] = set()
    cols = zip(spans.step.tolist(), spans.rank.tolist(), spans.version.tolist(), spans.phase.tolist(),
               spans.role.tolist(), spans.start.tolist(), spans.end.tolist(), spans.tokens.tolist(),
               nodes, strict=True)
    for step, rank, version, phase, role, start, end, tokens, node in cols:
        pid, tid = pids[node], rank if rank >= 0 else JOB_TID
        if (pid, tid) not in threads:
            threads.add((pid, tid))
            label = f"rank {rank} ({ROLES[role]})" if rank >= 0 else f"job timers ({ROLES[role]})"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        events.append({
            "ph": "X", "name": PHASES[phase], "cat": ROLES[role], "pid": pid, "tid": tid,
            "ts": start * 1e6, "dur": (end - start) * 1e6,
            "args": {"step": step, "version": version, "tokens": tokens, "rank": rank},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"job_id": job_id}}
