"""Verdicts with their interval: how sure the check in context was.

Adds to ``epilab_verdicts`` the paired ratio's interval (``ratio_low``, ``ratio_high``: the
model's time without the template over its time with it, ``tuner/significance.py``), the
rounds it took and the outcome ("faster", "not faster", "undecided", "slower than
inductor"). All nullable: verdicts recorded before (medians only) keep NULL there.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("epilab_verdicts") as batch:
        batch.add_column(sa.Column("ratio_low", sa.Float(), nullable=True))
        batch.add_column(sa.Column("ratio_high", sa.Float(), nullable=True))
        batch.add_column(sa.Column("rounds", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("outcome", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("epilab_verdicts") as batch:
        for name in ("outcome", "rounds", "ratio_high", "ratio_low"):
            batch.drop_column(name)
