"""Leases and workers: several tuning processes sharing one work list.

Adds ``epilab_leases`` (one row per problem, device and versions that a work list asked
for: who holds it, until when, and how it ended) and ``epilab_workers`` (one row per
tuning worker, with its heartbeat). Existing rows are untouched.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _fk(name: str, table: str) -> sa.Column:
    return sa.Column(name, sa.Integer(), sa.ForeignKey(f"{table}.id", ondelete="CASCADE"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "epilab_leases",
        sa.Column("id", sa.Integer(), primary_key=True),
        _fk("problem_id", "epilab_problems"),
        _fk("device_id", "epilab_devices"),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("label", sa.String(128), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "problem_id", "device_id", "torch_version", "triton_version", name="uq_epilab_leases_identity"
        ),
    )
    op.create_index("ix_epilab_leases_state", "epilab_leases", ["device_id", "state", "expires_at"])
    op.create_table(
        "epilab_workers",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        _fk("device_id", "epilab_devices"),
        sa.Column("device_label", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("problems", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("epilab_workers")
    op.drop_index("ix_epilab_leases_state", table_name="epilab_leases")
    op.drop_table("epilab_leases")
