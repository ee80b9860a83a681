"""Applied memory actions leave the math unchanged and measurably move memory (CPU)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from moeplane.agents.sdk.memory import apply_actions
from moeplane.agents.sdk.memory.swap import SwappedLayer
from moeplane.controlplane.memory import Action, ActionKind

pytestmark = pytest.mark.torch


class Block(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Model(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4, dropout: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).pow(2).mean()


def grads_after_backward(model: Model, x: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(x).backward()
    return [p.grad.clone() for p in model.parameters()]


def action(kind: ActionKind, *layers: str) -> Action:
    return Action(kind=kind, layers=layers, device_bytes_freed=0, host_bytes=0, overhead_s=0.0)


@pytest.fixture
def model_and_input():
    torch.manual_seed(1)
    return Model(), torch.randn(8, 12, 16)


@pytest.mark.parametrize(
    "actions",
    [
        [action(ActionKind.SWAP_ACTIVATIONS, "0", "1", "2")],
        [action(ActionKind.RECOMPUTE, "1", "3")],
        [action(ActionKind.SWAP_ACTIVATIONS, "0", "1"), action(ActionKind.RECOMPUTE, "2", "3")],
    ],
    ids=["swap", "recompute", "swap+recompute"],
)
def test_gradients_identical_with_and_without_the_action(model_and_input, actions):
    model, x = model_and_input
    expected = grads_after_backward(model, x)
    applied = apply_actions(model.layers, actions)
    got = grads_after_backward(model, x)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, rtol=1e-6, atol=1e-7)
    applied.undo()
    assert all(type(m) is Block for m in model.layers)
    again = grads_after_backward(model, x)
    assert all(torch.equal(g, e) for g, e in zip(again, expected, strict=True))


def test_recompute_replays_dropout_masks():
    torch.manual_seed(2)
    model, x = Model(dropout=0.3), torch.randn(4, 6, 16)
    expected = grads_after_backward(model, x, seed=7)
    apply_actions(model.layers, [action(ActionKind.RECOMPUTE, "0", "1", "2", "3")])
    got = grads_after_backward(model, x, seed=7)
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, rtol=1e-6, atol=1e-7)


def train(model: Model, x: torch.Tensor, steps: int, actions=()) -> tuple[Model, object]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    applied = apply_actions(model.layers, actions, optimizer=optimizer)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(x).backward()
        optimizer.step()
    return model, applied


def test_optimizer_offload_gives_identical_parameters_after_several_steps(model_and_input):
    model, x = model_and_input
    reference, _ = train(copy.deepcopy(model), x, steps=4)
    offloaded, applied = train(model, x, steps=4,
                               actions=[action(ActionKind.OFFLOAD_OPTIMIZER, "1", "2")])
    for p, q in zip(offloaded.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    params = [p for i in (1, 2) for p in model.layers[i].parameters()]
    expected = sum(2 * p.numel() * p.element_size() + 4 for p in params)  # moments + step
    assert applied.offload.host_bytes == expected
    # between steps the state is held by host copies, not the tensors the step wrote
    state = applied.offload.optimizer.state[params[0]]
    held = state["exp_avg"]
    applied.undo()
    assert applied.offload is None
    assert torch.equal(state["exp_avg"], held)


def test_swap_and_recompute_move_saved_bytes_off_the_device(model_and_input):
    model, x = model_and_input

    def step():
        model.zero_grad(set_to_none=True)
        model(x).backward()

    plain = apply_actions(model.layers, [])
    before = plain.measure(step)
    assert before.activation_host_bytes == 0 and before.activation_device_bytes > 0
    swap = apply_actions(model.layers, [action(ActionKind.SWAP_ACTIVATIONS, "0", "1")])
    after = swap.measure(step)
    assert after.activation_host_bytes > 0
    # every byte a swapped layer saved is on the host instead of the device
    assert (after.activation_device_bytes + after.activation_host_bytes
            == before.activation_device_bytes)
    assert after.activation_device_bytes < before.activation_device_bytes
    swap.undo()
    recompute = apply_actions(model.layers, [action(ActionKind.RECOMPUTE, "0", "1", "2")])
    saved = recompute.measure(step)
    assert saved.activation_host_bytes == 0
    assert saved.activation_device_bytes < after.activation_device_bytes
    assert saved.cuda_peak_bytes is None


def test_swapped_layer_prefetches_the_layer_below():
    torch.manual_seed(3)
    model, x = Model(depth=3), torch.randn(2, 4, 16)
    applied = apply_actions(model.layers, [action(ActionKind.SWAP_ACTIVATIONS, "0", "1")])
    lower, upper = applied.swapped()
    assert upper.below is lower and lower.below is None
    fetched_early = []
    original = lower.prefetch

    def spy():
        fetched_early.append(True)
        original()

    lower.prefetch = spy
    model(x).backward()
    assert fetched_early  # layer 0's tensors were requested while layer 1 ran backward


def test_bad_actions_name_the_argument(model_and_input):
    model, _ = model_and_input
    with pytest.raises(ValueError, match=r"^actions\[0\]\.layers: unknown layer 'nine'"):
        apply_actions(model.layers, [action(ActionKind.RECOMPUTE, "nine")])
    with pytest.raises(ValueError, match=r"^actions\[1\]\.layers: layer '0' cannot both"):
        apply_actions(model.layers, [action(ActionKind.RECOMPUTE, "0"),
                                     action(ActionKind.SWAP_ACTIVATIONS, "0")])
    with pytest.raises(ValueError, match=r"^actions\[0\]\.kind:"):
        apply_actions(model.layers, [SimpleNamespace(kind="shrink", layers=("0",))])
    with pytest.raises(ValueError, match=r"^optimizer:"):
        apply_actions(model.layers, [action(ActionKind.OFFLOAD_OPTIMIZER, "0")])
    with pytest.raises(ValueError, match=r"^names:"):
        apply_actions(model.layers, [], names=["a"])
    assert not any(isinstance(m, SwappedLayer) for m in model.layers)
