"""ASGI middleware in front of the REST API: authenticate before a body is read, and bound it.

FastAPI reads a request's body before its dependencies run, so a caller without a token could
make the server read (and parse) any amount of JSON before the 401: a 90 MB body took 1.8 s
and 737 MB of peak RSS to refuse. Here, for a request that may carry a body (any method but
GET, HEAD, OPTIONS):

- under ``/api/`` with tokens on, a missing, unknown or revoked bearer token gets 401 before a
  byte of the body is read; the caller found is kept in the request's state (``AUTHENTICATED``)
  and ``auth.http.authorize`` checks the route's role against it without a second lookup;
- a body past ``max_bytes`` gets 413: at once when its Content-Length says so, else as soon as
  the bytes read pass it. The body is read here (bounded) and handed on to the app.

The default bound, 8 MiB, holds the largest legitimate body: a placement of 58 layers x 8,192
slots as JSON (``POST /jobs/{job}/placement``) is about 3.3 MB with 5-digit expert ids.
"""

from __future__ import annotations

import json

from anyio import to_thread

from moeplane.controlplane.auth.tokens import bearer

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
NO_BODY = frozenset({"GET", "HEAD", "OPTIONS"})
AUTHENTICATED = "moeplane_authenticated"  # the request-state key of the caller found here


class BodyGuard:
    """``app.state.tokens`` (read per request; None: open) decides whether to authenticate."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes: must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in NO_BODY:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        tokens = getattr(getattr(scope.get("app"), "state", None), "tokens", None)
        if tokens is not None and scope["path"].startswith("/api/"):
            secret = bearer(headers.get(b"authorization", b"").decode("latin-1"))
            principal = None if secret is None else await to_thread.run_sync(tokens.authenticate, secret)
            if principal is None:
                return await _refuse(send, 401, "a valid API token is required",
                                     [(b"www-authenticate", b"Bearer")])
            # ``auth.http.authorize`` checks this request's role with it: one lookup per request
            scope.setdefault("state", {})[AUTHENTICATED] = principal
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await _refuse(send, 413, f"the body is larger than {self.max_bytes} bytes")
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _refuse(send, 413, f"the body is larger than {self.max_bytes} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()  # after the body: wait for the disconnect
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _refuse(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
