"""Revoking a node token ends its open Ingest.Connect streams (UNAUTHENTICATED) within 1 s,
and nothing it sends after is stored (issue 33, item 4): one server with the in-process bus,
and two replicas on PostgreSQL sharing Redis (revoked through one, the stream on the other). On the replica that revokes, a message
sent after the 200 is not stored; another replica learns of it through the bus.
"""

from __future__ import annotations

import time

import grpc
import httpx
import numpy as np

from moeplane.controlplane.auth.tokens import Role, TokenStore
from moeplane.controlplane.store import queries as q
from tests import aio
from tests.controlplane.agentclient import hello, loads
from tests.controlplane.serverthread import running_server
from tests.security.stream import Agent

COUNTS = np.ones((4, 8), dtype=np.int64)


def _revoke_ends_stream(stream_port: int, revoke_http_port: int, engine) -> tuple[float, grpc.StatusCode, dict]:
    store = TokenStore(engine)
    admin = store.create(Role.ADMIN).secret
    node = store.create(Role.NODE, node_id="node-0")

    async def script():
        agent = await Agent(stream_port, "node-0", token=node.secret).__aenter__()
        agent.send(hello("node-0"))
        await agent.config()
        agent.send(loads(1, step=1, counts=COUNTS))
        await agent.wait_acks([1])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{revoke_http_port}/api/v1") as http:
            r = await http.delete(f"/tokens/{node.principal.token_id}",
                                  headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 200 and r.json()["revoked_at"] is not None
        revoked_at = time.monotonic()
        agent.send(loads(2, step=2, counts=COUNTS))  # sent after the 200
        status = await agent.wait_ended(5)
        ended_s = time.monotonic() - revoked_at
        await agent.__aexit__(None, None, None)
        return ended_s, status, agent.acks()

    return aio.run(script())


def test_revocation_ends_the_open_stream(tmp_path):
    with running_server(f"sqlite:///{tmp_path / 'r.sqlite'}", auth=True) as srv:
        ended_s, status, acks = _revoke_ends_stream(srv["grpc_port"], srv["http_port"], srv["engine"])
        assert 2 not in acks
        assert status == grpc.StatusCode.UNAUTHENTICATED
        assert ended_s <= 1.0, f"the stream ended {ended_s:.2f} s after the revocation"
        assert q.latest_step(srv["engine"], "job-1") == 1  # the message after the 200 was not stored


def test_revocation_through_another_replica_ends_the_stream(pg_url, redis_url):
    with running_server(pg_url, redis_url, auth=True) as r1, running_server(pg_url, redis_url, auth=True) as r2:
        ended_s, status, _acks = _revoke_ends_stream(r1["grpc_port"], r2["http_port"], r1["engine"])
        assert status == grpc.StatusCode.UNAUTHENTICATED
        assert ended_s <= 1.0, f"the stream ended {ended_s:.2f} s after the revocation"
