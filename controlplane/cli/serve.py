"""``moeplane serve``: the control plane (gRPC ingest, REST, dashboard)."""

from __future__ import annotations

import argparse


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="SQLAlchemy URL (env MOEPLANE_DATABASE_URL; default sqlite:///moeplane.sqlite)")


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the control plane", description=__doc__)
    add_store_args(p)
    p.add_argument("--redis-url", help="Redis URL for the shared bus (env MOEPLANE_REDIS_URL); default: in-process bus")
    p.add_argument("--grpc-listen", help="agent ingest address (default 127.0.0.1:50051)")
    p.add_argument("--http-host", help="REST/dashboard host (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, help="REST/dashboard port (default 8080)")
    p.add_argument("--sample-interval", type=float, dest="sample_interval_s", help="seconds between device samples told to agents")
    p.add_argument("--rebalance-mode", choices=["auto", "manual"], help="cluster default: plans applied automatically, or after operator approval")
    p.add_argument("--no-dashboard", action="store_false", dest="dashboard", default=None)
    p.add_argument("--auth", action="store_true", default=None,
                   help="require API tokens (REST) and node tokens (gRPC) (env MOEPLANE_AUTH); without it the "
                        "server runs open and only on loopback addresses")
    p.add_argument("--tls-cert", dest="tls_certfile", help="PEM certificate: serve HTTPS and gRPC over TLS")
    p.add_argument("--tls-key", dest="tls_keyfile", help="PEM private key for --tls-cert")
    p.add_argument("--raw-retention", type=float, dest="raw_retention_s",
                   help="seconds raw device samples and step statistics are kept (then 1-min/1-h tiers)")
    p.set_defaults(func=main)


def settings_from(args):
    from moeplane.controlplane.settings import Settings

    given = {
        k: v
        for k, v in vars(args).items()
        if k in Settings.model_fields and v is not None
    }
    return Settings(**given)


def main(args) -> int:
    import sys

    from pydantic import ValidationError

    from moeplane.controlplane.server import run

    try:
        settings = settings_from(args)
    except ValidationError as exc:  # a flag or MOEPLANE_* variable: one line naming it
        err = exc.errors()[0]
        what = str(err["msg"]).removeprefix("Value error, ")
        print(f"moeplane serve: {err['loc'][0] if err['loc'] else 'settings'}: {what}", file=sys.stderr, flush=True)
        return 2
    return run(settings)
