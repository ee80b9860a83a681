"""``moeplane serve``: one asyncio process with gRPC ingest, REST and the dashboard.

Everything with side effects is built here, at start, from Settings — nothing at import time.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys

import grpc
import uvicorn

from moeplane.controlplane import startup
from moeplane.controlplane.api.app import create_api
from moeplane.controlplane.auth.dashboard import DashboardGate, flask_role, require_operator
from moeplane.controlplane.auth.serving import OPEN_BANNER, open_mode_problem
from moeplane.controlplane.auth.tokens import TokenStore
from moeplane.controlplane.controller.executor import Executor
from moeplane.controlplane.controller.leader import Leadership
from moeplane.controlplane.controller.offload import OffloadController
from moeplane.controlplane.controller.runner import Controller
from moeplane.controlplane.ingest.batcher import Batcher
from moeplane.controlplane.ingest.service import IngestService, JobCatalog, add_ingest_to_server
from moeplane.controlplane.ingest.steps import StepBound
from moeplane.controlplane.ingest.validate import JobShape
from moeplane.controlplane.retention import Retention, RetentionPolicy
from moeplane.controlplane.settings import Settings
from moeplane.controlplane.store import queries
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.controlplane.store.writes import StoreWriter

log = logging.getLogger("moeplane.serve")


def _mount_dashboard(api, engine, loop: asyncio.AbstractEventLoop, tokens: TokenStore | None) -> bool:
    try:
        from a2wsgi import WSGIMiddleware

        from moeplane.dashboard.actions import executor_plan_actions
        from moeplane.dashboard.app import create_dash
    except ImportError as exc:  # the dashboard package is optional at this layer
        log.warning("dashboard not mounted: %s", exc)
        return False
    # plan approval from the dashboard runs the executor on this loop (where the bus lives)
    approve, reject = executor_plan_actions(api.state.executor, loop)
    # with tokens, the gate admits viewers and only operators may approve or reject
    approve, reject = (require_operator(a, flask_role) for a in (approve, reject))
    dash_app = create_dash(engine, requests_pathname_prefix="/dashboard/", approve=approve, reject=reject,
                           placements=api.state.placements)
    api.mount("/dashboard", DashboardGate(WSGIMiddleware(dash_app.server), tokens))
    return True


async def serve(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    signals: bool = True,
    on_ready=None,
) -> int:
    """Run until ``stop`` is set or (with ``signals``) SIGINT/SIGTERM arrives.

    ``on_ready(info)`` is called once serving, with the bound ``grpc_port`` and ``http_port``.
    Returns an exit status.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    problem = open_mode_problem(settings.auth, settings.http_host, settings.grpc_listen)
    if problem:
        print(f"moeplane serve: {problem}", file=sys.stderr, flush=True)
        return 2
    try:  # what can fail on the operator's settings fails here, in one line
        tls, http_socket, engine, bus = await startup.prepare(settings)
    except startup.StartupError as exc:
        print(f"moeplane serve: {exc}", file=sys.stderr, flush=True)
        return 2
    policy = RetentionPolicy(
        raw_s=settings.raw_retention_s, loads_s=settings.loads_retention_s,
        minute_s=settings.minute_retention_s, hour_s=settings.hour_retention_s, lag_s=settings.rollup_lag_s,
    )
    tokens = TokenStore(engine) if settings.auth else None
    if settings.rebalance_mode:
        from moeplane.controlplane.store.plans import DEFAULT_POLICY, set_policy

        await asyncio.to_thread(set_policy, engine, DEFAULT_POLICY, {"mode": settings.rebalance_mode})
    writer = StoreWriter(engine)
    batcher = Batcher(writer.write)
    batcher.start()

    def load_shape(job_id: str) -> JobShape | None:
        shape = writer.job_shape(job_id)
        return None if shape is None else JobShape(*shape)

    ingest = IngestService(
        writer, batcher, JobCatalog(load_shape), bus, sample_interval_s=settings.sample_interval_s,
        tokens=tokens, steps=StepBound(lambda job_id: queries.newest_step(engine, job_id), settings.max_steps_ahead),
    )
    grpc_server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            startup.GRPC_NO_REUSEPORT,
        ]
    )
    add_ingest_to_server(ingest, grpc_server)
    grpc_port = startup.bind_grpc(grpc_server, settings.grpc_listen, tls)
    await grpc_server.start()

    holder = f"{socket.gethostname()}:{os.getpid()}"
    placements = PlacementSource(engine)  # one cache of plan placements for the whole process
    executor = Executor(engine, bus)
    controller = Controller(engine, bus, Leadership(engine, holder=holder),
                            interval_s=settings.controller_interval_s, placements=placements)
    offload_controller = OffloadController(engine, bus, Leadership(engine, holder=holder),
                                           interval_s=settings.controller_interval_s)
    retention = Retention(engine, policy)
    background = [  # each ends once ``stop`` is set
        asyncio.create_task(controller.run(stop), name="controller"),
        asyncio.create_task(offload_controller.run(stop), name="offload-controller"),
        asyncio.create_task(
            retention.run(stop, settings.retention_interval_s) if settings.retention_interval_s > 0
            else stop.wait(),
            name="retention",
        ),
    ]

    async def shutdown() -> None:
        stop.set()
        await grpc_server.stop(grace=2)
        await asyncio.gather(*background)
        await batcher.stop()
        await bus.close()
        engine.dispose()

    api = create_api(engine, ingest=ingest, batcher=batcher, bus=bus, bus_name=bus.name, controller=controller,
                     offload_controller=offload_controller, tokens=tokens, retention=retention,
                     retention_policy=policy, placements=placements, executor=executor,
                     max_body_bytes=settings.max_body_bytes)
    dashboard = settings.dashboard and _mount_dashboard(api, engine, loop, tokens)
    http = uvicorn.Server(
        uvicorn.Config(
            api, host=settings.http_host, port=settings.http_port, log_level="warning", lifespan="off",
            ssl_certfile=settings.tls_certfile or None, ssl_keyfile=settings.tls_keyfile or None,
        )
    )
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
    while not http.started and not http_task.done():
        await asyncio.sleep(0.02)
    if http_task.done():  # the HTTP port could not be bound
        await shutdown()
        return 1
    grpc_host = settings.grpc_listen.rsplit(":", 1)[0]
    http_port = http.servers[0].sockets[0].getsockname()[1]
    base = f"{'https' if tls else 'http'}://{settings.http_host}:{http_port}"
    print(
        f"moeplane serving: grpc={grpc_host}:{grpc_port} api={base}/api/v1 docs={base}/docs"
        + (f" dashboard={base}/dashboard/" if dashboard else "")
        + f" database={engine.dialect.name} bus={bus.name}"
        + f" auth={'on' if tokens else 'OFF'} tls={'on' if tls else 'off'}",
        flush=True,
    )
    if tokens is None:
        print(OPEN_BANNER, flush=True)
        log.warning(OPEN_BANNER)
    if on_ready is not None:
        on_ready(
            {"grpc_port": grpc_port, "http_port": http_port, "ingest": ingest, "engine": engine,
             "bus": bus, "loop": loop}
        )
    stop_task = asyncio.create_task(stop.wait())
    await asyncio.wait([http_task, stop_task], return_when=asyncio.FIRST_COMPLETED)
    http.should_exit = True
    await http_task
    stop_task.cancel()
    await shutdown()
    return 0


def run(settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Ingest allocates objects per message; with the default thresholds the cyclic collector
    # ran ~35 times a second and its full passes over the ~140k objects built at start took
    # ~20 % of the serving CPU under the 8,192-rank load (docs/bench-ingest.md). Objects that
    # exist once serving are frozen out of its view, and young passes run less often.
    gc.set_threshold(10_000, 20, 20)
    try:
        return asyncio.run(serve(settings, on_ready=lambda _info: gc.freeze()))
    except startup.StartupError as exc:  # the gRPC port was taken after prepare checked it
        print(f"moeplane serve: {exc}", file=sys.stderr, flush=True)
        return 2
