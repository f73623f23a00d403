"""Problems keyed by what their kernels are made of, not by every file a template shares.

Until 0007 a problem's ``template_hash`` was the hash of all its template's files, the
shared epilogue files and the rule table included: one new epilogue op made every stored
record of every template stale. From 0008 it is ``render.kernel_hash``: the template's own
files and the text the shared files put into this problem's kernels, so a record goes stale
only when its kernels would be rendered differently.

The epilab that wrote 0008 renders every kernel byte for byte as the one that wrote 0007 did
(``benchmarks/render_digest.py`` over every suite problem, a spread of configs each, both
targets: RESULTS.md, "The shape of the house"). So a problem current under 0007 (its hash
is one of ``HASHES_AT_0007``) is current now: it gets its new hash, and with it its key,
family and JSON; its trials, baselines, verdicts and leases (tied by row id) stay with it.
A problem already stale stays stale, and one whose new key a row already has is left as it
was. Downgrading gives the rows of current problems their 0007 hash back.

This is the one migration that imports templates/ (to render): the rows' JSON is the input.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Callable
from typing import Any

from alembic import op

from epilab.db.rekey import rekey_problems

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# every template's hash at revision 0007 (``kinds.current_hashes()`` of that epilab)
HASHES_AT_0007 = {
    "matmul": "213ab17190b080b50f1b2986ba97adf7954e40ecac102be39b233476d46f241d",
    "gemv": "c4038b3fd1073b1397e7b55078a2544d0d6bc38213933df9b9c8855131f92ced",
    "conv2d": "93a44c303bd2cb99cc071ece45745e6647e435962c315b95c2e76782f4ee0fe6",
    "dual_matmul": "213ab17190b080b50f1b2986ba97adf7954e40ecac102be39b233476d46f241d",
    "dual_gemv": "c4038b3fd1073b1397e7b55078a2544d0d6bc38213933df9b9c8855131f92ced",
}


def _rehash(new_hash: Callable[[str, str], str | None]) -> None:
    """Give each row the hash ``new_hash(template, json)`` names (None: leave it), and the
    key, family and JSON that go with it."""

    def rewrite(row: Any, d: dict[str, Any]) -> dict[str, Any] | None:
        hashed = new_hash(row.template, row.json)
        if hashed is None:
            return None
        d["template_hash"] = hashed
        return {"template_hash": hashed}

    rekey_problems(op.get_bind(), rewrite)


def hash_now(template: str, text: str) -> str | None:
    """The hash a problem recorded under 0007 has now: its kernel hash where it was current
    then; None where it was stale then, or cannot be read (it stays as it was). ``epilab db
    import`` gives a problem of an older export the same."""
    from epilab.ir.problem import Problem
    from epilab.templates.registry import template_hash

    try:
        problem = Problem.from_json(text)
    except ValueError:
        return None
    if problem.template_hash != HASHES_AT_0007.get(template):
        return None
    return template_hash(template, problem.epilogue)


def upgrade() -> None:
    _rehash(hash_now)


def downgrade() -> None:
    from epilab.templates.registry import is_current

    def then(template: str, text: str) -> str | None:
        return HASHES_AT_0007.get(template) if is_current(text) else None

    _rehash(then)
