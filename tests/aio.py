"""One event loop for the whole test session, in a background thread.

grpc.aio binds its completion queue to an event loop; creating and closing a loop per test
leaves callbacks aimed at closed loops. Servers and clients in tests all run here instead.
"""

from __future__ import annotations

import asyncio
import threading

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="test-aio", daemon=True).start()
    return _loop


def run(coro, timeout: float = 120.0):
    """Run ``coro`` on the shared loop and return its result (blocking the calling thread)."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)
