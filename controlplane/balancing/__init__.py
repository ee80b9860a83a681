"""Expert placement planning (pure): loads in, placements and plans out, no I/O.

Entry points: ``plan_placement`` (fresh or incremental plans as a ``Plan``),
``route_replicas`` (one step's tokens divided among an expert's replicas), the load
forecasters in ``prediction``, and helpers ``balancedness`` / ``gpu_loads`` /
``count_moves`` / ``eplb_greedy`` (the reference policy).
"""

from moeplane.controlplane.balancing.eplb import eplb_greedy
from moeplane.controlplane.balancing.placement import (
    balancedness,
    count_moves,
    gpu_expert_counts,
    gpu_loads,
    identity_placement,
    layer_balancedness,
    replica_counts,
)
from moeplane.controlplane.balancing.planner import SEARCHES, Plan, fresh_placement, plan_placement
from moeplane.controlplane.balancing.prediction import (
    FORECASTERS,
    choose_forecaster,
    ema_forecast,
    expected_balancedness,
    forecast,
    holt_forecast,
    one_step_ahead_error,
    routed_balancedness,
    window_forecast,
)
from moeplane.controlplane.balancing.routing import route_replicas, route_with, routing_table

__all__ = [
    "FORECASTERS",
    "SEARCHES",
    "Plan",
    "balancedness",
    "choose_forecaster",
    "count_moves",
    "eplb_greedy",
    "ema_forecast",
    "expected_balancedness",
    "forecast",
    "fresh_placement",
    "gpu_expert_counts",
    "gpu_loads",
    "holt_forecast",
    "identity_placement",
    "layer_balancedness",
    "one_step_ahead_error",
    "plan_placement",
    "replica_counts",
    "routed_balancedness",
    "route_replicas",
    "route_with",
    "routing_table",
    "window_forecast",
]
