"""The harness of :mod:`moeplane.controlplane.procs` (processes and deadline polls, shared with
the benchmarks and ``moeplane demo``), with HTTP errors counting as "not yet" while polling."""

from __future__ import annotations

import functools

import httpx

from moeplane.controlplane.procs import MOEPLANE, Proc, Procs, free_port, spawn, start_serve
from moeplane.controlplane.procs import wait_until as _wait_until

__all__ = ["MOEPLANE", "Proc", "Procs", "free_port", "spawn", "start_serve", "wait_until"]

wait_until = functools.partial(_wait_until, retry_on=(OSError, httpx.HTTPError))
