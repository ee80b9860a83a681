"""Rebalancing control loop: pure decision (``decide``), leadership, and the per-job runner."""
