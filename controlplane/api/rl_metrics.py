"""RL series for ``GET /metrics``, per job (never per device): the black-hole fraction, tail
ratio, sync share, idle seconds by cause and the bottleneck over the last ``WINDOW`` complete
steps, and the alert condition (the fraction above ``ALERT_THRESHOLD`` for ``ALERT_STEPS``
steps in a row).

The analysis runs once per job and newest step, not per scrape: a scrape reuses the result
while no new step has arrived (the newest step is left out: it may still be arriving).
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily

from moeplane.controlplane.rl import idle
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store import rl_tables as rt

WINDOW = 20
ALERT_THRESHOLD = float(os.environ.get("MOEPLANE_RL_BLACK_HOLE_ALERT", "0.3"))
ALERT_STEPS = int(os.environ.get("MOEPLANE_RL_BLACK_HOLE_ALERT_STEPS", "5"))


class RLCollector:
    """Collects RL series from ``state.engine``; caches each job's analysis by newest step."""

    def __init__(self, state):
        self.state = state
        self._cache: dict[str, tuple[int, dict, bool]] = {}

    def _job(self, engine, job_id: str, newest: int) -> tuple[dict, bool] | None:
        cached = self._cache.get(job_id)
        if cached is None or cached[0] != newest:
            spans = store_rl.read_spans(engine, job_id, max(0, newest - WINDOW), newest)
            report = idle.analyze(spans)
            if report.steps.size == 0:
                return None
            alert = idle.black_hole_alert(idle.step_black_hole_fractions(report), ALERT_THRESHOLD, ALERT_STEPS)
            cached = self._cache[job_id] = (newest, report.summary(), alert)
        return cached[1], cached[2]

    def collect(self):
        engine = self.state.engine
        lab = ["job_id"]
        fam = {
            "bh": GaugeMetricFamily("moeplane_rl_black_hole_fraction",
                                    f"idle device-seconds / device-seconds, last {WINDOW} complete steps", labels=lab),
            "tail": GaugeMetricFamily("moeplane_rl_generation_tail_ratio",
                                      "max / median generation time over devices, mean over steps", labels=lab),
            "sync": GaugeMetricFamily("moeplane_rl_sync_share", "weight-sync device-seconds / device-seconds",
                                      labels=lab),
            "idle": GaugeMetricFamily("moeplane_rl_idle_seconds", f"idle device-seconds by cause, last {WINDOW} steps",
                                      labels=["job_id", "cause"]),
            "neck": GaugeMetricFamily("moeplane_rl_bottleneck", "1 for the job's bottleneck class",
                                      labels=["job_id", "bottleneck"]),
            "alert": GaugeMetricFamily(
                "moeplane_rl_black_hole_alert",
                f"1 when the black-hole fraction is above {ALERT_THRESHOLD} for {ALERT_STEPS} steps in a row",
                labels=lab),
        }
        c = rt.rl_spans.c
        with engine.connect() as conn:
            newest = conn.execute(sa.select(c.job_id, sa.func.max(c.step)).group_by(c.job_id)).all()
        for job_id, step in newest:
            got = self._job(engine, job_id, int(step))
            if got is None:
                continue
            summary, alert = got
            fam["bh"].add_metric([job_id], summary["black_hole_fraction"])
            if summary["tail_ratio"] is not None:
                fam["tail"].add_metric([job_id], summary["tail_ratio"])
            fam["sync"].add_metric([job_id], summary["sync_share"])
            for cause, seconds in summary["idle_by_cause_s"].items():
                fam["idle"].add_metric([job_id, cause], seconds)
            if summary["bottleneck"]:
                fam["neck"].add_metric([job_id, summary["bottleneck"]], 1.0)
            fam["alert"].add_metric([job_id], 1.0 if alert else 0.0)
        yield from fam.values()
