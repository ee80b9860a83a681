"""A real ``moeplane serve`` on SQLite for the agent tests, and what it stored, read back.

The server keeps its ports and its database file across :meth:`Server.stop` and
:meth:`Server.start` (a control-plane restart). Unless ``controller=True`` its reconcile loops
are idle, so the only plans are the ones a test pushes through REST. Stored rows are read from the SQLite file
(read-only) or through REST, never from inside the server.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import httpx
import numpy as np

from moeplane.controlplane.procs import Proc, free_port, start_serve
from tests.agents.procs import track
from tests.procs import wait_until


class Server:
    def __init__(self, tmp: Path, *, sample_interval_s: float = 0.1, extra: tuple[str, ...] = (),
                 controller: bool = False, health_ca: Path | None = None):
        self.tmp, self.db = tmp, tmp / "controlplane.sqlite"
        self.url = f"sqlite:///{self.db}"
        self.port, self.http_port = free_port(), free_port()
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.argv = ["--no-dashboard", "--sample-interval", str(sample_interval_s), *extra]
        self.env = {} if controller else {"MOEPLANE_CONTROLLER_INTERVAL_S": "1e9"}
        self.health_ca = health_ca  # TLS: the CA of the server's certificate for localhost
        self.proc: Proc | None = None
        self.api = httpx.Client(base_url=self.http + "/api/v1", timeout=10)

    def start(self) -> Server:
        self.proc = track(start_serve(self.tmp, self.url, http_port=self.http_port,
                                      grpc_port=self.port, extra=self.argv,
                                      env=self.env, tls_ca=self.health_ca))
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.stop(sig)
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.api.close()

    # ------------------------------------------------------------------ reading back

    def rows(self, sql: str, *params) -> list[tuple]:
        """Rows of ``sql`` on the server's database, read-only; [] before its tables exist."""
        if not self.db.exists():
            return []
        db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError:  # not migrated yet
            return []
        finally:
            db.close()

    def samples(self, node: str = "node-0") -> list[tuple[float, list[str], np.ndarray]]:
        """(ts, metric names, float32 [D, M]) of every stored sample round of ``node``, by ts."""
        got = self.rows(
            "SELECT f.ts, l.device_ids, l.metrics, f.`values` FROM sample_frames f "
            "JOIN sample_layouts l ON l.id = f.layout WHERE l.node_id = ? ORDER BY f.ts", node)
        return [(ts, json.loads(metrics),
                 np.frombuffer(blob, "<f4").reshape(len(json.loads(devices)), -1))
                for ts, devices, metrics, blob in got]

    def seqs(self, node: str = "node-0") -> list[int]:
        """Every stored message seq of ``node``, ascending."""
        return [s for (s,) in self.rows("SELECT seq FROM received WHERE node_id = ? ORDER BY seq",
                                        node)]

    def get(self, path: str, **params):
        """The JSON of ``GET /api/v1<path>``, or None unless it answered 200 (e.g. a job the
        control plane has not heard of yet)."""
        r = self.api.get(path, params=params)
        return r.json() if r.status_code == 200 else None

    def metric(self, name: str) -> float:
        """A sample of ``/api/v1/metrics`` without labels (0 when absent)."""
        for line in self.api.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "_total "):
                return float(line.split()[-1])
        return 0.0

    def wait(self, fn, timeout: float = 30.0, what: str = "the control plane's state"):
        """:func:`wait_until` on ``fn(self)``."""
        return wait_until(lambda: fn(self), timeout, what)

    def push_plan(self, job: str, phy2log: np.ndarray) -> int:
        """Push ``phy2log`` as an operator's plan through REST; its epoch."""
        r = self.api.post(f"/jobs/{job}/plans", json={"phy2log": np.asarray(phy2log).tolist()})
        r.raise_for_status()
        return r.json()["epoch"]

    def plan(self, job: str, epoch: int) -> dict:
        return next(p for p in self.get(f"/jobs/{job}/plans") or [] if p["epoch"] == epoch)
