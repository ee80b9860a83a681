"""Start-up failures on the operator's settings exit 2 with one line naming the setting and
what is wrong, never a traceback (issue 33, items 5 and 11): real ``moeplane serve``
processes against an unreachable PostgreSQL and Redis, unusable SQLite paths, and busy ports
(a running server's gRPC port cannot be shared)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from moeplane.controlplane.procs import free_port
from tests.controlplane.serverthread import running_server


def serve(tmp_path, *args: str) -> tuple[int, list[str]]:
    """Run ``moeplane serve`` (expected to fail at start); (exit status, output lines)."""
    cmd = [sys.executable, "-m", "moeplane.controlplane.cli.main", "serve", "--no-dashboard",
           "--database-url", f"sqlite:///{tmp_path / 'ok.sqlite'}", "--grpc-listen", "127.0.0.1:0",
           "--http-port", "0", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return done.returncode, (done.stdout + done.stderr).splitlines()


def one_line(tmp_path, *args: str) -> str:
    code, lines = serve(tmp_path, *args)
    assert code == 2 and len(lines) == 1, (code, lines[-20:])
    assert lines[0].startswith("moeplane serve: ") and "Traceback" not in lines[0]
    return lines[0]


def test_unreachable_postgres(tmp_path):
    line = one_line(tmp_path, "--database-url", f"postgresql://postgres:secret@127.0.0.1:{free_port()}/none")
    assert "database_url" in line and "refused" in line and "secret" not in line


def test_unreachable_redis(tmp_path):
    line = one_line(tmp_path, "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert "redis_url" in line


def test_a_directory_as_the_sqlite_file(tmp_path):
    line = one_line(tmp_path, "--database-url", f"sqlite:///{tmp_path}")
    assert "database_url" in line and "unable to open" in line


def test_a_corrupt_sqlite_file(tmp_path):
    (tmp_path / "bad.sqlite").write_bytes(b"\x13not a database\x00" * 400)
    line = one_line(tmp_path, "--database-url", f"sqlite:///{tmp_path / 'bad.sqlite'}")
    assert "database_url" in line and "not a database" in line


def test_a_grpc_address_without_a_port(tmp_path):
    line = one_line(tmp_path, "--grpc-listen", "127.0.0.1")
    assert "grpc_listen" in line and "host:port" in line


def test_a_busy_http_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        line = one_line(tmp_path, "--http-port", str(taken.getsockname()[1]))
    assert "http_port" in line and "in use" in line


@pytest.mark.parametrize("auth", [False, True], ids=["open-beside-open", "open-beside-auth"])
def test_a_running_servers_grpc_port_is_not_shared(tmp_path, auth):
    with running_server(f"sqlite:///{tmp_path / 'first.sqlite'}", auth=auth) as first:
        line = one_line(tmp_path, "--grpc-listen", f"127.0.0.1:{first['grpc_port']}")
    assert "grpc_listen" in line and "in use" in line
