"""/metrics: cluster summaries without per-expert series, clean under ``promtool check
metrics``, and scraped by a real Prometheus server whose query API then returns them."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from moeplane.controlplane.procs import free_port
from tests.conftest import unavailable
from tests.procs import spawn, wait_until


def _tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if shutil.which(f"/usr/bin/{name}") else None)
    if path is None:
        unavailable(name, "not installed (Debian package prometheus)")
    return path


def _scrape(live) -> str:
    r = httpx.get(f"{live['base']}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


def test_metrics_summaries_and_no_per_expert_series(live):
    text = _scrape(live)
    for name in ("moeplane_agents_connected", "moeplane_ingest_records_total", "moeplane_retention_runs_total",
                 'moeplane_device_memory_total_bytes{device_id="n0/gpu0"', 'moeplane_job_latest_step{job_id="j"}',
                 'moeplane_job_host_bound_ratio{job_id="j"}', 'moeplane_job_balancedness{job_id="j"}'):
        assert name.split("{")[0] in text and (("{" not in name) or _has_labels(text, name)), name
    # no per-expert series: labels only name jobs, nodes and devices; series scale with devices
    samples = [smp for fam in text_string_to_metric_families(text) for smp in fam.samples]
    assert {k for smp in samples for k in smp.labels} == {"job_id", "node_id", "device_id"}
    assert len(samples) < 40 and not any("expert" in smp.name for smp in samples)
    bal = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("moeplane_job_balancedness{"))
    assert bal >= 1.0


def _has_labels(text: str, prefix: str) -> bool:
    name, _, first = prefix.partition("{")
    return any(line.startswith(name + "{") and first.rstrip("}") in line for line in text.splitlines())


def test_promtool_check_metrics(live):
    promtool = _tool("promtool")
    r = subprocess.run([promtool, "check", "metrics"], input=_scrape(live), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_real_prometheus_scrapes_and_answers(live, tmp_path):
    prometheus = _tool("prometheus")
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: moeplane\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{live['http_port']}']\n"
    )
    proc = spawn("prometheus", [f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"], tmp_path, cmd=[prometheus])
    try:
        api = f"http://127.0.0.1:{port}/api/v1/query"

        def series():
            proc.check_running()
            r = httpx.get(api, params={"query": 'moeplane_device_memory_total_bytes{device_id="n0/gpu1"}'},
                          timeout=5)
            return r.status_code == 200 and r.json()["data"]["result"]

        result = wait_until(series, 60, "prometheus to scrape the control plane", interval=0.25)
        assert float(result[0]["value"][1]) == 80 << 30
        assert result[0]["metric"]["job_id"] == "j" and result[0]["metric"]["job"] == "moeplane"
        up = httpx.get(api, params={"query": "up"}, timeout=5).json()["data"]["result"]
        assert up[0]["value"][1] == "1"
    finally:
        proc.stop()
