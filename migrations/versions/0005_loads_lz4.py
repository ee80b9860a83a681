"""Global load matrices compressed with lz4 instead of pglz (PostgreSQL only).

Every ingest batch rewrites the (job, step) row's 58×256 int64 matrix (~119 KB); pglz made
that read-modify-write ~4× slower than lz4 (benchmarks/ingest.py, docs/bench-ingest.md).
A no-op on SQLite and on a PostgreSQL built without lz4. Existing rows keep their encoding
until rewritten.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _lz4_available(bind) -> bool:
    return bool(bind.execute(sa.text(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    )).scalar())


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql" and _lz4_available(bind):
        op.execute("ALTER TABLE expert_loads ALTER COLUMN counts SET COMPRESSION lz4")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql" and _lz4_available(bind):
        op.execute("ALTER TABLE expert_loads ALTER COLUMN counts SET COMPRESSION pglz")
