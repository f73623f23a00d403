"""Verdicts: whether a template kept its promise inside a compiled model.

Adds ``epilab_verdicts`` (one row per problem, device, CUDA-graph mode, Inductor mode and versions;
``tuner/model.py`` writes them, the compiler reads them). Existing rows are untouched.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "epilab_verdicts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "problem_id",
            sa.Integer(),
            sa.ForeignKey("epilab_problems.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "device_id", sa.Integer(), sa.ForeignKey("epilab_devices.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("cuda_graphs", sa.Boolean(), nullable=False),
        sa.Column("inductor_mode", sa.String(32), nullable=False),
        sa.Column("keep", sa.Boolean(), nullable=False),
        sa.Column("with_ms", sa.Float(), nullable=False),
        sa.Column("without_ms", sa.Float(), nullable=False),
        sa.Column("context", sa.String(128), nullable=False),
        sa.Column("timing_method", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "problem_id",
            "device_id",
            "cuda_graphs",
            "inductor_mode",
            "torch_version",
            "triton_version",
            name="uq_epilab_verdicts_identity",
        ),
    )


def downgrade() -> None:
    op.drop_table("epilab_verdicts")
