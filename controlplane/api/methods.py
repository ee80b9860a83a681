"""ASGI middleware: HEAD, OPTIONS and 405 answers that tell the truth about a REST path.

FastAPI routes answer only the methods they declare, one route per method: ``HEAD`` of a GET
path and ``OPTIONS`` of any path got 405, and a 405's ``Allow`` named only the first route
matching the path (``GET`` for ``/jobs/{job}/policy``, which also takes ``PUT``). Here, for a
path under ``/api/`` that some route matches:

- ``OPTIONS`` → 204 with ``Allow`` listing every method of the path (no token needed: it
  reveals only what ``/openapi.json`` does);
- ``HEAD`` of a GET path → the GET, with its headers and no body (GET's role applies);
- a method the path does not take → 405 with the full ``Allow``.
"""

from __future__ import annotations

from starlette.routing import Match


class MethodsGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            return await self.app(scope, receive, send)
        method = scope["method"]
        if method in METHODS and _takes(scope, method):  # the common case: one scan, no more
            return await self.app(scope, receive, send)
        allowed = {m for m in METHODS if m != method and _takes(scope, m)}
        if not allowed:
            return await self.app(scope, receive, send)
        allow = ", ".join(sorted(allowed | {"OPTIONS"} | ({"HEAD"} if "GET" in allowed else set())))
        if method == "OPTIONS":
            return await _empty(send, 204, allow)
        if method == "HEAD" and "GET" in allowed:
            return await self.app(scope | {"method": "GET"}, receive, _without_body(send))
        return await _empty(send, 405, allow, b'{"detail":"Method Not Allowed"}')


METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _takes(scope, method: str) -> bool:
    """Whether some route takes ``method`` at ``scope``'s path, asked of the routes as they
    match requests (included routers wrap their routes)."""
    probe = scope | {"method": method}
    return any(route.matches(probe)[0] is Match.FULL for route in getattr(scope.get("app"), "routes", ()))


def _without_body(send):
    async def head_send(message):
        if message["type"] == "http.response.body":
            message = {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
        await send(message)

    return head_send


async def _empty(send, status: int, allow: str, body: bytes = b"") -> None:
    headers = [(b"allow", allow.encode()), (b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
