"""Live data between replicas: Redis pub/sub, or an in-process bus with the same interface."""

from moeplane.controlplane.bus.base import Bus, Subscription
from moeplane.controlplane.bus.memory import InProcessBus


def make_bus(redis_url: str) -> Bus:
    """Redis bus when ``redis_url`` is set, else the in-process bus (single-machine default)."""
    if redis_url:
        from moeplane.controlplane.bus.redis import RedisBus

        return RedisBus(redis_url)
    return InProcessBus()


__all__ = ["Bus", "Subscription", "InProcessBus", "make_bus"]
