"""Process supervisor behind ``moeplane demo``: start, watch, and stop the demo's processes."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MOEPLANE = [sys.executable, "-m", "moeplane.controlplane.cli.main"]


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(args.data_dir).resolve()
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self._stopping = False

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            MOEPLANE + argv, stdout=log, stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"}, start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def _wait_http(self, url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"control plane exited ({proc.returncode}); see {self.dir / 'logs' / 'serve.log'}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"control plane not serving {url} after {timeout}s")

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
        base = f"http://127.0.0.1:{a.http_port}"
        grpc = f"127.0.0.1:{a.grpc_port}"
        try:
            serve = self._spawn("serve", [
                "serve", "--database-url", f"sqlite:///{self.dir / 'moeplane.sqlite'}",
                "--http-port", str(a.http_port), "--grpc-listen", grpc,
            ])
            self._wait_http(base + "/api/v1/health", serve)
            job = "demo-job"
            g = a.gpus_per_node
            for i in range(a.nodes):
                self._spawn(f"agent-{i}", [
                    "agent", "--node-id", f"node-{i}", "--server", grpc, "--collector", "sim",
                    "--devices", str(g), "--job-id", job, "--ranks", f"{i * g}-{(i + 1) * g - 1}",
                    "--local-socket", str(self.dir / f"agent-{i}.sock"),
                    "--spool-dir", str(self.dir / f"spool-{i}"),
                ])
            self._spawn("simulate", [
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
            while not self._stopping:
                for name, proc in self.procs:
                    if proc.poll() is not None and name != "simulate":
                        print(f"{name} exited with {proc.returncode}; stopping the demo", file=sys.stderr)
                        self._stopping = True
                time.sleep(0.2)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _name, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("moeplane demo stopped", flush=True)
