"""The agent as a real subprocess against a real control plane (``moeplane serve`` on SQLite):
what it stores, through restarts, pauses and kills of either side."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sqlite3
import subprocess

import numpy as np
import pytest

from moeplane.agents.spool import Spool
from moeplane.agents.uplink import Uplink, UplinkOptions
from moeplane.controlplane.procs import MOEPLANE, free_port, wait_until
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests.agents.procs import start_agent, stop
from tests.agents.server import Server
from tests.conftest import unavailable


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path).start()
    yield srv
    srv.close()


def spool_count(spool_file) -> int:
    """Messages the agent holds unacknowledged (-1 before its spool exists)."""
    if not spool_file.exists():
        return -1
    db = sqlite3.connect(f"file:{spool_file}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute("SELECT count(*) FROM messages").fetchone()[0]
    except sqlite3.OperationalError:  # the agent has not created its table yet
        return -1
    finally:
        db.close()


def wait_spool(spool_file, predicate, timeout: float = 30.0) -> int:
    """Poll the agent's spool file (read-only) until ``predicate(pending count)`` holds."""
    return wait_until(lambda: (n := spool_count(spool_file)) >= 0 and predicate(n) and [n],
                      timeout, "the agent's spool")[0]


def node_token(server: Server, node: str = "node-0") -> str:
    """A node token made with ``moeplane token create`` on the server's database."""
    made = subprocess.run(MOEPLANE + ["token", "create", "--node", node, "--database-url",
                                      server.url], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def test_hello_then_samples_are_stored_with_the_agents_token(tmp_path):
    server = Server(tmp_path, extra=("--auth",))
    token = node_token(server)
    server.start()
    agent = start_agent(tmp_path, server.port, "node-0", "--token", token)
    try:
        got = server.wait(lambda s: len(s.samples()) >= 3 and s.samples(), what="3 sample rounds")
    finally:
        assert stop(agent) == 0
        server.close()
    devices = server.rows("SELECT device_id, kind, memory_total_bytes FROM devices "
                          "WHERE node_id = 'node-0' ORDER BY device_id")
    assert [d for d, _, _ in devices] == [f"node-0/gpu{i}" for i in range(4)]
    assert all(kind == "sim" and total > 0 for _, kind, total in devices)
    _, metrics, values = got[0]
    assert values.shape == (4, len(metrics))
    assert "utilization_ratio" in metrics and "memory_used_bytes" in metrics
    util = values[:, metrics.index("utilization_ratio")]
    assert ((util >= 0) & (util <= 1)).all()


def test_a_token_from_the_environment_is_accepted(tmp_path):
    server = Server(tmp_path, extra=("--auth",))
    token = node_token(server)
    server.start()
    agent = start_agent(tmp_path, server.port, "node-0", env={"MOEPLANE_AGENT_TOKEN": token})
    try:
        server.wait(lambda s: s.samples(), what="a sample round")
    finally:
        assert stop(agent) == 0
        server.close()


def assert_every_round_once(server: Server, interval: float) -> None:
    stamps = [ts for ts, _, _ in server.samples()]
    assert stamps == sorted(stamps), "replayed out of order"
    assert len(set(stamps)) == len(stamps), "a sample round was stored twice"
    assert np.diff(stamps).max() < 10 * interval, "sample rounds are missing"


def test_a_crashed_control_plane_gets_every_unacknowledged_message_once(server, tmp_path):
    """Paused (nothing acknowledged), then killed and started again on the same database: the
    agent resends what it holds, the control plane stores each sample round once."""
    agent = start_agent(tmp_path, server.port, interval=0.05)
    spool = tmp_path / "spool-node-0" / "spool.sqlite"
    try:
        server.wait(lambda s: len(s.samples()) >= 2, what="2 sample rounds")
        server.proc.popen.send_signal(signal.SIGSTOP)
        wait_spool(spool, lambda n: n >= 10)  # sampled on, nothing acknowledged
        server.proc.popen.send_signal(signal.SIGCONT)  # so that SIGKILL finds it running
        server.stop(signal.SIGKILL)
        held = max(server.seqs())
        server.start()
        server.wait(lambda s: max(s.seqs()) >= held + 20, what="messages past the crash")
        wait_spool(spool, lambda n: n < 5)  # what was held got acknowledged
    finally:
        assert stop(agent) == 0
    assert_every_round_once(server, 0.05)


def test_outage_of_the_control_plane_loses_nothing(server, tmp_path):
    agent = start_agent(tmp_path, server.port, interval=0.05)
    spool = tmp_path / "spool-node-0" / "spool.sqlite"
    try:
        server.wait(lambda s: len(s.samples()) >= 2, what="2 sample rounds")
        server.stop()
        outage_from = server.samples()[-1][0]
        wait_spool(spool, lambda n: n >= 15)  # the agent keeps sampling while nobody listens
        server.start()
        server.wait(lambda s: sum(ts > outage_from for ts, _, _ in s.samples()) >= 20,
                    what="rounds sampled during the outage")
        wait_spool(spool, lambda n: n < 5)
    finally:
        assert stop(agent) == 0
    assert_every_round_once(server, 0.05)


def test_kill9_then_restart_keeps_seq_increasing(server, tmp_path):
    agent = start_agent(tmp_path, server.port)
    try:
        server.wait(lambda s: len(s.samples()) >= 3, what="3 sample rounds")
        stop(agent, signal.SIGKILL)
        before = max(server.seqs())
        killed_at = server.samples()[-1][0]
        agent = start_agent(tmp_path, server.port)
        # a counter that restarted would send seqs the control plane holds: acked as resends,
        # never stored
        server.wait(lambda s: sum(ts > killed_at for ts, _, _ in s.samples()) >= 3,
                    what="rounds after the restart stored")
    finally:
        assert stop(agent) == 0
    assert max(server.seqs()) > before
    assert_every_round_once(server, 1.0)


def test_spool_lost_agent_renumbers_past_what_the_control_plane_stored(server, tmp_path):
    agent = start_agent(tmp_path, server.port)
    try:
        server.wait(lambda s: len(s.samples()) >= 3, what="3 sample rounds")
    finally:
        assert stop(agent) == 0
    stored, rounds = max(server.seqs()), len(server.samples())
    shutil.rmtree(tmp_path / "spool-node-0")  # the node lost its disk
    agent = start_agent(tmp_path, server.port)
    try:
        server.wait(lambda s: len(s.samples()) >= rounds + 3, what="rounds of the new spool")
    finally:
        assert stop(agent) == 0
    assert min(s for s in server.seqs() if s > stored) > stored


def test_acks_final_or_retried(tmp_path):
    """An ack with a final code (stored, or refused for good) drops the message from the spool;
    any other (INTERNAL: the store failed) keeps it and sends it again on the same stream."""

    async def scenario():
        spool = Spool(tmp_path / "spool")
        up = Uplink(spool, UplinkOptions(retry_after_s=0.01), hello=pb.Hello, on_control=list.append)
        seqs = [spool.append(pb.AgentMessage(samples=pb.DeviceSamples())) for _ in range(3)]
        up._on_ack(pb.Ack(seq=seqs[0], code=3, message="samples.values: refused"))
        up._on_ack(pb.Ack(seq=seqs[1], code=13, message="not stored: OperationalError"))
        up._on_ack(pb.Ack(seq=seqs[2], code=0))
        up.wakeup.clear()
        await asyncio.wait_for(up.wakeup.wait(), 5)  # the retry, after retry_after_s
        return [s for s, _ in spool.pending()], up._retry, up.rejected

    pending, retry, rejected = asyncio.run(scenario())
    assert len(pending) == 1 and retry == set(pending) and rejected == 1


def test_sigint_exits_cleanly_while_disconnected(tmp_path):
    agent = start_agent(tmp_path, free_port())  # nobody listens: it keeps backing off
    try:
        wait_spool(tmp_path / "spool-node-0" / "spool.sqlite", lambda n: n >= 3)
    finally:
        code = stop(agent, signal.SIGINT)
    assert code == 0


def test_tls_with_a_private_ca_and_the_token(tmp_path):
    if shutil.which("openssl") is None:
        unavailable("openssl", "not on PATH")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = Server(tmp_path, extra=("--auth", "--tls-cert", str(cert), "--tls-key", str(key)),
                    health_ca=cert)
    token = node_token(server)
    server.start()
    agent = start_agent(tmp_path, server.port, "node-0", "--tls", "--tls-ca", str(cert),
                        "--token", token, host="localhost")  # the name in the certificate
    try:
        server.wait(lambda s: len(s.samples()) >= 2, what="2 sample rounds over TLS")
    finally:
        assert stop(agent) == 0
        server.close()


def test_a_full_spool_drops_oldest_samples_and_reports_the_count(tmp_path):
    server = Server(tmp_path)
    spool = tmp_path / "spool-node-0" / "spool.sqlite"
    # ~2 KB of spool: a handful of sample rounds; nobody listens yet
    agent = start_agent(tmp_path, server.port, "node-0", "--spool-max-mb", "0.002",
                        interval=0.05)
    try:
        wait_spool(spool, lambda n: n >= 3)
        dropped_rounds = 20  # sample rounds dropped while the control plane is away
        wait_until(lambda: dropped(spool) >= dropped_rounds, 30, "rounds dropped from the spool")
        server.start()
        got = server.wait(lambda s: [(m, v) for _, m, v in s.samples()
                                     if "agent_spool_dropped_total" in m], what="the drop count")
    finally:
        assert stop(agent) == 0
        server.close()
    metrics, values = got[0]
    assert (values[:, metrics.index("agent_spool_dropped_total")] >= dropped_rounds).all()
    assert len(server.samples()) < dropped_rounds


def dropped(spool_file) -> int:
    db = sqlite3.connect(f"file:{spool_file}?mode=ro", uri=True, timeout=5)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'dropped_samples'").fetchone()
    finally:
        db.close()
    return row[0] if row else 0
