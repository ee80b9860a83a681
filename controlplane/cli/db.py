"""``moeplane db upgrade|current``: schema migrations (Alembic)."""

from __future__ import annotations

from moeplane.controlplane.cli.serve import add_store_args


def register(sub) -> None:
    p = sub.add_parser("db", help="database schema migrations", description=__doc__)
    p.add_argument("action", choices=["upgrade", "current"])
    p.add_argument("revision", nargs="?", default="head")
    add_store_args(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from moeplane.controlplane.cli.serve import settings_from
    from moeplane.controlplane.store import migrate

    url = settings_from(args).database_url
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision)
        print(f"database at revision {migrate.current(url)}")
    else:
        print(migrate.current(url) or "(empty)")
    return 0
