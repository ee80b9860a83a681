"""Small hand-made profiles for the memory engine tests."""

from __future__ import annotations

from moeplane.controlplane.memory import DeviceMemory, LayerMemory

GB = 10**9


def layer(name: str, act: int, opt: int = 0, fwd: float = 0.01, bwd: float = 0.02,
          params: int = 0, inp: int = 0) -> LayerMemory:
    return LayerMemory(name=name, parameter_bytes=params, gradient_bytes=params,
                       optimizer_bytes=opt, activation_bytes=act, forward_s=fwd,
                       backward_s=bwd, input_bytes=inp)


def device(layers, capacity: int, used: int | None = None, node: str = "n0",
           device_id: str = "d0", bandwidth: float = 10 * GB, applied=(),
           micro_batch_size: int | None = None) -> DeviceMemory:
    layers = tuple(layers)
    demand = sum(x.parameter_bytes + x.gradient_bytes + x.optimizer_bytes + x.activation_bytes
                 for x in layers)
    return DeviceMemory(device_id=device_id, node_id=node, capacity_bytes=capacity,
                        used_bytes=demand if used is None else used, layers=layers,
                        host_bandwidth_bytes_per_s=bandwidth, applied=tuple(applied),
                        micro_batch_size=micro_batch_size)


def uniform(n: int, act: int = GB, opt: int = GB // 2, params: int = GB // 4,
            fwd: float = 0.01, bwd: float = 0.02, inp: int = GB // 20):
    return [layer(f"l{i}", act, opt, fwd, bwd, params, inp) for i in range(n)]
