"""An epilogue operand's broadcast (row, col, tile, scalar) is stored as ``broadcast``.

Until 0008 the attribute was ``kind``, a word epilab also used for a template kind, a
worker's job and a fleet event. Its kernels are the same (the rendered text does not name the
attribute, so ``template_hash`` stays), but the problem's JSON, and with it its key and
family, changes: each problem row whose epilogue has an operand gets its JSON with the new
name, the key and family of that JSON, and the epilogue text ``operand[broadcast=...]``. Its
trials, baselines, verdicts and leases (tied by row id) stay with it. A row whose new key
another row already has is left as it was. Downgrading names the attribute ``kind`` again.

A pure rewrite of the JSON: nothing of templates/ or ir/ is imported.

Revision ID: 0009
Revises: 0008
"""

from typing import Any

from alembic import op

from epilab.db.rekey import rekey_problems

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def renamed(problem: dict[str, Any], old: str, new: str) -> bool:
    """Rename attribute ``old`` of each operand node of ``problem``'s epilogue to ``new``, in
    place; whether any was."""
    found = False
    nodes = problem.get("epilogue", {}).get("nodes", []) if isinstance(problem, dict) else []
    for node in nodes:
        attrs = node[2] if isinstance(node, list) and len(node) == 3 and node[0] == "operand" else None
        if isinstance(attrs, dict) and old in attrs and new not in attrs:
            attrs[new] = attrs.pop(old)
            found = True
    return found


def _rename(old: str, new: str) -> None:
    def rewrite(row: Any, d: dict[str, Any]) -> dict[str, Any] | None:
        if not renamed(d, old, new):
            return None
        return {"epilogue": (row.epilogue or "").replace(f"operand[{old}=", f"operand[{new}=")}

    rekey_problems(op.get_bind(), rewrite)


def upgrade() -> None:
    _rename("kind", "broadcast")


def downgrade() -> None:
    _rename("broadcast", "kind")
