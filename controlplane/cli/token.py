"""``moeplane token create|revoke|list``: API tokens (viewer, operator, admin) and node tokens.

The secret is printed once on creation; the store keeps only its sha256.
"""

from __future__ import annotations

import sys

from moeplane.controlplane.cli.serve import add_store_args


def register(sub) -> None:
    p = sub.add_parser("token", help="create, revoke and list access tokens", description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = actions.add_parser("create", help="create a token and print its secret once")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--role", choices=["viewer", "operator", "admin"], help="an API token with this role")
    who.add_argument("--node", dest="node_id", metavar="NODE_ID", help="a node agent token for this node")
    c.add_argument("--name", default="", help="a label for the token")
    add_store_args(c)
    r = actions.add_parser("revoke", help="revoke a token by id (effective immediately)")
    r.add_argument("id", type=int)
    add_store_args(r)
    ls = actions.add_parser("list", help="list tokens (never their secrets)")
    add_store_args(ls)
    p.set_defaults(func=main)


def main(args) -> int:
    from moeplane.controlplane.auth.tokens import Role, TokenStore
    from moeplane.controlplane.cli.serve import settings_from
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.migrate import upgrade
    from moeplane.controlplane.store.queries import NotFound

    url = settings_from(args).database_url
    upgrade(url)
    engine = make_engine(url)
    try:
        store = TokenStore(engine)
        if args.action == "create":
            role = Role.NODE if args.node_id else Role(args.role)
            try:
                made = store.create(role, name=args.name, node_id=args.node_id)
            except ValueError as exc:
                print(f"moeplane token: {exc}", file=sys.stderr)
                return 2
            who = f"node {args.node_id}" if args.node_id else f"role {role}"
            print(f"token {made.principal.token_id} ({who}); the secret is shown only now:", file=sys.stderr)
            print(made.secret)
            return 0
        if args.action == "revoke":
            try:
                changed = store.revoke(args.id)
            except NotFound:
                print(f"moeplane token: no token {args.id}", file=sys.stderr)
                return 1
            print(f"token {args.id} {'revoked' if changed else 'was already revoked'}")
            return 0
        for tok in store.list():
            state = "revoked" if tok["revoked_at"] is not None else "active"
            print(f"{tok['id']}\t{tok['role']}\t{tok['node_id'] or '-'}\t{state}\t{tok['name']}")
        return 0
    finally:
        engine.dispose()
