"""Run the real control plane (``moeplane.controlplane.server.serve``) on the tests' shared event loop.

It listens on real sockets; tests talk to it over gRPC and HTTP like any agent or user.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from contextlib import contextmanager

from moeplane.controlplane.server import serve
from moeplane.controlplane.settings import Settings
from tests import aio


@contextmanager
def running_server(database_url: str, redis_url: str = "", **overrides):
    """Yield ``info`` (grpc_port, http_port, ingest, engine, bus, loop) of a started server."""
    settings = Settings(
        database_url=database_url,
        redis_url=redis_url,
        grpc_listen="127.0.0.1:0",
        http_port=0,
        dashboard=overrides.pop("dashboard", False),
        **overrides,
    )
    ready: concurrent.futures.Future = concurrent.futures.Future()
    stop_holder: dict = {}

    async def main():
        stop_holder["stop"] = asyncio.Event()
        return await serve(settings, stop_holder["stop"], signals=False, on_ready=ready.set_result)

    task = asyncio.run_coroutine_threadsafe(main(), aio.loop())
    task.add_done_callback(lambda t: ready.done() or ready.set_exception(
        t.exception() or RuntimeError("server exited before it was ready")))
    info = ready.result(60)
    try:
        yield info
    finally:
        aio.loop().call_soon_threadsafe(stop_holder["stop"].set)
        task.result(30)
