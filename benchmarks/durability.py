"""No acknowledged data lost when the control plane is killed mid-run (SIGKILL), counted after
restart.

    .venv/bin/python -m benchmarks.durability --nodes 32 --duration 40 --kill-at 15

A real ``moeplane serve`` on a fresh PostgreSQL database (or ``--sqlite``) takes per-rank loads
and 1 Hz samples from ``moeplane loadgen``; at ``--kill-at`` s it is SIGKILLed and restarted on
the same ports; the agents reconnect and go on. Afterwards every (node, seq) the loadgen saw
acknowledged must be in ``received``, and every stored load part must be summed exactly once
into the global matrices (sum of ``nodes_reported`` == load parts).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import sqlalchemy as sa

from benchmarks.scaleharness import loadgen, pg_database, read_json, sqlite_database, start_serve
from moeplane.controlplane.store.engine import make_engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--step-time", type=float, default=1.25)
    ap.add_argument("--duration", type=float, default=40)
    ap.add_argument("--kill-at", type=float, default=15)
    ap.add_argument("--sqlite", action="store_true")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-durability-"))
    with ExitStack() as stack:
        url = stack.enter_context(sqlite_database() if a.sqlite else pg_database())
        srv = start_serve(url, tmp, name="dur-1")
        port_g, port_h = int(srv.grpc.rsplit(":", 1)[1]), int(srv.http.rsplit(":", 1)[1])
        lg = loadgen([srv.grpc], tmp, "--nodes", str(a.nodes), "--step-time", str(a.step_time),
                     "--sample-interval", "1", "--duration", str(a.duration), "--job", "dur")
        time.sleep(a.kill_at)  # benchmark timing, not a test: kill mid-run
        srv.stop(signal.SIGKILL)
        killed_at = time.time()
        srv = start_serve(url, tmp, name="dur-2", grpc_port=port_g, http_port=port_h)
        restarted_s = time.time() - killed_at
        lg.wait()
        srv.stop()
        merged = read_json(tmp)
        engine = make_engine(url)
        with engine.connect() as conn:
            stored = {(n, s) for n, s in conn.execute(sa.text("SELECT node_id, seq FROM received"))}
            parts = conn.execute(sa.text("SELECT count(*) FROM load_parts WHERE job_id = 'dur'")).scalar()
            summed = conn.execute(sa.text("SELECT coalesce(sum(nodes_reported), 0) FROM expert_loads "
                                          "WHERE job_id = 'dur'")).scalar()
        engine.dispose()
    acked = {(n, s) for n, seqs in merged["acked_seqs"].items() for s in seqs}
    lost = acked - stored
    result = {
        "store": "sqlite" if a.sqlite else "postgresql", "acked": len(acked), "lost": len(lost),
        "stored_messages": len(stored), "load_parts": parts, "nodes_reported_sum": summed,
        "reconnects": merged["reconnects"], "restart_s": round(restarted_s, 2),
        "acked_loads": merged["acked"].get("loads", 0), "acked_samples": merged["acked"].get("samples", 0),
    }
    print(json.dumps(result, indent=2))
    return 0 if not lost and parts == summed else 1


if __name__ == "__main__":
    sys.exit(main())
