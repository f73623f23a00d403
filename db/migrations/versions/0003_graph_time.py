"""CUDA-graph time: per-call ms from CUDA-graph replay, measured for short kernels.

Adds a nullable ``graph_ms`` to trial records and baselines; existing rows keep
NULL (they were not measured that way).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("epilab_trials", "epilab_baselines"):
        op.add_column(table, sa.Column("graph_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("epilab_trials", "epilab_baselines"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("graph_ms")
