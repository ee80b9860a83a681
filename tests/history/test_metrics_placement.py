"""/metrics reads the running placement through the process's placement source: once a plan's
placement is held, a scrape reads no placement blob."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from sqlalchemy import event

from harness.simjob import SimJob
from moeplane.controlplane.api.metrics import ClusterCollector
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.controlplane.store.writes import StoreWriter


@pytest.fixture
def sim(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    job = SimJob(StoreWriter(engine), nodes=2, devices_per_node=4, layers=3, experts=12)
    job.hello(time.time())
    yield engine, job
    engine.dispose()


def blob_reads(engine) -> list[str]:
    reads: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("SELECT") and "phy2log" in statement:
            reads.append(statement)

    return reads


def balancedness_sample(collector) -> float:
    fam = next(f for f in collector.collect() if f.name == "moeplane_job_balancedness")
    return fam.samples[0].value


def test_a_scrape_reads_no_placement_blob_once_the_plan_is_held(sim):
    engine, job = sim
    for step in range(3):
        job.step(step, time.time())
    epoch = job.plan((job.identity() + 1) % job.experts)
    job.apply(epoch, step=2)
    job.step(3, time.time())
    source = PlacementSource(engine)
    collector = ClusterCollector(SimpleNamespace(engine=engine, placements=source))
    reads = blob_reads(engine)
    first = balancedness_sample(collector)  # this replica has not seen the plan yet: one read
    assert len(reads) == 1
    for _ in range(3):
        assert balancedness_sample(collector) == first
    assert len(reads) == 1  # later scrapes read none
    assert first >= 1.0
