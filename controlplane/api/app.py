"""FastAPI app factory. Domain errors become status codes here and only here."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Engine

from moeplane.controlplane.api.claims import router as claims_router
from moeplane.controlplane.api.history import router as history_router
from moeplane.controlplane.api.methods import MethodsGuard
from moeplane.controlplane.api.metrics import router as metrics_router
from moeplane.controlplane.api.offload import router as offload_router
from moeplane.controlplane.api.plans import default_router as default_policy_router
from moeplane.controlplane.api.plans import router as plans_router
from moeplane.controlplane.api.readcache import ReadCache
from moeplane.controlplane.api.rl import router as rl_router
from moeplane.controlplane.api.rl_loads import router as rl_loads_router
from moeplane.controlplane.api.routes import router
from moeplane.controlplane.api.rules import document_rules
from moeplane.controlplane.api.tokens import router as tokens_router
from moeplane.controlplane.auth.body import DEFAULT_MAX_BODY_BYTES, BodyGuard
from moeplane.controlplane.auth.http import AUTH_RESPONSES, AuthDep, document_security
from moeplane.controlplane.domain.lifecycle import Conflict
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.controlplane.store.queries import NotFound


def create_api(engine: Engine, **state) -> FastAPI:
    """Build the REST app. ``state`` entries (ingest, batcher, bus_name) land on app.state.

    ``tokens`` (a TokenStore) turns access control on for every route; without it the API is open.
    """
    app = FastAPI(
        title="moeplane",
        version="0.1.0",
        description="Control plane for Mixture-of-Experts training clusters.",
        dependencies=[AuthDep],
        responses=AUTH_RESPONSES,
    )
    app.state.engine = engine
    # authenticate before a body is read, and bound it (413)
    app.add_middleware(BodyGuard, max_bytes=state.pop("max_body_bytes", None) or DEFAULT_MAX_BODY_BYTES)
    app.add_middleware(MethodsGuard)  # HEAD, OPTIONS and 405 with the path's real Allow
    app.state.tokens = None
    build = app.openapi
    app.openapi = lambda: document_rules(build())  # x-rules: each operation's cross-field rules, 422
    document_security(app)  # on top: the document is built, with its rules, once and cached
    app.state.read_cache = ReadCache()  # history pages shared by identical reads
    for k, val in state.items():
        setattr(app.state, k, val)
    if getattr(app.state, "placements", None) is None:  # serve passes the process's one
        app.state.placements = PlacementSource(engine)
    app.include_router(router)
    app.include_router(plans_router)
    app.include_router(tokens_router)
    app.include_router(claims_router)
    app.include_router(history_router)
    app.include_router(metrics_router)
    app.include_router(default_policy_router)
    app.include_router(offload_router)
    app.include_router(rl_router)
    app.include_router(rl_loads_router)

    @app.exception_handler(NotFound)
    async def _not_found(_request: Request, exc: NotFound):
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, exc: Conflict):
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(ValueError)
    async def _bad_value(_request: Request, exc: ValueError):
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    return app
