"""The wheel as a user installs it: built from this tree, installed (not editable) into a fresh
virtualenv, run from a directory that holds folders named like ours (``agents/``,
``migrations/``), as a training repository does."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest

from moeplane.controlplane.procs import free_port, http_ok, spawn, wait_until
from moeplane.dashboard.plotly_bundle import BUNDLE, PLOTLY_JS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd[:3]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)])
    (whl,) = out.glob("moeplane-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (not editable). Its dependencies come from
    this environment's site-packages through a .pth line (a path line only: the editable
    install's finder there is not activated), so the test does not download and build them
    again; moeplane itself comes from the wheel, which the venv's own site-packages puts first."""
    env_dir = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(env_dir)])
    site = run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
               ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(env_dir / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)])
    return env_dir


def test_the_wheel_holds_one_import_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"moeplane", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for data in ("moeplane/controlplane/wire/moeplane.proto", "moeplane/migrations/script.py.mako",
                 "moeplane/dashboard/vendor/plotly-cartesian.min.js", "moeplane/torch.py"):
        assert data in names, data
    assert any(n.startswith("moeplane/migrations/versions/") and n.endswith(".py") for n in names)


def test_installed_wheel_serves_migrates_and_loads_the_dashboard(venv, tmp_path):
    user_repo = tmp_path / "train"  # a user's checkout: its own agents/ and migrations/ folders
    for shadow in ("agents", "migrations", "dashboard", "controlplane"):
        (user_repo / shadow).mkdir(parents=True)
        (user_repo / shadow / "__init__.py").write_text("raise ImportError('the user repo, not moeplane')\n")
    python = str(venv / "bin" / "python")
    bare = run([python, "-c", "import moeplane, sys; print('torch' in sys.modules, 'sqlalchemy' in sys.modules)"],
               cwd=user_repo).stdout.split()
    assert bare == ["False", "False"], "import moeplane must import neither torch nor SQLAlchemy"
    where = run([python, "-c", "import moeplane.agents.sdk, moeplane.migrations; print(moeplane.agents.sdk.__file__)"],
                cwd=user_repo).stdout.split()
    assert where[0].startswith(str(venv)), where
    http = free_port()
    proc = spawn("serve", ["serve", "--database-url", f"sqlite:///{tmp_path / 'm.sqlite'}",
                           "--http-port", str(http), "--grpc-listen", f"127.0.0.1:{free_port()}"],
                 tmp_path, cmd=[str(venv / "bin" / "moeplane")])
    try:
        base = f"http://127.0.0.1:{http}"

        def up() -> bool:
            proc.check_running()
            return http_ok(base + "/api/v1/health")

        wait_until(up, 90, "the installed moeplane serve")
        with urllib.request.urlopen(base + "/api/v1/jobs") as r:  # the migrated schema answers
            assert r.status == 200
        with urllib.request.urlopen(base + "/dashboard/") as r:
            page = r.read().decode()
        scripts = re.findall(r'src="(/dashboard/[^"]+\.js)"', page)
        assert len(scripts) >= 5, page[:500]
        for src in scripts:  # Dash's renderer and components
            with urllib.request.urlopen(base + src) as r:
                assert r.status == 200 and r.read(), src
        # the plotly.js the first graph loads: the vendored cartesian bundle, shipped in the wheel
        with urllib.request.urlopen(f"{base}/dashboard/{PLOTLY_JS}") as r:
            assert r.read() == BUNDLE.read_bytes()
    finally:
        proc.stop()
    db = run([str(venv / "bin" / "moeplane"), "db", "upgrade", "--database-url",
              f"sqlite:///{tmp_path / 'm.sqlite'}"], cwd=user_repo)
    assert db.returncode == 0


@pytest.mark.torch
def test_installed_wheel_imports_moeplane_torch(venv, tmp_path):
    """torch comes from this environment's site-packages (not installed twice); moeplane from
    the wheel."""
    pytest.importorskip("torch")
    out = run([str(venv / "bin" / "python"), "-c",
               "import moeplane, moeplane.torch as t; print(moeplane.__file__); print(t.Reporter.__module__)"],
              cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(venv)) and out[1] == "moeplane.agents.sdk.reporter"
