"""Process supervisor behind ``moeplane demo``: start, watch, and stop the demo's processes."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path

from moeplane.controlplane.procs import Procs


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(args.data_dir).resolve()
        self.procs = Procs(self.dir / "logs")
        self._stopping = False

    MARKER = ".moeplane-demo-data"

    def _prepare_dir(self, keep: bool) -> None:
        """A fresh data directory per run: the simulated job restarts at step 0 each time, and
        old steps in the store would make its new loads look like resends."""
        if self.dir.exists() and not keep:
            if not (self.dir / self.MARKER).exists() and any(self.dir.iterdir()):
                raise SystemExit(f"--data-dir {self.dir} is not empty and not a demo directory; refusing to clear it")
            shutil.rmtree(self.dir)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / self.MARKER).touch()

    def _stop(self, *_):
        self._stopping = True

    def run(self) -> int:
        a = self.args
        self._prepare_dir(keep=a.keep_data)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        try:
            serve = self.procs.start_serve(f"sqlite:///{self.dir / 'moeplane.sqlite'}",
                                           http_port=a.http_port, grpc_port=a.grpc_port, timeout=60)
            base, grpc = serve.http, serve.grpc
            job = "demo-job"
            g = a.gpus_per_node
            for i in range(a.nodes):
                self.procs.spawn(f"agent-{i}", [
                    "agent", "--node-id", f"node-{i}", "--server", grpc, "--collector", "sim",
                    "--devices", str(g), "--job-id", job, "--ranks", f"{i * g}-{(i + 1) * g - 1}",
                    "--local-socket", str(self.dir / f"agent-{i}.sock"),
                    "--spool-dir", str(self.dir / f"spool-{i}"),
                ])
            self.procs.spawn("simulate", [
                "simulate", "--job-id", job, "--nodes", str(a.nodes), "--gpus-per-node", str(g),
                "--layers", str(a.layers), "--experts", str(a.experts), "--top-k", str(a.top_k),
                "--step-time", str(a.step_time), "--steps", str(a.steps),
                "--agent-socket-template", str(self.dir / "agent-{i}.sock"),
            ])
            print(
                "moeplane demo is running (embedded: SQLite + in-process bus, open on loopback)\n"
                f"  dashboard  {base}/dashboard/\n"
                f"  REST API   {base}/api/v1/jobs   (OpenAPI: {base}/docs)\n"
                f"  agents     {a.nodes} nodes x {g} simulated devices -> grpc {grpc}\n"
                f"  job        {job}: {a.layers} MoE layers x {a.experts} experts, top-{a.top_k}\n"
                f"  logs       {self.dir / 'logs'}\n"
                "Ctrl-C stops everything.",
                flush=True,
            )
            while not self._stopping:  # watch the children until Ctrl-C or one exits
                for proc in self.procs.started:
                    if not proc.running() and proc.name != "simulate":
                        print(f"{proc.name} exited with {proc.popen.returncode}; stopping the demo",
                              file=sys.stderr)
                        self._stopping = True
                time.sleep(0.2)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        self.procs.reap(grace=15)
        print("moeplane demo stopped", flush=True)
