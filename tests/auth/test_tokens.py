"""Token store on SQLite and PostgreSQL: hashed at rest, roles ordered, revocation immediate."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from moeplane.controlplane.auth.tokens import Role, TokenStore, bearer
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.queries import NotFound


@pytest.fixture
def store(database_url):
    upgrade(database_url)
    eng = make_engine(database_url)
    yield TokenStore(eng, clock=lambda: 100.0)
    eng.dispose()


def test_secret_is_stored_only_as_its_hash(store):
    made = store.create(Role.OPERATOR, name="ops")
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(t.api_tokens)).mappings().all()
    assert len(rows) == 1
    assert rows[0]["token_hash"] == hashlib.sha256(made.secret.encode()).hexdigest()
    assert made.secret not in str(dict(rows[0]))
    assert "token_hash" not in store.list()[0]


def test_authenticate_revoke_at_once(store):
    viewer = store.create("viewer")
    node = store.create(Role.NODE, node_id="n1")
    assert store.authenticate(viewer.secret).role is Role.VIEWER
    p = store.authenticate(node.secret)
    assert p.role is Role.NODE and p.node_id == "n1"
    assert store.authenticate(None) is None
    assert store.authenticate("mp_" + "x" * 43) is None
    assert store.authenticate(viewer.secret[:-1]) is None
    assert store.revoke(viewer.principal.token_id) is True
    assert store.authenticate(viewer.secret) is None
    assert store.revoke(viewer.principal.token_id) is False
    assert store.authenticate(node.secret) is not None
    with pytest.raises(NotFound):
        store.revoke(999)


def test_role_order_and_validation(store):
    assert Role.ADMIN.allows(Role.OPERATOR) and Role.OPERATOR.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR) and not Role.NODE.allows(Role.VIEWER)
    with pytest.raises(ValueError, match="node_id"):
        store.create(Role.NODE)
    with pytest.raises(ValueError, match="node_id"):
        store.create(Role.VIEWER, node_id="n1")
    with pytest.raises(ValueError):
        store.create("superuser")
    assert bearer("Bearer abc") == "abc" and bearer("Basic abc") is None and bearer(None) is None
