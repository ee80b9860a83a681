"""Expert groups of a job (group-limited routing, issue 31): jobs.groups.

K groups: experts g*E/K .. (g+1)*E/K-1 form group g, and every replica of a group's experts
stays on the node its group is mapped to. NULL: the job declared none.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("groups", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "groups")  # SQLite >= 3.35 drops columns in place
