"""attach() on MoE families it does not list, found by structure; counts reach the agent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from moeplane.agents.sdk.reporter import Reporter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array
from moeplane.torch import WatchError, attach
from tests.adapters.hf_models import batch, build
from tests.sdk.test_reporter import serve

pytestmark = pytest.mark.torch
E, K, H = 6, 2, 8


class Router(nn.Module):
    """Returns (scores [T, k], expert ids [T, k]) like torchtitan's token-choice router."""

    def __init__(self):
        super().__init__()
        self.top_k, self.num_experts = K, E
        self.proj = nn.Linear(H, E, bias=False)

    def forward(self, x):
        scores, ids = torch.topk(self.proj(x).softmax(-1), self.top_k, dim=-1)
        return scores, ids


class OwnExperts(nn.Module):
    """An experts module of a family transformers does not ship, called with top_k_index."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(E, H, H) * 0.1)

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for slot in range(top_k_index.shape[1]):
            w = self.w[top_k_index[:, slot]]  # [T, H, H]
            out = out + top_k_weights[:, slot, None] * torch.einsum("th,tho->to", hidden, w)
        return out


class Block(nn.Module):
    def __init__(self, with_experts: bool):
        super().__init__()
        self.router = Router()
        self.experts = OwnExperts() if with_experts else None
        self.chosen: list[torch.Tensor] = []

    def forward(self, x):
        scores, ids = self.router(x)
        self.chosen.append(ids)
        if self.experts is None:
            return x + scores.sum(-1, keepdim=True)
        return x + self.experts(x, ids, scores)


@pytest.mark.parametrize("with_experts", [True, False], ids=["experts-module", "router-only"])
def test_unlisted_families_are_found_by_structure_and_counted_exactly(with_experts):
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(with_experts) for _ in range(3)])
    watch = attach(model)
    assert watch.layers == ["0", "1", "2"]
    for tokens in (5, 9):
        model(torch.randn(tokens, H))
    want = torch.stack([torch.bincount(torch.cat(b.chosen).flatten(), minlength=E)
                        for b in model])
    assert torch.equal(watch.take(), want)
    assert int(want.sum()) == 3 * 14 * K


def test_attach_with_a_reporter_sends_each_steps_counts_to_the_node_agent(tmp_path):
    socket_path = str(tmp_path / "agent.sock")
    server, agent = serve(socket_path)
    model = build("qwen3_moe", layers=2, experts=4, top_k=2)
    job = pb.JobSpec(job_id="hf", layers=2, experts=4, top_k=2, world_size=1, slots_per_rank=4)
    reporter = Reporter(None, rank=0, job=job, socket_path=socket_path, model=model).start()
    watch = attach(model, reporter=reporter)
    expected = []
    try:
        for step in range(2):
            ids = batch(seed=step)
            with torch.no_grad():
                out = model(ids, output_router_logits=True)
            expected.append(np.stack([np.bincount(torch.topk(lg, 2).indices.flatten().numpy(),
                                                  minlength=4) for lg in out.router_logits]))
            reporter.end_step(step, tokens=ids.numel())
        agent.wait(lambda a: len(a.of("step")) == 2)
    finally:
        reporter.close()
        server.stop(None)
    steps = agent.of("step")
    for step, want in zip(steps, expected, strict=True):
        np.testing.assert_array_equal(decode_array(step.counts, "counts"), want)
        assert step.stats.tokens == 24 and step.stats.step_time_s > 0
    assert reporter.memory["parameters"] > 0
    assert int(watch.counter.sum()) == 0  # the reporter snapshots and zeroes it


def test_a_reporter_whose_job_disagrees_with_the_model_is_refused():
    model = build("mixtral", layers=2, experts=4)
    job = pb.JobSpec(job_id="hf", layers=3, experts=4, top_k=2, world_size=1, slots_per_rank=4)
    with pytest.raises(ValueError, match=r"counter: shape \(2, 4\) != job \[3, 4\]"):
        attach(model, reporter=Reporter(None, rank=0, job=job))


def test_negative_expert_ids_are_refused_naming_the_router():
    torch.manual_seed(0)
    model = nn.Sequential(Block(with_experts=False), Block(with_experts=False))
    watch = attach(model)
    router = model[1].router
    (hook,) = router._forward_hooks.values()
    hook(router, (), {}, (torch.zeros(3, K), torch.tensor([[0, 1], [-1, 2], [3, 4]])))
    with pytest.raises(WatchError, match=r"outside \[0, 6\) in 1\.router \(1 ids\)"):
        watch.take()


def test_folds_of_repeated_forwards_skipped_layers_and_many_steps_count_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(with_experts=False) for _ in range(3)])
    watch = attach(model)

    def want():
        counts = torch.stack([torch.bincount(torch.cat(b.chosen).flatten(), minlength=E)
                              for b in model])
        for b in model:
            b.chosen.clear()
        return counts

    for _ in range(3):  # one shape: three runs of the 3 layers, stacked into one fold
        model(torch.randn(4, H))
    assert torch.equal(watch.take(), want())
    model(torch.randn(4, H))
    model[1](torch.randn(6, H))  # layer 1 alone: the pending tensors are no longer runs
    assert torch.equal(watch.take(), want())
    model(torch.randn(0, H))  # an empty micro-batch: as a run, then alone
    assert int(watch.take().sum()) == 0
    model[2](torch.randn(0, H))
    assert int(watch.take().sum()) == 0
    for _ in range(200):  # 600 pending tensors: folds start in the hooks (FOLD_EVERY)
        model(torch.randn(2, H))
    got = watch.take()
    assert torch.equal(got, want()) and int(got.sum()) == 3 * 200 * 2 * K


def test_an_out_of_range_id_in_a_run_names_its_layer_and_drops_the_counts():
    model = nn.Sequential(*[Block(with_experts=False) for _ in range(3)])
    watch = attach(model)
    for i, block in enumerate(model):  # one run: the 3 layers in order, one shape
        (hook,) = block.router._forward_hooks.values()
        ids = torch.tensor([[0, 1], [2, E if i == 1 else 3]])
        hook(block.router, (), {}, (torch.zeros(2, K), ids))
    with pytest.raises(WatchError, match=r"outside \[0, 6\) in 1\.router \(1 ids\)$"):
        watch.take()
    assert int(watch.take().sum()) == 0  # the fold that failed left nothing behind


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_counting_on_cuda_makes_no_host_sync_until_take():
    model = build("qwen3_moe", layers=2, experts=4, top_k=2).cuda()
    ids = batch(seed=3).cuda()
    watch = attach(model)
    with torch.no_grad():
        model(ids)  # warm-up: the first fold caches its row offsets
    watch.flush()
    watch.take()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        watch.flush()  # nothing pending: the overflow check copies without waiting
        hooks_only = [site.module for site in watch.sites]
        for module in hooks_only:  # a hook call alone: a check and an append
            (hook,) = module._forward_pre_hooks.values()
            hook(module, (None, torch.zeros(4, 2, dtype=torch.int64, device="cuda")), {})
        watch.flush()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert watch.take().sum(1).tolist() == [8, 8]
