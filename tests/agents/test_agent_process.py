"""The agent as a real subprocess against a real (fake) grpc.aio control plane."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array, encode_array
from tests.agents.fake_ingest import FakeIngest
from tests.agents.procs import start_agent, stop
from tests.conftest import free_port


@pytest.fixture
def ingest():
    server = FakeIngest(free_port()).start()
    yield server
    server.stop()


def samples_of(store, node="node-0"):
    return sorted((seq, m.samples) for (n, seq), m in store.stored.items()
                  if n == node and m.WhichOneof("body") == "samples")


def test_hello_then_samples_are_stored_and_acknowledged(ingest, tmp_path):
    agent = start_agent(tmp_path, ingest.port, "node-0", "--token", "s3cret")
    try:
        got = ingest.wait_for(lambda s: len(samples_of(s)) >= 3 and samples_of(s))
    finally:
        assert stop(agent) == 0
    hello = ingest.snapshot(lambda s: s.hellos[0])
    assert hello.node_id == "node-0"
    assert [d.device_id for d in hello.devices] == [f"node-0/gpu{i}" for i in range(4)]
    assert all(d.kind == "sim" and d.memory_total_bytes > 0 for d in hello.devices)
    assert ingest.snapshot(lambda s: s.metadata[0]["authorization"]) == "Bearer s3cret"
    seq, first = got[0]
    values = decode_array(first.values, "values", ndim=2)
    assert values.shape == (4, len(first.metrics))
    assert "utilization_ratio" in first.metrics and "memory_used_bytes" in first.metrics
    util = values[:, list(first.metrics).index("utilization_ratio")]
    assert ((util >= 0) & (util <= 1)).all()
    seqs = [s for s, _ in got]
    assert seqs == sorted(set(seqs)) and seqs[0] > hello_seq(ingest)


def hello_seq(ingest):
    return ingest.snapshot(lambda s: min(seq for (n, seq), m in s.stored.items()
                                         if m.WhichOneof("body") == "hello"))


def test_unacked_messages_are_resent_after_a_dropped_connection_and_stored_once(
        ingest, tmp_path):
    agent = start_agent(tmp_path, ingest.port)
    try:
        ingest.wait_for(lambda s: len(samples_of(s)) >= 2)
        ingest.hold_acks = True  # stored, but the agent never hears about it
        held = ingest.wait_for(lambda s: len(samples_of(s)) >= 6 and samples_of(s))
        held_seqs = {seq for seq, _ in held}
        ingest.hold_acks = False
        ingest.drop_connections()
        ingest.wait_for(lambda s: s.connects >= 2)
        ingest.wait_for(lambda s: s.duplicates >= 4)  # unacked ones came back
        after = ingest.wait_for(lambda s: len(samples_of(s)) >= len(held) + 3 and samples_of(s))
    finally:
        assert stop(agent) == 0
    resent = ingest.snapshot(lambda s: [m.seq for _, m in s.received
                                        if m.WhichOneof("body") == "samples"])
    # every held seq arrived at least twice, yet is stored once
    counts = {seq: resent.count(seq) for seq in held_seqs}
    assert sum(c >= 2 for c in counts.values()) >= 4
    stored = [seq for seq, _ in after]
    assert len(stored) == len(set(stored))
    # no sample seq was skipped: samples are the only stored kind besides hellos
    stamps = [m.timestamp for _, m in ingest.snapshot(samples_of)]
    assert len(set(stamps)) == len(stamps)


def test_outage_of_the_control_plane_loses_nothing(ingest, tmp_path):
    agent = start_agent(tmp_path, ingest.port, interval=0.05)
    spool = tmp_path / "spool-node-0" / "spool.sqlite"
    try:
        ingest.wait_for(lambda s: len(samples_of(s)) >= 2)
        ingest.stop()
        outage_from = max(seq for seq, _ in ingest.snapshot(samples_of))
        # the agent keeps sampling into its spool while nobody listens
        wait_spool(spool, lambda n: n >= 15)
        ingest.start()
        ingest.wait_for(lambda s: len([q for q, _ in samples_of(s) if q > outage_from]) >= 20)
        wait_spool(spool, lambda n: n == 0)  # everything spooled was acknowledged
    finally:
        assert stop(agent) == 0
    assert ingest.snapshot(lambda s: s.connects) >= 2
    stored = ingest.snapshot(samples_of)
    stamps = [m.timestamp for _, m in stored]
    assert stamps == sorted(stamps), "replayed out of order"
    assert len(set(stamps)) == len(stamps), "a sample was stored twice under two seqs"
    assert np.diff(stamps).max() < 1.0, "samples were not taken during the outage"


def spool_count(spool_file) -> int:
    import sqlite3

    db = sqlite3.connect(f"file:{spool_file}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute("SELECT count(*) FROM messages").fetchone()[0]
    except sqlite3.OperationalError:  # the agent has not created its table yet
        return -1
    finally:
        db.close()


def wait_spool(spool_file, predicate, timeout: float = 20.0) -> None:
    """Poll the agent's spool file (read-only) until ``predicate(pending count)`` holds."""
    import time

    deadline = time.monotonic() + timeout
    while not (spool_file.exists() and predicate(count := spool_count(spool_file))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"spool condition not met in {timeout} s")
        time.sleep(0.05)
    return count


def test_kill9_then_restart_resends_unacked_and_keeps_seq_increasing(ingest, tmp_path):
    agent = start_agent(tmp_path, ingest.port)
    try:
        ingest.wait_for(lambda s: len(samples_of(s)) >= 2)
        ingest.hold_acks = True
        held = ingest.wait_for(lambda s: len(samples_of(s)) >= 5 and samples_of(s))
        stop(agent, signal.SIGKILL)
        max_before = ingest.snapshot(lambda s: max(seq for (_, seq) in s.stored))
        ingest.hold_acks = False
        agent = start_agent(tmp_path, ingest.port)
        ingest.wait_for(lambda s: s.connects >= 2)
        ingest.wait_for(lambda s: max(seq for (_, seq) in s.stored) > max_before + 3)
    finally:
        assert stop(agent) == 0
    hellos = ingest.snapshot(lambda s: sorted(seq for (_, seq), m in s.stored.items()
                                             if m.WhichOneof("body") == "hello"))
    assert hellos[1] > max(seq for seq, _ in held)  # the counter survived kill -9
    dups = ingest.snapshot(lambda s: s.duplicates)
    assert dups >= 1  # the held (stored but unacked) samples were resent ...
    stored = ingest.snapshot(samples_of)
    assert len({seq for seq, _ in stored}) == len(stored)  # ... and stored once


def test_rejected_messages_are_not_resent(ingest, tmp_path):
    rejected: list[int] = []

    def reject(msg):
        if msg.WhichOneof("body") == "samples" and not rejected:
            rejected.append(msg.seq)
            return "samples.values: rejected by the test"
        return None

    ingest.reject = reject
    agent = start_agent(tmp_path, ingest.port)
    try:
        ingest.wait_for(lambda s: len(samples_of(s)) >= 2)
        ingest.drop_connections()
        ingest.wait_for(lambda s: s.connects >= 2)
        ingest.wait_for(lambda s: len(samples_of(s)) >= 5)
    finally:
        assert stop(agent) == 0
    sends = ingest.snapshot(lambda s: [m.seq for _, m in s.received if m.seq == rejected[0]])
    assert sends == [rejected[0]]


def test_not_stored_internal_error_is_retried_on_the_same_stream(ingest, tmp_path):
    failed: list[int] = []

    def fail_once(msg):
        if msg.WhichOneof("body") == "samples" and not failed:
            failed.append(msg.seq)
            return (13, "not stored: OperationalError")
        return None

    ingest.reject = fail_once
    agent = start_agent(tmp_path, ingest.port)
    try:
        ingest.wait_for(lambda s: failed and ("node-0", failed[0]) in s.stored)
    finally:
        assert stop(agent) == 0
    assert ingest.snapshot(lambda s: s.connects) == 1
    sends = ingest.snapshot(lambda s: [m.seq for _, m in s.received if m.seq == failed[0]])
    assert sends == [failed[0], failed[0]]


def test_spool_lost_agent_renumbers_past_what_the_control_plane_stored(ingest, tmp_path):
    ingest.resume_after_seq = 10_000  # this node wrote seqs up to 10000 in a former life
    agent = start_agent(tmp_path, ingest.port)
    try:
        got = ingest.wait_for(lambda s: len(samples_of(s)) >= 3 and samples_of(s))
    finally:
        assert stop(agent) == 0
    assert min(seq for seq, _ in got) > 10_000


def test_sigint_exits_cleanly_while_disconnected(tmp_path):
    agent = start_agent(tmp_path, free_port())  # nobody listens: it keeps backing off
    try:
        wait_spool(tmp_path / "spool-node-0" / "spool.sqlite", lambda n: n >= 3)
    finally:
        code = stop(agent, signal.SIGINT)
    assert code == 0


def test_plan_from_the_control_plane_reaches_a_report(ingest, tmp_path):
    agent = start_agent(tmp_path, ingest.port, "node-0", "--job-id", "j1",
                        env={"MOEPLANE_AGENT_TOKEN": "from-env"})
    try:
        ingest.wait_for(lambda s: s.connects >= 1 and len(samples_of(s)) >= 1)
        assert ingest.snapshot(lambda s: s.metadata[0]["authorization"]) == "Bearer from-env"
        plan = pb.PlacementPlan(job_id="j1", epoch=3, slots_per_rank=1, not_before_step=5,
                                phy2log=encode_array(np.array([[0, 1], [1, 0]], np.uint8)))
        ingest.send_plan(plan)
        report = ingest.wait_for(lambda s: [m.plan_report for _, m in s.stored.items()
                                            if m.WhichOneof("body") == "plan_report"])
    finally:
        assert stop(agent) == 0
    assert (report[0].job_id, report[0].epoch, report[0].state) == (
        "j1", 3, pb.PLAN_STATE_RECEIVED)


def test_tls_with_a_private_ca_and_the_token(tmp_path):
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = FakeIngest(free_port(), tls=(key.read_bytes(), cert.read_bytes())).start()
    agent = start_agent(tmp_path, server.port, "node-0", "--tls", "--tls-ca", str(cert),
                        "--token", "t0k", host="localhost")  # the name in the certificate
    try:
        got = server.wait_for(lambda s: len(samples_of(s)) >= 2 and samples_of(s))
    finally:
        assert stop(agent) == 0
        server.stop()
    assert got and server.snapshot(lambda s: s.metadata[0]["authorization"]) == "Bearer t0k"


def test_a_full_spool_drops_oldest_samples_and_reports_the_count(tmp_path):
    port = free_port()
    spool = tmp_path / "spool-node-0" / "spool.sqlite"
    # ~2 KB of spool: a handful of sample rounds; nobody listens yet
    agent = start_agent(tmp_path, port, "node-0", "--spool-max-mb", "0.002", interval=0.05)
    server = None
    try:
        wait_spool(spool, lambda n: n >= 3)
        dropped_rounds = 20  # sample rounds dropped while the control plane is away
        wait_dropped(spool, dropped_rounds)
        server = FakeIngest(port).start()
        got = server.wait_for(lambda s: [m.samples for m in s.stored.values()
                                         if m.WhichOneof("body") == "samples"
                                         and "agent_spool_dropped_total" in m.samples.metrics])
    finally:
        assert stop(agent) == 0
        if server is not None:
            server.stop()
    first = got[0]
    col = list(first.metrics).index("agent_spool_dropped_total")
    dropped = decode_array(first.values, "v")[:, col]
    assert (dropped >= dropped_rounds).all()
    assert server.snapshot(lambda s: len(samples_of(s))) < dropped_rounds


def wait_dropped(spool_file, n: int, timeout: float = 20.0) -> None:
    import sqlite3
    import time

    deadline = time.monotonic() + timeout
    while True:
        db = sqlite3.connect(f"file:{spool_file}?mode=ro", uri=True, timeout=5)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'dropped_samples'").fetchone()
        finally:
            db.close()
        if row and row[0] >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"spool dropped {row} < {n} samples")
        time.sleep(0.05)
