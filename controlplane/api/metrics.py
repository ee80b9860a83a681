"""``GET /metrics``: Prometheus text format — control-plane health and cluster summaries.

Series: ingest counters and connected agents, retention job state, per-device utilization and
memory, per-job latest step, host-bound ratio (mean/max over ranks of the newest step) and
balancedness under the running placement. Never per-expert series: their cardinality
(layers x experts per job) would swamp a Prometheus server; per-expert history is in the
REST history API. Read at scrape time from the store (a private registry per app).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from moeplane.controlplane.api.rl_metrics import RLCollector
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.placements import PlacementSource

router = APIRouter(tags=["metrics"])


class ClusterCollector:
    """Collects from ``app.state`` (engine, ingest, batcher, retention) at scrape time."""

    def __init__(self, state):
        self.state = state

    def collect(self):
        started = time.perf_counter()
        st = self.state
        ingest, batcher, retention = (getattr(st, k, None) for k in ("ingest", "batcher", "retention"))
        yield _gauge("moeplane_agents_connected", "node agents with an open ingest stream",
                     len(ingest.connected) if ingest else 0)
        c = CounterMetricFamily("moeplane_ingest_records", "agent records committed to the store")
        c.add_metric([], batcher.committed if batcher else 0)
        yield c
        c = CounterMetricFamily("moeplane_ingest_duplicates", "agent records acknowledged as resends")
        c.add_metric([], batcher.duplicates if batcher else 0)
        yield c
        c = CounterMetricFamily("moeplane_retention_runs", "retention/downsampling passes completed")
        c.add_metric([], retention.runs if retention else 0)
        yield c
        yield _gauge("moeplane_retention_last_run_timestamp_seconds", "unix time of the last retention pass",
                     (retention.last_run_at or 0.0) if retention else 0.0)
        yield _gauge("moeplane_retention_failing", "1 when the last retention pass failed",
                     1.0 if retention and retention.last_error else 0.0)
        yield from self._devices(st.engine)
        yield from self._jobs(st.engine, st.placements)  # a scrape reuses the blobs it holds
        yield _gauge("moeplane_scrape_collect_seconds", "time spent collecting this scrape",
                     time.perf_counter() - started)

    def _devices(self, engine):
        labels = ["job_id", "node_id", "device_id"]
        util = GaugeMetricFamily("moeplane_device_utilization_ratio", "device utilization, newest sample", labels=labels)
        used = GaugeMetricFamily("moeplane_device_memory_used_bytes", "device memory in use, newest sample",
                                 labels=labels)
        total = GaugeMetricFamily("moeplane_device_memory_total_bytes", "device memory capacity", labels=labels)
        jobs = {n["node_id"]: n["job_id"] or "" for n in q.list_nodes(engine)}
        capacity = {d["device_id"]: d["memory_total_bytes"] for d in q.list_devices(engine)}
        for dev, v in sorted(q.latest_device_values(engine).items()):
            lab = [jobs.get(v["node_id"], ""), v["node_id"], dev]
            m = v["metrics"]
            if "utilization_ratio" in m:
                util.add_metric(lab, m["utilization_ratio"])
            if "memory_used_bytes" in m:
                used.add_metric(lab, m["memory_used_bytes"])
            cap = m.get("memory_total_bytes") or capacity.get(dev)
            if cap:
                total.add_metric(lab, cap)
        yield from (util, used, total)

    def _jobs(self, engine, placements: PlacementSource):
        from moeplane.controlplane.balancing import balancedness

        step = GaugeMetricFamily("moeplane_job_latest_step", "newest step with expert loads", labels=["job_id"])
        hb_mean = GaugeMetricFamily("moeplane_job_host_bound_ratio", "mean host-bound ratio over ranks, newest step",
                                    labels=["job_id"])
        hb_max = GaugeMetricFamily("moeplane_job_host_bound_ratio_max", "max host-bound ratio over ranks, newest step",
                                   labels=["job_id"])
        bal = GaugeMetricFamily("moeplane_job_balancedness",
                                "mean over layers of max/mean rank load, newest step, running placement (1 = perfect)",
                                labels=["job_id"])
        s = t.step_stats.c
        for job in q.list_jobs(engine):
            jid = job["job_id"]
            with engine.connect() as conn:
                newest = conn.execute(sa.select(sa.func.max(s.step)).where(s.job_id == jid)).scalar()
                if newest is not None:
                    mean, mx = conn.execute(
                        sa.select(sa.func.avg(s.host_bound_ratio), sa.func.max(s.host_bound_ratio))
                        .where(s.job_id == jid, s.step == newest)).one()
                    hb_mean.add_metric([jid], float(mean))
                    hb_max.add_metric([jid], float(mx))
            latest = q.latest_loads(engine, jid)
            if latest is None:
                continue
            step.add_metric([jid], latest["step"])
            running = placements.running(job)
            if running is not None and running.phy2log.shape[0] == latest["counts"].shape[0]:
                value = balancedness(latest["counts"].astype(np.float64), running.phy2log,
                                     running.geometry.ranks)
                if np.isfinite(value):
                    bal.add_metric([jid], value)
        yield from (step, hb_mean, hb_max, bal)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def registry_for(state) -> CollectorRegistry:
    reg = getattr(state, "metrics_registry", None)
    if reg is None:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(ClusterCollector(state))
        reg.register(RLCollector(state))
        state.metrics_registry = reg
    return reg


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format 0.0.4"}})
async def metrics(request: Request) -> Response:
    """Prometheus scrape endpoint (viewer role when access control is on)."""
    body = await asyncio.to_thread(generate_latest, registry_for(request.app.state))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
