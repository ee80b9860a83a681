"""Token store: create, revoke, list and authenticate API and node tokens (stored hashed).

A token is ``mp_<urlsafe base64 of 32 random bytes>``; the database keeps sha256(token) only.
Roles are ordered viewer < operator < admin; ``node`` tokens belong to one node's agent and
carry no REST role.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.queries import NotFound

PREFIX = "mp_"
_INFO = sa.select(*[c for c in t.api_tokens.c if c.name != "token_hash"])  # a token without its hash


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    NODE = "node"

    @property
    def rank(self) -> int:
        """Order for REST checks: node 0 (no REST access), viewer 1, operator 2, admin 3."""
        return {"node": 0, "viewer": 1, "operator": 2, "admin": 3}[self.value]

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Principal:
    """Who a valid token belongs to."""

    token_id: int
    name: str
    role: Role
    node_id: str | None = None


@dataclass(frozen=True)
class CreatedToken:
    principal: Principal
    secret: str  # shown once; never stored


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    """Token operations on one engine; ``clock`` gives unix seconds."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time):
        self.engine = engine
        self.clock = clock

    def create(self, role: Role | str, *, name: str = "", node_id: str | None = None) -> CreatedToken:
        """New token. ``role`` node needs ``node_id``; other roles must not have one."""
        role = Role(role)
        if role is Role.NODE and not node_id:
            raise ValueError("node_id: a node token names its node")
        if role is not Role.NODE and node_id:
            raise ValueError(f"node_id: only node tokens name a node (role is {role})")
        if len(name) > 128 or (node_id and len(node_id) > 128):
            raise ValueError("name: at most 128 characters")
        name = name or (f"node {node_id}" if node_id else str(role))
        secret = PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            tid = conn.execute(
                sa.insert(t.api_tokens)
                .values(name=name, role=str(role),
                        node_id=node_id, token_hash=hash_token(secret), created_at=self.clock())
                .returning(t.api_tokens.c.id)
            ).scalar_one()
        return CreatedToken(Principal(tid, name, role, node_id), secret)

    def revoke(self, token_id: int) -> bool:
        """Revoke by id. Returns False when it was already revoked; NotFound when unknown."""
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(t.api_tokens.c.revoked_at).where(t.api_tokens.c.id == token_id)
            ).first()
            if row is None:
                raise NotFound(f"token {token_id}")
            if row.revoked_at is not None:
                return False
            conn.execute(
                sa.update(t.api_tokens).where(t.api_tokens.c.id == token_id).values(revoked_at=self.clock())
            )
        return True

    def list(self) -> list[dict]:
        """Every token without its hash: id, name, role, node_id, created_at, revoked_at."""
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(_INFO.order_by(t.api_tokens.c.id)).mappings()]

    def get(self, token_id: int) -> dict:
        """One token as :meth:`list` shows it; NotFound when unknown."""
        with self.engine.connect() as conn:
            row = conn.execute(_INFO.where(t.api_tokens.c.id == token_id)).mappings().first()
        if row is None:
            raise NotFound(f"token {token_id}")
        return dict(row)

    def authenticate(self, secret: str | None) -> Principal | None:
        """The principal of a live token, or None (missing, unknown or revoked). Reads the store."""
        if not secret or not secret.startswith(PREFIX) or len(secret) > 256:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.api_tokens).where(
                    t.api_tokens.c.token_hash == hash_token(secret), t.api_tokens.c.revoked_at.is_(None)
                )
            ).first()
        if row is None:
            return None
        return Principal(row.id, row.name, Role(row.role), row.node_id)


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, else None."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
