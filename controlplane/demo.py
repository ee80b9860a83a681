"""Process supervisor behind ``moeplane demo``: start, watch, and stop the demo's processes.

Two jobs report to one control plane: ``demo-job``, simulated (one agent per simulated node and
``moeplane simulate``: expert loads, plans, memory pressure and offload, host-bound spells), and,
when torch is installed, ``train-moe``: ``examples/train_moe.py`` training a small MoE model with
4 gloo ranks on CPU through its own agent, paced to leave the machine's cores to the rest and
restarted (continuing its step numbers) whenever it exits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path

from moeplane.controlplane.procs import Proc, Procs, free_port

JOB = "demo-job"
TRAIN_JOB = "train-moe"
RL_JOB = "rl-job"  # simulated asynchronous RL post-training (phase spans, staleness, weight sync)
RL_NODE = "rl-0"
RL_DEVICES = 8
TRAIN_NODE = "cpu-0"
TRAIN_RANKS = 4
TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_moe.py"
RESTART_AFTER_S = 5.0  # least time between two starts of the training job
STEP_MARGIN = 50  # step numbers a restarted training skips: steps its agent may still hold


def training_unavailable() -> str:
    """Why the real training job cannot run here ("" when it can)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (make torch)"
    if not TRAIN_SCRIPT.exists():
        return f"{TRAIN_SCRIPT} is not there (an installed package has no examples/)"
    return ""


def guide(base: str, a: argparse.Namespace, training: str) -> str:
    """What the demo prints: where things are, what each page shows, REST calls to try.
    ``training``: why the real job does not run ("" when it does)."""
    g = a.gpus_per_node
    real = (f"{TRAIN_JOB}  real: examples/train_moe.py, {TRAIN_RANKS} gloo ranks on CPU through "
            f"agent {TRAIN_NODE}, at most {a.train_steps_per_s:g} steps/s, restarted when it exits"
            if not training else f"{TRAIN_JOB}  not started: {training}")
    pressure = (f"a longer-sequence phase every {a.pressure_every} steps (the first at step 15) "
                "pushes 3 ranks over the 90 % high watermark" if a.pressure_every else
                "memory pressure is off (--pressure-every 0)")
    spells = (f"every {a.host_spell_every} steps (the first at step 30) one node's data loader "
              "is slow for a while" if a.host_spell_every else "host-bound spells are off")
    return "\n".join([
        "moeplane demo is running (embedded: SQLite + in-process bus, open on loopback)",
        f"  dashboard  {base}/dashboard/   (pick the job at the top)",
        f"  REST API   {base}/api/v1/jobs   (OpenAPI: {base}/docs)",
        f"  jobs       {JOB}  simulated: {a.nodes} nodes x {g} devices, {a.layers} MoE layers x "
        f"{a.experts} experts, top-{a.top_k}, {a.step_time:g} s steps",
        f"             {real}",
        f"             {RL_JOB}  simulated RL post-training: async, staleness bound 1, {RL_DEVICES} devices "
        "(3 rollout, 5 trainer)",
        f"  logs       {a.data_dir}/logs",
        "",
        "What to look at:",
        f"  Cluster  {base}/dashboard/cluster  every device; metric 'Host-bound ratio': {spells},",
        "           its devices cross the 30 % rule and are outlined",
        f"  Experts  {base}/dashboard/experts  tokens per expert and rank, balancedness falling "
        "as plans apply",
        f"  Plans    {base}/dashboard/plans  each rebalancing plan: predicted and measured "
        "balancedness, moves, the diff",
        f"  Memory   {base}/dashboard/memory  memory of every device; {pressure}:",
        "           offload decisions, applied under the auto policy, predicted against measured",
        f"  History  {base}/dashboard/history  any range of steps, summed",
        f"  RL       {base}/dashboard/rl  (job {RL_JOB}) the devices' phases, idle by cause, staleness, "
        "weight syncs, expert loads during rollout beside training",
        "",
        "Try the REST API (the first plan comes after about 20 s):",
        f"  curl -s {base}/api/v1/jobs",
        f"  curl -s {base}/api/v1/jobs/{JOB}/plans/1",
        f"  curl -s '{base}/api/v1/history/jobs/{JOB}/loads?view=expert&expert=0'",
        f"  curl -s {base}/api/v1/jobs/{JOB}/offload/decisions",
        *([] if training else [f"  curl -s {base}/api/v1/jobs/{TRAIN_JOB}/memory"]),
        f"  curl -s {base}/api/v1/jobs/{RL_JOB}/rl/idle",
        f"  curl -s {base}/api/v1/jobs/{RL_JOB}/rl/loads",
        "Ctrl-C stops everything.",
    ])


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(args.data_dir).resolve()
        self.procs = Procs(self.dir / "logs")
        self._stopping = False
        self.trainer: Proc | None = None
        self.trainer_started = 0.0

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

    def _agent(self, name: str, node: str, grpc: str, job: str, ranks: str, *extra: str) -> Proc:
        return self.procs.spawn(name, [
            "agent", "--node-id", node, "--server", grpc, "--job-id", job, "--ranks", ranks,
            "--local-socket", str(self.dir / f"{name}.sock"), "--spool-dir",
            str(self.dir / f"spool-{name}"), "--memory-interval", "5", *extra])

    def _start_simulated(self, grpc: str) -> None:
        a, g = self.args, self.args.gpus_per_node
        for i in range(a.nodes):
            self._agent(f"agent-{i}", f"node-{i}", grpc, JOB, f"{i * g}-{(i + 1) * g - 1}",
                        "--collector", "sim", "--devices", str(g))
        self.procs.spawn("simulate", [
            "simulate", "--job-id", JOB, "--nodes", str(a.nodes), "--gpus-per-node", str(g),
            "--layers", str(a.layers), "--experts", str(a.experts), "--top-k", str(a.top_k),
            "--step-time", str(a.step_time), "--steps", str(a.steps),
            "--pressure-every", str(a.pressure_every), "--host-spell-every", str(a.host_spell_every),
            "--agent-socket-template", str(self.dir / "agent-{i}.sock"),
        ])

    def _start_rl(self, grpc: str) -> None:
        """The RL job: its own agent and ``moeplane simulate --rl async`` (an hour of 5-s steps)."""
        self._agent("agent-rl", RL_NODE, grpc, RL_JOB, f"0-{RL_DEVICES - 1}", "--collector", "sim",
                    "--devices", str(RL_DEVICES))
        self.procs.spawn("simulate-rl", [
            "simulate", "--rl", "async", "--staleness", "1", "--job-id", RL_JOB, "--nodes", "1",
            "--gpus-per-node", str(RL_DEVICES), "--steps", "720", "--step-time", "5",
            "--node-id-template", RL_NODE, "--agent-socket-template", str(self.dir / "agent-rl.sock"),
        ])

    def _start_trainer(self, first_step: int) -> None:
        a = self.args
        self.trainer = self.procs.spawn("train-moe", [
            "--nproc-per-node", str(TRAIN_RANKS), "--master-port", str(free_port()),
            str(TRAIN_SCRIPT), "--agent-socket", str(self.dir / "agent-train.sock"),
            "--job-id", TRAIN_JOB, "--node-id", TRAIN_NODE, "--steps", "0",
            "--first-step", str(first_step), "--max-steps-per-s", str(a.train_steps_per_s),
            "--memory-offload", "--memory-capacity-mb", str(a.train_capacity_mb),
        ], cmd=[sys.executable, "-m", "torch.distributed.run"], env={"OMP_NUM_THREADS": "1"})
        self.trainer_started = time.monotonic()

    def _next_train_step(self, base: str) -> int:
        """Where a restarted training job continues: past every step already stored."""
        try:
            with urllib.request.urlopen(f"{base}/api/v1/jobs/{TRAIN_JOB}", timeout=5) as r:
                latest = json.load(r).get("latest_step")
        except OSError:
            return 0
        return 0 if latest is None else latest + 1 + STEP_MARGIN

    def _watch(self, base: str) -> None:
        """Until Ctrl-C or a child other than the jobs exits; restarts the training job."""
        while not self._stopping:
            for proc in self.procs.started:
                if proc.running() or proc.name in ("simulate", "simulate-rl", "train-moe"):
                    continue
                print(f"{proc.name} exited with {proc.popen.returncode}; stopping the demo",
                      file=sys.stderr)
                self._stopping = True
            t = self.trainer
            if (not self._stopping and t is not None and not t.running()
                    and time.monotonic() - self.trainer_started >= RESTART_AFTER_S):
                first = self._next_train_step(base)
                print(f"{TRAIN_JOB} exited with {t.popen.returncode}; restarting it at step "
                      f"{first} (log: {t.log})", flush=True)
                self._start_trainer(first)
            time.sleep(0.2)

    def run(self) -> int:
        a = self.args
        self._prepare_dir(keep=a.keep_data)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        try:
            serve = self.procs.start_serve(f"sqlite:///{self.dir / 'moeplane.sqlite'}",
                                           http_port=a.http_port, grpc_port=a.grpc_port, timeout=60)
            self._start_simulated(serve.grpc)
            self._start_rl(serve.grpc)
            training = "--no-train" if not a.train else training_unavailable()
            if not training:
                self._agent("agent-train", TRAIN_NODE, serve.grpc, TRAIN_JOB,
                            f"0-{TRAIN_RANKS - 1}", "--collector", "host")
                self._start_trainer(first_step=0)
            print(guide(serve.http, a, training), flush=True)
            self._watch(serve.http)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        self.procs.reap(grace=15)
        print("moeplane demo stopped", flush=True)
