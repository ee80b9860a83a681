"""FastAPI side of access control: one app-wide dependency that enforces a role per route.

A route's minimum role is its ``x-min-role`` OpenAPI extension (``role_extra(Role.ADMIN)``);
without one, GET/HEAD need viewer and every other method needs operator. ``public`` routes
(health) need no token. With ``app.state.tokens`` None the API runs open (loopback demo).
No token or an unknown/revoked one → 401; a weaker role → 403. The store is read on every
request: nothing is cached past a revocation.
"""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from moeplane.controlplane.api.schemas import ErrorBody
from moeplane.controlplane.auth.body import AUTHENTICATED
from moeplane.controlplane.auth.tokens import Principal, Role

ROLE_KEY = "x-min-role"
PUBLIC = "public"
bearer_scheme = HTTPBearer(auto_error=False, description="an API token: Authorization: Bearer mp_...")

AUTH_RESPONSES = {
    401: {"model": ErrorBody, "description": "no token, or an unknown or revoked token"},
    403: {"model": ErrorBody, "description": "the token's role is too weak for this operation"},
}


def role_extra(role: Role | str) -> dict:
    """``openapi_extra`` for a route that needs ``role`` (or ``"public"``)."""
    return {ROLE_KEY: str(role)}


def needed_role(request: Request) -> Role | None:
    """The minimum role of the matched route; None for a public one."""
    route = request.scope.get("route")
    extra = getattr(route, "openapi_extra", None) or {}
    declared = extra.get(ROLE_KEY)
    if declared == PUBLIC:
        return None
    if declared is not None:
        return Role(declared)
    return Role.VIEWER if request.method in ("GET", "HEAD") else Role.OPERATOR


async def authorize(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal | None:
    """App-wide dependency. Returns the caller (None when open or public). ``async``, and the
    token store is read in a worker thread only when tokens are on and ``BodyGuard`` has not
    already found this request's caller: an open or public request makes no round trip through
    the worker threads, and a request with a body looks its token up once."""
    tokens = getattr(request.app.state, "tokens", None)
    if tokens is None:
        return None
    needed = needed_role(request)
    if needed is None:
        return None
    principal = getattr(request.state, AUTHENTICATED, None)  # found by BodyGuard for this request
    if principal is None:
        principal = await to_thread.run_sync(tokens.authenticate, creds.credentials if creds else None)
    if principal is None:
        raise HTTPException(401, "a valid API token is required", headers={"WWW-Authenticate": "Bearer"})
    if not principal.role.allows(needed):
        raise HTTPException(403, f"role {principal.role} may not do this (needs {needed})")
    request.state.principal = principal
    return principal


AuthDep = Depends(authorize)


def document_security(app) -> None:
    """Make the OpenAPI document say what the server enforces: open (no tokens) → no security
    requirements; with tokens → bearer on every operation except public ones (``security: []``).
    Operations with a body also document 400 (unparseable body)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        enforced = getattr(app.state, "tokens", None) is not None
        for ops in doc.get("paths", {}).values():
            for op in ops.values():
                if not isinstance(op, dict):
                    continue
                if "requestBody" in op:  # a body that is not JSON at all is a 400, not a 422
                    op.setdefault("responses", {}).setdefault("400", {
                        "description": "the body could not be parsed",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    })
                if not enforced:
                    op.pop("security", None)
                    for code in ("401", "403"):
                        op.get("responses", {}).pop(code, None)
                elif op.get(ROLE_KEY) == PUBLIC:
                    op["security"] = []
                    for code in ("401", "403"):
                        op.get("responses", {}).pop(code, None)
        if not enforced:
            doc.get("components", {}).pop("securitySchemes", None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
