"""TLS for HTTP and gRPC by flag (a self-signed certificate made with openssl), and the
``moeplane token`` command in a real process, its secret working against ``serve --auth``."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import grpc
import httpx
import pytest

from tests import aio
from tests.auth.streams import first_reply
from tests.conftest import unavailable
from tests.controlplane.serverthread import running_server
from tests.procs import MOEPLANE, start_serve


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        unavailable("openssl", "not on PATH")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
         "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


def test_tls_on_http_and_grpc(tmp_path, cert):
    certfile, keyfile = cert
    with running_server(f"sqlite:///{tmp_path / 'm.sqlite'}", tls_certfile=str(certfile),
                        tls_keyfile=str(keyfile)) as srv:
        port = srv["http_port"]
        r = httpx.get(f"https://localhost:{port}/api/v1/health", verify=ssl.create_default_context(cafile=str(certfile)), timeout=10)
        assert r.status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5)
        kind, msg = aio.run(first_reply(srv["grpc_port"], "node-0", root_cert=certfile.read_bytes()))
        assert kind == "ok" and msg.WhichOneof("body") == "config"
        assert aio.run(first_reply(srv["grpc_port"], "node-0", timeout=5))[0] == "error"  # plaintext refused


def _moeplane(*args) -> subprocess.CompletedProcess:
    return subprocess.run(MOEPLANE + list(args), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_token_cli_against_serve_auth(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite'}"
    made = _moeplane("token", "create", "--role", "viewer", "--name", "ci", "--database-url", url)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("mp_") and "shown only now" in made.stderr
    node = _moeplane("token", "create", "--node", "node-7", "--database-url", url)
    node_secret = node.stdout.strip()
    listed = _moeplane("token", "list", "--database-url", url)
    assert "viewer" in listed.stdout and "node-7" in listed.stdout and secret not in listed.stdout
    proc = start_serve(tmp_path, url, extra=["--auth", "--no-dashboard"])
    try:
        assert "auth=on" in proc.output()
        base = proc.http
        h = {"Authorization": f"Bearer {secret}"}
        assert httpx.get(f"{base}/api/v1/jobs", headers=h, timeout=10).status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs", timeout=10).status_code == 401
        port = proc.grpc_port
        assert aio.run(first_reply(port, "node-7", node_secret))[0] == "ok"
        assert aio.run(first_reply(port, "node-8", node_secret)) == ("error", grpc.StatusCode.PERMISSION_DENIED)
        tid = listed.stdout.split()[0]
        assert _moeplane("token", "revoke", tid, "--database-url", url).returncode == 0
        assert httpx.get(f"{base}/api/v1/jobs", headers=h, timeout=10).status_code == 401
        assert _moeplane("token", "revoke", "999", "--database-url", url).returncode == 1
    finally:
        proc.stop()


def test_serve_open_on_public_address_exits_with_a_clear_error(tmp_path):
    r = _moeplane("serve", "--database-url", f"sqlite:///{tmp_path / 'm.sqlite'}", "--http-host", "0.0.0.0",
                  "--no-dashboard")
    assert r.returncode == 2
    assert "refusing to run without access control" in r.stderr
