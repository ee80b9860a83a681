from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from moeplane.controlplane.cli.agent import parse_ranks


def test_parse_ranks():
    assert parse_ranks("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_ranks("") == [] and parse_ranks("2,2,1") == [1, 2]
    for bad in ("a", "3-1", "-1", "1-x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--ranks"):
            parse_ranks(bad)


def test_simulate_refuses_top_k_above_experts():
    out = subprocess.run(
        [sys.executable, "-m", "moeplane.controlplane.cli.main", "simulate", "--job-id", "j",
         "--experts", "4", "--top-k", "8"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--top-k" in out.stderr
