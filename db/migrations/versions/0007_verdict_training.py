"""Verdicts of training steps apart from those of inference.

Adds ``training`` to ``epilab_verdicts`` (the model was timed as a training step: forward and
backward, ``tune --model --train``) and makes it part of a verdict's identity: what a
template is worth inside a training step (its problem beside the backward's GEMMs, with the
outputs the backward saves) says nothing of the same problem at inference, and the compiler
reads the verdicts of the kind of graph it compiles. Existing verdicts were all measured at
inference: they keep ``training`` false.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BEFORE = ("problem_id", "device_id", "cuda_graphs", "inductor_mode", "torch_version", "triton_version")
NAME = "uq_epilab_verdicts_identity"


def upgrade() -> None:
    with op.batch_alter_table("epilab_verdicts") as batch:
        batch.add_column(sa.Column("training", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.drop_constraint(NAME, type_="unique")
        batch.create_unique_constraint(NAME, [*BEFORE[:3], "training", *BEFORE[3:]])


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM epilab_verdicts WHERE training"))
    with op.batch_alter_table("epilab_verdicts") as batch:
        batch.drop_constraint(NAME, type_="unique")
        batch.create_unique_constraint(NAME, list(BEFORE))
        batch.drop_column("training")
