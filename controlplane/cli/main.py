"""The ``moeplane`` console command: one subcommand per module in this package.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit status). Modules keep
heavy imports inside ``func`` so ``moeplane --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "serve",
    "db",
    "agent",
    "simulate",
    "demo",
    "plan",
    "replay",
    "token",
    "loadgen",
    "load_import",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moeplane",
        description="Control plane for Mixture-of-Experts training clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"moeplane.controlplane.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"moeplane.controlplane.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
