import numpy as np
import pytest

from moeplane.controlplane.balancing import plan_placement

LOADS = np.ones((2, 4))
CUR = np.tile(np.arange(6) % 4, (2, 1)).astype(np.int64)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"loads": np.ones(4)}, "loads"),
        ({"loads": np.array([[1.0, np.nan]])}, "loads"),
        ({"loads": -LOADS}, "loads"),
        ({"loads": LOADS.astype(bool)}, "loads"),
        ({"loads": np.array([["a", "b"]])}, "loads"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": 2.0}, "gpus"),
        ({"slots_per_gpu": True}, "slots_per_gpu"),
        ({"gpus": 1}, "gpus * slots_per_gpu"),
        ({"nodes": 4}, "nodes"),
        ({"current": CUR.astype(float)}, "current"),
        ({"current": CUR[:, :5]}, "current"),
        ({"current": CUR + 4}, "current"),
        ({"current": np.zeros_like(CUR)}, "current"),
        ({"max_moves": 3}, "max_moves"),
        ({"current": CUR, "max_moves": -1}, "max_moves"),
        ({"tolerance": float("nan")}, "tolerance"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, name):
    args = {"loads": LOADS, "gpus": 2, "slots_per_gpu": 3}
    args.update(kwargs)
    loads = args.pop("loads")
    with pytest.raises(ValueError, match=name.replace("*", r"\*")):
        plan_placement(loads, **args)


def test_integer_loads_and_current_of_other_int_dtypes_are_accepted():
    plan = plan_placement(
        LOADS.astype(np.int32), gpus=2, slots_per_gpu=3, current=CUR.astype(np.int16)
    )
    assert plan.phy2log.dtype == np.int64


def test_plan_arrays_are_read_only():
    plan = plan_placement(LOADS, gpus=2, slots_per_gpu=3)
    with pytest.raises(ValueError):
        plan.phy2log[0, 0] = 1
