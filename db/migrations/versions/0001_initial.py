"""Initial schema: devices, problems, trial records, baselines.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _timed_columns() -> list[sa.Column]:
    return [
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p20_ms", sa.Float(), nullable=True),
        sa.Column("p80_ms", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("gbps", sa.Float(), nullable=True),
        sa.Column("max_rel_error", sa.Float(), nullable=True),
        sa.Column("timing_method", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    ]


def _owner_columns() -> list[sa.Column]:
    """The problem and device a trial or baseline row belongs to (deleted with them)."""
    return [
        sa.Column(
            "problem_id",
            sa.Integer(),
            sa.ForeignKey("epilab_problems.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "device_id", sa.Integer(), sa.ForeignKey("epilab_devices.id", ondelete="CASCADE"), nullable=False
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "epilab_devices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.UniqueConstraint("name", "capability", "sm_count", name="uq_epilab_devices_identity"),
    )
    op.create_table(
        "epilab_problems",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("json", sa.Text(), nullable=False),
        sa.Column("op", sa.String(32), nullable=False),
        sa.Column("template", sa.String(64), nullable=False),
        sa.Column("template_hash", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("layout_a", sa.String(16), nullable=False),
        sa.Column("layout_b", sa.String(16), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("epilogue", sa.Text(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.Column("m", sa.Integer(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=True),
        sa.Column("k", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "epilab_trials",
        sa.Column("id", sa.Integer(), primary_key=True),
        *_owner_columns(),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("study", sa.String(128), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        *_timed_columns(),
        sa.UniqueConstraint(
            "problem_id",
            "device_id",
            "config",
            "torch_version",
            "triton_version",
            name="uq_epilab_trials_identity",
        ),
    )
    op.create_index(
        "ix_epilab_trials_lookup", "epilab_trials", ["problem_id", "device_id", "status", "median_ms"]
    )
    op.create_table(
        "epilab_baselines",
        sa.Column("id", sa.Integer(), primary_key=True),
        *_owner_columns(),
        sa.Column("library", sa.String(32), nullable=False),
        *_timed_columns(),
        sa.UniqueConstraint(
            "problem_id",
            "device_id",
            "library",
            "torch_version",
            "triton_version",
            name="uq_epilab_baselines_identity",
        ),
    )


def downgrade() -> None:
    op.drop_table("epilab_baselines")
    op.drop_index("ix_epilab_trials_lookup", table_name="epilab_trials")
    op.drop_table("epilab_trials")
    op.drop_table("epilab_problems")
    op.drop_table("epilab_devices")
