"""The simulator's memory and trouble: profiles that follow the model's size and micro-batch,
offload decisions from the real engine that lower the peak by what they predicted, and the
spells of memory pressure and host-bound steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from moeplane.agents.sim.job import JobOptions, SimulatedJob
from moeplane.agents.sim.memory import MAX_FILL, MemorySpec, RankMemory
from moeplane.agents.sim.workload import Spells, spread_ranks
from moeplane.controlplane.memory import NodeMemory, Verdict, WatermarkPolicy, decide_offload
from moeplane.controlplane.memory.codec import device_memory, profile_record
from moeplane.controlplane.wire import moeplane_pb2 as pb

SPEC = MemorySpec()
L, S, K = 12, 2, 4  # the demo's job: 12 layers, 48 experts on 32 ranks (2 slots), top-4
HOST = NodeMemory("node-0", 1 << 40)


def rank(spec: MemorySpec = SPEC, seed: int = 0) -> RankMemory:
    return RankMemory(spec, layers=L, slots=S, top_k=K, rng=np.random.default_rng(seed))


def decide(profile: pb.MemoryProfile):
    """The control plane's decision on a profile (default watermarks 90 % and 70 %), through
    its own codec and engine."""
    record = profile_record(profile, "memory", job_id="j", node_id="node-0", step=1, ts=1.0)
    return decide_offload([device_memory(record.__dict__)], [HOST], WatermarkPolicy())[0]


def as_message(decision, decision_id: int) -> pb.OffloadDecision:
    return pb.OffloadDecision(
        job_id="j", decision_id=decision_id, device_id="node-0/gpu0",
        verdict=decision.verdict.value, predicted_peak_bytes=decision.peak_after_bytes,
        actions=[pb.OffloadAction(kind=a.kind.value, layers=a.layers) for a in decision.actions])


def test_profile_follows_the_model_size_and_micro_batch():
    small, big = rank(), rank(replace(SPEC, micro_batch=2, noise_bytes=0))
    m1, _ = small.step()
    p = small.profile(m1, "node-0/gpu0", 0)
    assert len(p.layers) == L and p.capacity_bytes == 80 << 30 and p.micro_batch_size == 1
    # 5120 wide, 2 expert slots of 2560: 4h^2 + 2*3*h*f + 64h parameters per layer
    params = 4 * 5120**2 + 2 * 3 * 5120 * 2560 + 5120 * 64
    assert p.parameters_bytes == L * 2 * params and p.gradients_bytes == L * 2 * params
    assert p.optimizer_bytes == L * 12 * params
    assert 0.70 < p.used_bytes / p.capacity_bytes < 0.80  # between the default watermarks
    m2, _ = big.step()
    q = big.profile(m2, "node-0/gpu0", 0)
    assert q.parameters_bytes == p.parameters_bytes
    assert [y.activation_bytes for y in q.layers] == [2 * x.activation_bytes for x in p.layers]
    assert q.activations_peak_bytes == 2 * sum(x.activation_bytes for x in p.layers)


def test_pressure_leads_to_a_decision_that_lowers_the_peak_by_what_it_predicted_then_relaxes():
    mem = rank()
    mem.step()
    pressed, _ = mem.step(seq_factor=1.7)  # a longer-sequence phase
    over = mem.profile(pressed, "node-0/gpu0", 0)
    assert over.used_bytes > 0.9 * over.capacity_bytes
    apply = decide(over)
    assert apply.verdict is Verdict.APPLY and apply.actions
    assert mem.submit(as_message(apply, 7)) and not mem.submit(as_message(apply, 7))

    after, report = mem.step(seq_factor=1.7)  # the decision takes effect at the next step
    assert report.state == pb.PLAN_STATE_APPLIED and report.decision_id == 7
    assert report.measured_used_bytes == after.used_bytes
    assert abs(after.used_bytes - apply.peak_after_bytes) < 4 * SPEC.noise_bytes  # predicted
    assert report.measured_saved_bytes == pressed.used_bytes - after.used_bytes > 0
    applied = mem.profile(after, "node-0/gpu0", 0).applied_actions
    assert sorted(applied) == sorted(f"{a.kind.value}:{x}" for a in apply.actions for x in a.layers)

    calm, _ = mem.step()  # the phase is over: far under the low watermark with the actions
    relax = decide(mem.profile(calm, "node-0/gpu0", 0))
    assert relax.verdict is Verdict.RELAX and relax.actions == ()
    mem.submit(as_message(relax, 8))
    back, report = mem.step()
    assert report.state == pb.PLAN_STATE_APPLIED and mem.applied == ()
    assert decide(mem.profile(back, "node-0/gpu0", 0)).verdict is Verdict.KEEP


def test_a_decision_naming_an_unknown_layer_fails_and_changes_nothing():
    mem = rank()
    mem.step()
    bad = pb.OffloadDecision(job_id="j", decision_id=3, device_id="node-0/gpu0", verdict="apply",
                             actions=[pb.OffloadAction(kind="recompute", layers=["layer99"])])
    mem.submit(bad)
    _, report = mem.step()
    assert report.state == pb.PLAN_STATE_FAILED and "layer99" in report.error
    assert mem.applied == ()


def test_a_phase_never_takes_a_rank_past_what_fits():
    mem = rank()
    measured, _ = mem.step(seq_factor=5.0)
    assert measured.used_bytes <= MAX_FILL * SPEC.capacity_bytes + 4 * SPEC.noise_bytes


def test_spells_and_the_ranks_they_press():
    s = Spells(every=90, length=30, first=15)
    assert [s.index(x) for x in (0, 14, 15, 44, 45, 104, 105, 134, 135)] == [
        None, None, 0, 0, None, None, 1, 1, None]
    assert Spells(every=0, length=0).index(50) is None
    with pytest.raises(ValueError):
        Spells(every=10, length=11)
    ranks = spread_ranks(seed=0, spell=0, count=3, nodes=4, per_node=8)
    assert len({r // 8 for r in ranks}) == 3  # on three different nodes
    assert ranks == spread_ranks(seed=0, spell=0, count=3, nodes=4, per_node=8)
    assert spread_ranks(seed=0, spell=0, count=9, nodes=2, per_node=2) == [0, 1, 2, 3]


def job(**kw) -> SimulatedJob:
    o = JobOptions(job_id="j", nodes=4, gpus_per_node=8, layers=L, experts=48, top_k=K,
                   tokens_per_step=256, **kw)
    return SimulatedJob(o)


class Link:
    """What a RankLink is to the job: a rank and a ``send`` (here into a list)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.sent: list[pb.RankMessage] = []

    def send(self, msg: pb.RankMessage) -> None:
        self.sent.append(msg)


def attach(sim: SimulatedJob) -> list[Link]:
    sim.links = [Link(r) for r in range(sim.o.world_size)]
    return sim.links


def run_step(sim: SimulatedJob, links: list[Link]) -> tuple[float, list[pb.RankStep]]:
    t, report = sim.run_step()
    report()
    return t, [next(m.step for m in reversed(x.sent) if m.WhichOneof("body") == "step")
               for x in links]


def test_host_bound_spell_slows_one_node_and_the_job():
    sim = job(pressure=Spells(0, 0), host_spells=Spells(every=20, length=5, first=3))
    links = attach(sim)
    rows = []
    for _ in range(25):
        t, steps = run_step(sim, links)
        rows.append((t, np.array([s.stats.host_bound_ratio for s in steps])))
        assert {s.stats.step_time_s for s in steps} == {t}
    calm = [h for i, (_t, h) in enumerate(rows) if i < 3 or 8 <= i < 23]
    assert max(h.max() for h in calm) < 0.05 and np.mean(calm) < 0.02  # Pangu's bar: < 2 %
    for i, slow in ((3, 0), (7, 0), (23, 1)):  # spell 0 slows node-0, spell 1 node-1
        t, h = rows[i]
        on_node = np.zeros(32, bool)
        on_node[slow * 8:(slow + 1) * 8] = True
        assert (h[on_node] >= 0.3).all() and h[~on_node].max() < 0.05
        assert t > 1.4 * np.median([r[0] for r in rows[8:23]])


def test_offload_decisions_reach_the_simulated_ranks_and_their_reports_go_out():
    sim = job(host_spells=Spells(0, 0), pressure=Spells(every=50, length=10, first=1),
              pressure_ranks=2)
    links = attach(sim)
    run_step(sim, links)
    _t, steps = run_step(sim, links)  # step 1: the phase starts
    high = 0.9 * SPEC.capacity_bytes
    pressed = [r for r, s in enumerate(steps) if s.memory.used_bytes > high]
    assert pressed == spread_ranks(0, 0, 2, 4, 8)
    r = pressed[0]
    assert steps[r].memory.device_id == "node-{}/gpu{}".format(*divmod(r, 8))
    decision = decide(steps[r].memory)
    sim._on_offload(r, as_message(decision, 11))
    _t, steps = run_step(sim, links)
    assert [m.WhichOneof("body") for m in links[r].sent[-2:]] == ["step", "offload_report"]
    report = links[r].sent[-1].offload_report
    assert report.state == pb.PLAN_STATE_APPLIED and report.step == 2  # at the next step
    assert report.measured_used_bytes == steps[r].memory.used_bytes
    assert steps[r].memory.used_bytes <= high + 4 * SPEC.noise_bytes
    assert steps[r].memory.applied_actions


def test_a_model_that_does_not_fit_sends_no_memory_profiles():
    sim = job(memory=replace(SPEC, hidden=16384))
    assert sim.memory == []
    _t, steps = run_step(sim, attach(sim))
    assert not any(s.HasField("memory") for s in steps)
