"""Serving policy: when the control plane may run open, and TLS for HTTP and gRPC.

Open (no tokens) is allowed only when both listen addresses are loopback; anything reachable
from other machines must run with ``--auth``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc

OPEN_BANNER = (
    "WARNING: moeplane is running OPEN (no access control: anyone who can reach it may read and "
    "act). Allowed on loopback only; use --auth (MOEPLANE_AUTH=true) and tokens for anything else."
)


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_host(address: str) -> str:
    """Host part of ``host:port`` / ``[v6]:port``."""
    return address.rsplit(":", 1)[0] if ":" in address else address


def open_mode_problem(auth: bool, http_host: str, grpc_listen: str) -> str | None:
    """Why running open is refused (None when it is fine or auth is on)."""
    if auth:
        return None
    exposed = [f"{name} {addr}" for name, addr, host in (
        ("http", http_host, http_host), ("grpc", grpc_listen, listen_host(grpc_listen)))
        if not is_loopback(host)]
    if not exposed:
        return None
    return ("refusing to run without access control on a non-loopback address ("
            + ", ".join(exposed) + "): pass --auth (or MOEPLANE_AUTH=true) and create tokens with "
            "'moeplane token create', or listen on 127.0.0.1")


def tls_files(certfile: str, keyfile: str) -> tuple[bytes, bytes] | None:
    """(cert PEM, key PEM) when TLS is configured; ValueError when only one file is given."""
    if not certfile and not keyfile:
        return None
    if not certfile or not keyfile:
        raise ValueError("tls_certfile, tls_keyfile: give both or neither")
    return Path(certfile).read_bytes(), Path(keyfile).read_bytes()


def add_grpc_port(server, address: str, tls: tuple[bytes, bytes] | None) -> int:
    if tls is None:
        return server.add_insecure_port(address)
    cert, key = tls
    return server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
