"""Access control for the dashboard, which a browser cannot send bearer headers to.

``DashboardGate`` wraps the mounted Dash app (ASGI). With tokens enabled it accepts a token
from the ``moeplane_token`` cookie or an ``Authorization: Bearer`` header; a first visit to
``/dashboard/?token=mp_...`` sets the cookie (HttpOnly, SameSite=Strict, and Secure under
TLS) and redirects to the same page without the token in the address. No valid token → 401 page saying how to log in.
The caller's role travels to the Flask side in the ``X-Moeplane-Role`` header (any such header
from the client is dropped first); ``require_operator`` checks it before an approval.
"""

from __future__ import annotations

from collections.abc import Callable
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from moeplane.controlplane.auth.tokens import Role, TokenStore, bearer

COOKIE = "moeplane_token"
ROLE_HEADER = b"x-moeplane-role"

LOGIN_PAGE = (
    b"<!doctype html><title>moeplane: log in</title><h1>A valid API token is required</h1>"
    b"<p>Open <code>/dashboard/?token=YOUR_TOKEN</code> once (a viewer token shows the cluster; "
    b"approving plans needs an operator token). Create one with "
    b"<code>moeplane token create --role viewer</code>.</p>"
)


class Forbidden(ValueError):
    """The dashboard user's role may not do this (shown on the page like other refusals)."""


class DashboardGate:
    def __init__(self, app, tokens: TokenStore | None):
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.tokens is None:
            return await self.app(scope, receive, send)
        headers = [(k, v) for k, v in scope.get("headers", []) if k != ROLE_HEADER]
        query = dict(parse_qsl(scope.get("query_string", b"").decode()))
        from_query = query.pop("token", None)
        secret = from_query or _cookie(headers) or bearer(_header(headers, b"authorization"))
        principal = self.tokens.authenticate(secret) if secret else None
        if principal is None or principal.role is Role.NODE:
            return await _respond(send, 401, LOGIN_PAGE, [(b"content-type", b"text/html; charset=utf-8")])
        if from_query is not None:  # set the cookie, drop the token from the address
            location = _full_path(scope) + (f"?{urlencode(query)}" if query else "")
            secure = "; Secure" if scope.get("scheme") == "https" else ""  # never sent over plain HTTP
            cookie = f"{COOKIE}={secret}; Path=/dashboard; HttpOnly; SameSite=Strict{secure}"
            return await _respond(send, 303, b"", [(b"location", location.encode()), (b"set-cookie", cookie.encode())])
        headers.append((ROLE_HEADER, str(principal.role).encode()))
        return await self.app(scope | {"headers": headers}, receive, send)


def require_operator(action: Callable, role_of_request: Callable[[], str | None]) -> Callable:
    """Wrap a plan action so it runs only for operator (or admin) dashboard users.

    ``role_of_request()`` returns the role header of the current request, or None when the
    dashboard runs open (no gate)."""

    def guarded(*args, **kwargs):
        role = role_of_request()
        if role is not None and not Role(role).allows(Role.OPERATOR):
            raise Forbidden(f"role {role} may not change plans (needs operator)")
        return action(*args, **kwargs)

    return guarded


def flask_role() -> str | None:
    """The gate's role header on the current Flask request (None outside a gated request)."""
    from flask import has_request_context, request

    if not has_request_context():
        return None
    return request.headers.get(ROLE_HEADER.decode())


def _full_path(scope) -> str:
    """The path the browser asked for. Mounted (Starlette's ``Mount``), ``path`` already holds
    the mount's prefix and ``root_path`` is that prefix; bare, ``path`` is relative to it."""
    root, path = scope.get("root_path", ""), scope["path"]
    return path if root and (path == root or path.startswith(root.rstrip("/") + "/")) else root + path


def _header(headers, name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return v.decode("latin-1")
    return None


def _cookie(headers) -> str | None:
    raw = _header(headers, b"cookie")
    if not raw:
        return None
    jar = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # noqa: BLE001 - a malformed cookie header is no token
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel else None


async def _respond(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
