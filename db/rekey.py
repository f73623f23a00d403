"""Rewriting stored problems in place, for the migrations that change a problem's JSON
(0008: its kernel hash; 0009: an operand attribute's name): the row keeps its id, so its
trials, baselines, verdicts and leases stay with it, and gets the key and family of its new
JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from epilab.db.keys import canonical, family_key, problem_key

PROBLEMS = sa.table(
    "epilab_problems",
    sa.column("id", sa.Integer),
    sa.column("key", sa.String),
    sa.column("family", sa.String),
    sa.column("json", sa.Text),
    sa.column("template", sa.String),
    sa.column("template_hash", sa.String),
    sa.column("epilogue", sa.Text),
)

# (row, its parsed JSON) -> the other columns to set, having edited the JSON in place; or
# None to leave the row as it is
Rewrite = Callable[[Any, dict[str, Any]], dict[str, Any] | None]


def rekey_problems(conn: sa.Connection, rewrite: Rewrite) -> None:
    """Rewrite each problem row (see ``Rewrite``); a row whose JSON does not parse, or whose
    new key another row already has, is left as it was."""
    rows = conn.execute(sa.select(PROBLEMS)).all()
    taken = {r.key for r in rows}
    for row in rows:
        try:
            d = json.loads(row.json)
        except ValueError:
            continue
        columns = rewrite(row, d)
        if columns is None:
            continue
        text = canonical(d)
        key = problem_key(text)
        if key in taken:
            continue
        taken.add(key)
        conn.execute(
            PROBLEMS.update()
            .where(PROBLEMS.c.id == row.id)
            .values(key=key, family=family_key(text), json=text, **columns)
        )
