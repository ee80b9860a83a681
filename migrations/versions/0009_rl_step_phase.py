"""Phase seconds per RL step (issue 32): rl_step_phases, kept at ingest for long timelines.

One row per (job, step, node): per rank of the node, the step's first start, last end, role,
span count and seconds of each phase, as packed records
(``moeplane.controlplane.rl.step_phases.record_dtype``). Spans stored before this revision are
summarized here, one (job, node) at a time.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

import numpy as np
import sqlalchemy as sa
from alembic import op

from moeplane.controlplane.rl import step_phases as sp

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "rl_step_phases",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("phases", sa.SmallInteger, nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    conn = op.get_bind()
    pairs = conn.execute(sa.text("SELECT DISTINCT job_id, node_id FROM rl_spans")).all()
    for job_id, node_id in pairs:
        rows = conn.execute(sa.text("SELECT step, rank, role, phase, start_ts, end_ts FROM rl_spans "
                                    "WHERE job_id = :j AND node_id = :n"), {"j": job_id, "n": node_id}).all()
        a = np.array(rows, dtype=np.float64).reshape(len(rows), 6)
        steps, records = sp.summarize(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5])
        cut = np.flatnonzero(np.diff(steps)) + 1
        op.bulk_insert(table, [
            {"job_id": job_id, "step": int(s[0]), "node_id": node_id, "phases": int(r.dtype["seconds"].shape[0]),
             "ranks": int(r.size), "data": r.tobytes()}
            for s, r in zip(np.split(steps, cut), np.split(records, cut), strict=True)])


def downgrade() -> None:
    op.drop_table("rl_step_phases")
