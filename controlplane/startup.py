"""Start-up steps of ``moeplane serve`` that can fail on the operator's settings.

Each raises :class:`StartupError` naming the setting and what is wrong in one line (``serve``
prints it and exits 2) instead of a driver's traceback: an unreachable or unusable database,
an unreachable Redis, a listen address without a port, a busy port (gRPC included: the port is
bound without SO_REUSEPORT, so a second server cannot share it), unreadable TLS files.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from moeplane.controlplane.auth.serving import add_grpc_port, tls_files
from moeplane.controlplane.bus import make_bus
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade

# gRPC server options: no port sharing (grpc sets SO_REUSEPORT by default, so a second server
# on a busy port would start and take half the connections).
GRPC_NO_REUSEPORT = ("grpc.so_reuseport", 0)
REDIS_TIMEOUT_S = 10.0


class StartupError(Exception):
    """``setting``: the flag/setting at fault (e.g. ``database_url``); ``problem``: what is wrong."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def _reason(exc: BaseException) -> str:
    """The first line of the innermost driver error (psycopg, sqlite3, OSError)."""
    inner = getattr(exc, "orig", None) or exc.__cause__ or exc
    text = str(inner).strip() or type(inner).__name__
    return text.splitlines()[0][:300]


def open_store(database_url: str):
    """Migrate the database to head and return its engine (blocking)."""
    try:
        engine = make_engine(database_url)
        with engine.connect() as conn:  # reachable and a database, before migrations log anything
            conn.exec_driver_sql("SELECT count(*) FROM sqlite_master" if engine.dialect.name == "sqlite" else "SELECT 1")
        upgrade(database_url)
    except Exception as exc:  # noqa: BLE001 - any driver failure becomes one line naming the setting
        raise StartupError("database_url", f"cannot use {_redacted(database_url)}: {_reason(exc)}") from exc
    return engine


def _redacted(url: str) -> str:
    """``url`` without a password."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{tail}"


async def start_bus(redis_url: str):
    """The bus, started (Redis pinged within REDIS_TIMEOUT_S)."""
    bus = make_bus(redis_url)
    try:
        await asyncio.wait_for(bus.start(), REDIS_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        await _close_quietly(bus)
        why = f"no answer within {REDIS_TIMEOUT_S:.0f} s" if isinstance(exc, TimeoutError) else _reason(exc)
        raise StartupError("redis_url", f"cannot reach {_redacted(redis_url)}: {why}") from exc
    return bus


async def _close_quietly(bus) -> None:
    with contextlib.suppress(Exception):  # closing a bus that never started
        await bus.close()


def read_tls(certfile: str, keyfile: str) -> tuple[bytes, bytes] | None:
    try:
        return tls_files(certfile, keyfile)
    except ValueError as exc:
        raise StartupError("tls_certfile", str(exc).split(": ", 1)[-1]) from exc
    except OSError as exc:
        raise StartupError("tls_certfile" if certfile in str(exc) else "tls_keyfile", _reason(exc)) from exc


def bind_grpc(server, address: str, tls: tuple[bytes, bytes] | None) -> int:
    """Bind ``address`` (the server must be built with GRPC_NO_REUSEPORT); its port.

    ``prepare`` checked the port with a plain socket first (gRPC's own failure also logs C-core
    lines); a port taken since then still fails here, in one line."""
    try:
        port = add_grpc_port(server, address, tls)
    except RuntimeError as exc:
        port, reason = 0, _reason(exc)
    else:
        reason = ""
    if not port:
        raise StartupError("grpc_listen", f"cannot listen on {address}: the port is in use or the "
                                          f"address is not on this machine{f' ({reason})' if reason else ''}")
    return port


def check_grpc_port(address: str) -> None:
    """StartupError when the port of ``address`` (``host:port``) is in use."""
    host, _, port_text = address.rpartition(":")
    if port_text != "0":
        bind_http(host.strip("[]"), int(port_text), setting="grpc_listen").close()


async def prepare(settings) -> tuple[tuple[bytes, bytes] | None, socket.socket, object, object]:
    """(TLS PEMs or None, the bound HTTP socket, the migrated engine, the started bus) for
    ``settings``; StartupError (with nothing left open) when one of them cannot be had."""
    tls = read_tls(settings.tls_certfile, settings.tls_keyfile)
    check_grpc_port(settings.grpc_listen)
    sock = bind_http(settings.http_host, settings.http_port)
    try:
        bus = await start_bus(settings.redis_url)  # a ping, before migrations log their progress
        try:
            engine = await asyncio.to_thread(open_store, settings.database_url)
        except BaseException:
            await _close_quietly(bus)
            raise
    except BaseException:
        sock.close()
        raise
    return tls, sock, engine, bus


def bind_http(host: str, port: int, setting: str = "http_port") -> socket.socket:
    """A listening socket for the REST API and dashboard (handed to uvicorn)."""
    try:
        family, kind, proto, _name, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StartupError(setting.replace("_port", "_host"), f"cannot resolve {host!r}: {_reason(exc)}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise StartupError(setting, f"cannot listen on {host}:{port}: {exc.strerror or _reason(exc)}") from exc
    sock.set_inheritable(True)
    return sock
