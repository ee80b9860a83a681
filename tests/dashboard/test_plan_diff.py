import numpy as np
import pytest

from moeplane.dashboard.plan_diff import changed_slots, placement_diff
from moeplane.dashboard.plan_views import diff_figure, plan_rows, timeline_figure

# 2 layers, 4 ranks x 2 slots, 6 experts; ranks 0-1 on node 0, ranks 2-3 on node 1
RUNNING = np.array([[0, 1, 2, 3, 4, 5, 0, 1],
                    [0, 1, 2, 3, 4, 5, 0, 1]])


def test_diff_counts_changed_slots_and_replica_gains_and_losses():
    proposed = RUNNING.copy()
    proposed[0, 7] = 5  # layer 0: rank 3 slot 1 swaps a replica of 1 for a second 5
    d = placement_diff(RUNNING, proposed, experts=6, ranks=4)
    assert d.slots_changed == 1 and d.layers_changed == 1
    assert d.replica_delta[0].tolist() == [0, -1, 0, 0, 0, 1]
    assert not d.replica_delta[1].any()
    assert d.changed_per_rank.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    assert (d.experts_gaining, d.experts_losing) == (1, 1)


def test_identical_placements_have_no_diff():
    d = placement_diff(RUNNING, RUNNING.copy(), experts=6, ranks=4)
    assert (d.slots_changed, d.layers_changed, d.experts_gaining, d.experts_losing) == (0, 0, 0, 0)


def test_changed_slots_flags_experts_that_cross_nodes():
    proposed = RUNNING.copy()
    proposed[1, 0] = 3  # rank 0 (node 0) takes expert 3, already on rank 1 of node 0: intra-node
    proposed[1, 1] = 4  # rank 0 takes expert 4, held only on node 1: crosses nodes
    rows = changed_slots(RUNNING, proposed, ranks=4, ranks_per_node=2)
    assert rows == [
        {"layer": 1, "rank": 0, "slot": 0, "before": 0, "after": 3, "cross_node": False},
        {"layer": 1, "rank": 0, "slot": 1, "before": 1, "after": 4, "cross_node": True},
    ]
    assert [r["cross_node"] for r in changed_slots(RUNNING, proposed, ranks=4)] == [None, None]
    assert len(changed_slots(RUNNING, proposed, ranks=4, limit=1)) == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"proposed": RUNNING[:, :6]}, "proposed"),
        ({"ranks": 3}, "ranks"),
        ({"experts": 5}, "running"),
        ({"experts": 0}, "experts"),
    ],
)
def test_diff_validation_names_the_argument(kwargs, name):
    args = {"running": RUNNING, "proposed": RUNNING.copy(), "experts": 6, "ranks": 4} | kwargs
    with pytest.raises(ValueError, match=f"^{name}:"):
        placement_diff(**args)


def test_changed_slots_validation():
    with pytest.raises(ValueError, match="^ranks_per_node:"):
        changed_slots(RUNNING, RUNNING, ranks=4, ranks_per_node=3)
    with pytest.raises(ValueError, match="^limit:"):
        changed_slots(RUNNING, RUNNING, ranks=4, limit=-1)


PLANS = [
    {"epoch": 2, "status": "proposed", "kind": "rebalance", "created_at": 1_700_000_100.0, "moves": 5,
     "cross_node_moves": 2, "predicted_before": 1.4, "predicted_after": 1.1, "measured_before": 1.38,
     "measured_after": None, "applied_step": None, "reason": "imbalanced"},
    {"epoch": 1, "status": "applied", "kind": "rebalance", "created_at": 1_700_000_000.0, "moves": 3,
     "cross_node_moves": 0, "predicted_before": 1.5, "predicted_after": 1.2, "measured_before": 1.52,
     "measured_after": 1.21, "applied_step": 40, "reason": ""},
]


def test_plan_rows_show_moves_and_balancedness():
    rows = plan_rows(PLANS)
    assert rows[0]["moves"] == "3 intra / 2 cross"
    assert rows[0]["predicted"] == "1.400 → 1.100" and rows[0]["measured"] == "1.380 → –"
    assert rows[1]["applied_step"] == "40" and rows[1]["created"] == "2023-11-14 22:13:20"


def test_timeline_orders_plans_by_epoch_with_status_strip():
    fig = timeline_figure(PLANS)
    by_name = {tr["name"]: tr for tr in fig["data"]}
    assert by_name["measured after"]["y"] == [1.21, None]
    assert by_name["predicted before"]["y"] == [1.5, 1.4]
    assert by_name["status"]["customdata"] == ["applied", "proposed"]


def test_diff_figure_carries_replica_delta():
    proposed = RUNNING.copy()
    proposed[0, 7] = 5
    fig = diff_figure(placement_diff(RUNNING, proposed, 6, 4), 3, "identity")
    assert fig["data"][0]["z"][0] == [0, -1, 0, 0, 0, 1]
    assert "1 slots change in 1 layers" in fig["layout"]["title"]["text"]
