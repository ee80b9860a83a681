"""Expert parallelism with live rebalancing for an unmodified transformers 5.x MoE model.

One call, in place, after the model is built and loaded and before the optimizer is created::

    from moeplane.torch import expert_parallel
    ep = expert_parallel(model, slots_per_rank=S)          # a collective over the group
    opt = torch.optim.AdamW(model.parameters(), lr=...)
    for batch in data:                                     # each rank its shard of the batch
        loss = model(**batch).loss
        opt.zero_grad(); loss.backward(); ep.sync_gradients(); opt.step()
    ep.apply(new_phy2log, optimizer=opt)                   # collective, same step on every rank

Every MoE layer's experts module becomes a :class:`~moeplane.agents.sdk.hf_ep.slots.HFExpertSlots`
(a module swap; the router, top-k and gating stay the model's own). Rank ``g`` of ``group`` keeps
the weights of slots ``g*S .. (g+1)*S-1`` of ``phy2log[L, G*S]`` and nothing else of the experts.
Dense parameters stay replicated; :meth:`ExpertParallel.sync_gradients` averages them over the
ranks and reduces each logical expert's gradient over its replicas, so that training matches the
unmodified model trained on the global batch (when every rank's shard has as many loss tokens;
a router auxiliary loss, if the config turns one on, is computed per rank as under DDP).

Placement changes go through moeplane's :class:`~moeplane.agents.sdk.applier.PlanApplier`
(weights and optimizer state move with batched point-to-point, one agreed switch step), either
from :meth:`ExpertParallel.apply` or from the control plane after :meth:`ExpertParallel.connect`.
Loads per layer and expert accumulate in :attr:`ExpertParallel.counter` ``[L, E]`` for the
:class:`~moeplane.agents.sdk.reporter.Reporter`.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from moeplane.agents.sdk.adapters import transformers_layout as layout_of
from moeplane.agents.sdk.applier import PlanApplier, PlanRejected
from moeplane.agents.sdk.hf_ep.slots import HFExpertSlots
from moeplane.agents.sdk.moe import attach_counter, sync_gradients
from moeplane.agents.sdk.placement import PlacementError, check_phy2log
from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array


class ExpertParallel:
    """The handle :func:`expert_parallel` returns.

    Attributes:
        model: the model (changed in place).
        blocks: ``[L]`` the :class:`HFExpertSlots` of each MoE layer, in model order.
        paths: ``[L]`` module path of each replaced experts module.
        counter: ``[L, E]`` int64 tokens routed to each logical expert since the last reset.
        applier: the plan applier (validation, agreement, migration).
        steps: calls to :meth:`sync_gradients` so far (the step a placement switch reports).
    """

    def __init__(self, model: nn.Module, blocks: list[HFExpertSlots], paths: list[str], top_k,
                 group=None):
        self.model, self.blocks, self.paths = model, blocks, paths
        self.group = group
        self.top_k = top_k
        self.counter = attach_counter(blocks)
        self.applier = PlanApplier(blocks, None, group=group)
        self.steps = 0
        self._tried_epoch = 0

    @property
    def layers(self) -> int:
        return len(self.blocks)

    @property
    def experts(self) -> int:
        return self.blocks[0].num_experts

    @property
    def world_size(self) -> int:
        return self.blocks[0].world_size

    @property
    def slots_per_rank(self) -> int:
        return self.blocks[0].slots_per_rank

    def phy2log(self) -> np.ndarray:
        """``[L, G*S]`` int64 running placement."""
        return self.applier.phy2log()

    def sync_gradients(self) -> None:
        """After ``loss.backward()`` on every rank: average dense gradients over the ranks,
        sum each logical expert's gradient over its replicas (divided by the world size)."""
        sync_gradients(self.model, self.group)
        self.steps += 1

    def apply(self, phy2log, *, optimizer=None, epoch: int | None = None) -> pb.PlanReport:
        """Switch every layer to ``phy2log[L, G*S]`` now (a collective: every rank, same step).

        Moves each slot's weights and the ``optimizer``'s state of the same shape (AdamW
        ``exp_avg``, ``exp_avg_sq``) with batched point-to-point and local copies, then commits
        on every rank or on none. ``epoch`` defaults to one above any epoch tried so far.

        Raises :class:`PlanRejected` (naming the field) for a bad ``phy2log`` or an epoch not
        newer than the running one, and when any rank failed; the running placement stays.
        With a control plane connected (:meth:`connect`) placement is its job: an epoch used
        here makes its plans of the same or a lower epoch stale.
        """
        if optimizer is not None:
            self.applier.optimizer = optimizer
        if epoch is None:
            epoch = max(self.applier.epoch, self._tried_epoch) + 1
        self._tried_epoch = max(self._tried_epoch, epoch)
        error: PlanRejected | None = None
        try:
            arr = np.asarray(phy2log)
            plan = pb.PlacementPlan(job_id=self.applier.job_id, epoch=epoch,
                                    phy2log=encode_array(arr), slots_per_rank=self.slots_per_rank)
            self.applier.validate(plan)
        except PlanRejected as exc:
            error = exc
        except (TypeError, ValueError) as exc:  # not encodable as an array
            error = PlanRejected("phy2log", str(exc))
            plan = pb.PlacementPlan(job_id=self.applier.job_id, epoch=epoch,
                                    slots_per_rank=-1)  # rejected by submit, on this rank
        self.applier.submit(plan)
        report = self.applier.step_boundary(self.steps - 1)  # collective
        if error is not None:
            raise error
        if report is None or report.state != pb.PLAN_STATE_APPLIED:
            raise PlanRejected("phy2log", report.error if report else "another rank rejected it")
        if report.epoch != epoch:
            raise PlanRejected("epoch", f"the pending plan {report.epoch} (from the control "
                               f"plane) ran instead of epoch {epoch}")
        return report

    def step_boundary(self, step: int) -> pb.PlanReport | None:
        """Call on every rank after each step when plans come from the control plane."""
        return self.applier.step_boundary(step)

    def job_spec(self, job_id: str, ranks_per_node: int | None = None,
                 groups: int = 0) -> pb.JobSpec:
        """The job's shape for the :class:`~moeplane.agents.sdk.reporter.Reporter`;
        ``groups`` = K (e.g. a DeepSeek-V3 config's ``n_group``) keeps each expert group's
        replicas on one node in the job's plans (0: none)."""
        if ranks_per_node is None:
            ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        return pb.JobSpec(job_id=job_id, layers=self.layers, experts=self.experts,
                          top_k=self.top_k, world_size=self.world_size,
                          slots_per_rank=self.slots_per_rank, ranks_per_node=ranks_per_node,
                          groups=groups)

    def connect(self, reporter, optimizer=None) -> None:
        """Take plans from ``reporter`` (built on :attr:`counter`) and report back through it.

        Afterwards call :meth:`step_boundary` on every rank after every step.
        """
        if reporter.counter is not self.counter:
            raise ValueError("reporter: build it on ep.counter (the [L, E] load counter)")
        self.applier.job_id = reporter.job.job_id
        if optimizer is not None:
            self.applier.optimizer = optimizer
        reporter.on_plan = self.applier.submit
        self.applier.on_report = reporter.send_report


def expert_parallel(
    model: nn.Module, slots_per_rank: int, group=None, phy2log=None
) -> ExpertParallel:
    """Put every MoE layer's experts of ``model`` into slots over the ranks of ``group``.

    A collective: every rank of ``group`` (default: the world) calls it on the same model, built
    from the same config with the same weights (seeded or loaded). Checks everything before it
    changes anything.

    Args:
        model: an unmodified transformers 5.x MoE model (Mixtral, Qwen3-MoE, OLMoE,
            DeepSeek-V3, gpt-oss, or any family following their experts convention).
        slots_per_rank: S, with ``G*S >= E``.
        group: expert-parallel process group.
        phy2log: ``[L, G*S]`` initial placement over the L MoE layers (default: slot ``s``
            holds expert ``s % E``).

    Raises:
        ValueError: the model has no MoE layers, an experts module's layout is not recognised
            (the message names its module path), ``G*S < E``, ranks disagree on the config.
        PlacementError: ``phy2log`` has the wrong shape or an unknown expert id.
    """
    layers = layout_of.moe_layers(model)
    if not layers:
        raise ValueError(f"model: {type(model).__name__} has no MoE layers (no experts module "
                         "called with top_k_index)")
    config = getattr(model, "config", None)
    experts = layout_of.num_experts(config) if config is not None else None
    top_k = layout_of.top_k(config) if config is not None else 0
    layouts = [_recognised_layout(layer, experts) for layer in layers]
    experts = layouts[0].num_experts
    world = dist.get_world_size(group)
    if slots_per_rank < 1 or world * slots_per_rank < experts:
        raise ValueError(f"slots_per_rank: {world} ranks x {slots_per_rank} slots < {experts} "
                         "experts")
    if phy2log is None:
        phy2log = identity_placement(len(layers), experts, world * slots_per_rank)
    phy2log = check_phy2log(np.asarray(phy2log), layers=len(layers), experts=experts,
                            world_size=world, slots_per_rank=slots_per_rank)
    _check_ranks_agree(config, layouts, phy2log, group)
    blocks = []
    for i, (layer, layout) in enumerate(zip(layers, layouts, strict=True)):
        block = HFExpertSlots(layer.experts, layout, phy2log[i], slots_per_rank=slots_per_rank,
                              layer=i, group=group)
        setattr(layer.block, layer.experts_path.rpartition(".")[2], block)
        blocks.append(block)
    return ExpertParallel(model, blocks, [layer.experts_path for layer in layers], top_k, group)


def _recognised_layout(layer: layout_of.MoELayer, experts: int | None) -> layout_of.ExpertLayout:
    """The fused layout of ``layer.experts``, or ValueError naming its module path."""
    module, path = layer.experts, layer.experts_path
    if isinstance(module, HFExpertSlots):
        raise ValueError(f"{path}: already expert-parallel")
    try:
        layout = layout_of.expert_layout(module)
    except ValueError as exc:
        raise ValueError(f"{path}: expert layout not recognised ({exc})") from exc
    problem = ""
    names = set(layout.params)
    fused = {id(getattr(module, n)) for n in names}
    stray = [n for n, p in module.named_parameters() if id(p) not in fused]
    if "down_proj" not in names or not names & {"gate_up_proj", "up_proj"}:
        problem = f"fused parameters {sorted(names)} lack down_proj and gate_up_proj/up_proj"
    elif stray:
        problem = f"parameters {stray} are not fused per expert"
    elif not isinstance(getattr(module, "num_experts", None), int):
        problem = "no num_experts attribute"
    elif experts is not None and layout.num_experts != experts:
        problem = f"{layout.num_experts} experts, the config says {experts}"
    if problem:
        raise ValueError(f"{path}: expert layout of {type(module).__name__} not recognised: "
                         f"{problem}")
    return layout


def _check_ranks_agree(config, layouts, phy2log: np.ndarray, group) -> None:
    """ValueError on every rank when the ranks' configs, layouts or placements differ."""
    cfg = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    text = json.dumps([cfg, [(lay.params, lay.shapes) for lay in layouts]], sort_keys=True,
                      default=str)
    digest = [zlib.crc32(text.encode()), zlib.crc32(phy2log.tobytes())]
    vec = torch.tensor(digest + [-d for d in digest], dtype=torch.int64)
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
    if int(vec[0]) != -int(vec[2]):
        raise ValueError("model.config: ranks disagree on the model's config or expert layout")
    if int(vec[1]) != -int(vec[3]):
        raise PlacementError("phy2log", "ranks passed different initial placements")
