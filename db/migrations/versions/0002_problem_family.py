"""Problem family: the key of a problem with M left out, for nearest-shape lookups.

Adds ``problems.family`` (indexed) and fills it for every existing row from the
stored JSON, with the same function the store uses for new rows.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from epilab.db.keys import family_key

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN: rebuilding the table (batch mode) would drop and recreate
    # problems, which with foreign keys on would cascade into trials and baselines.
    op.add_column("epilab_problems", sa.Column("family", sa.String(64), nullable=True))
    conn = op.get_bind()
    problems = sa.table(
        "epilab_problems",
        sa.column("id", sa.Integer),
        sa.column("json", sa.Text),
        sa.column("family", sa.String),
    )
    for row_id, text in conn.execute(sa.select(problems.c.id, problems.c.json)).all():
        conn.execute(problems.update().where(problems.c.id == row_id).values(family=family_key(text)))
    op.create_index("ix_epilab_problems_family", "epilab_problems", ["family"])


def downgrade() -> None:
    op.drop_index("ix_epilab_problems_family", table_name="epilab_problems")
    op.drop_column("epilab_problems", "family")
