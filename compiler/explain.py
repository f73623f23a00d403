"""The compiler's decisions, kept per process for ``epilab.explain()``.

Every anchor the pass sees adds one ``Decision``. With ``EPILAB_LOG=1`` (or the
INFO level) each compilation's decisions are also printed as a table. A graph
that Inductor serves from its cache adds the decisions stored when it was compiled
(``replay.py``), marked ``replayed``. A template's row says how it runs: as a kernel
Inductor launches, or through the custom op, and why (``Decision.runs_as``).
"""

from __future__ import annotations

import json
import logging
import threading

from epilab.compiler.decide import Decision
from epilab.ir.config import config_text
from epilab.ir.spec import clip
from epilab.tables import table_text

log = logging.getLogger("epilab.compiler")
_lock = threading.Lock()
_decisions: list[Decision] = []


class Decisions(list[Decision]):
    """The decisions, a list that prints as the table (``table``): rich at a terminal's width,
    Markdown elsewhere (and in a notebook)."""

    def __str__(self) -> str:
        return table(self) if self else "no decisions: nothing was compiled with backend='epilab'"

    def _repr_markdown_(self) -> str:
        return table(self, terminal=False)


def record(decisions: list[Decision]) -> None:
    with _lock:
        _decisions.extend(decisions)
    if decisions and log.isEnabledFor(logging.INFO):
        cached = (
            " (Inductor's cache served it: decided when it was compiled)" if decisions[0].replayed else ""
        )
        log.info("epilab decisions for one graph%s:\n%s", cached, table(decisions, terminal=False))


def explain(clear: bool = False) -> Decisions:
    """The decisions of the compilations so far in this process (oldest first), printing as a
    table; ``clear=True`` also forgets them."""
    with _lock:
        out = Decisions(_decisions)
        if clear:
            _decisions.clear()
    return out


HEADERS = ["module", "anchor", "shape", "template", "config", "source", "runs as", "reason", "epilogue"]
# left out first where a terminal is too narrow (the reason and the epilogue fold instead)
OPTIONAL = ("runs as", "source", "config", "shape", "anchor")


def table(decisions: list[Decision], *, terminal: bool | None = None, width: int | None = None) -> str:
    """One row per anchor (``tables.table_text``): the module it belongs to, what ran and
    why, the epilogue as users read it; a decision Inductor's cache served says "replayed"."""
    rows = [
        [
            d.module or "-",
            d.anchor,
            d.shape,
            d.template or "aten",
            "" if d.config is None else _short(d.config),
            ", ".join(filter(None, [d.source, "replayed" if d.replayed else ""])),
            clip(d.runs_as, 50),
            d.reason,
            clip(d.epilogue, 80),
        ]
        for d in decisions
    ]
    replayed = (
        " (some replayed: Inductor's cache served their graph)" if any(d.replayed for d in decisions) else ""
    )
    title = f"epilab: {len(decisions)} decision(s){replayed}"
    return table_text(
        title, HEADERS, rows, left=len(HEADERS), optional=OPTIONAL, terminal=terminal, width=width
    )


def _short(config: dict) -> str:
    if "buckets" in config:
        return f"{len(config['buckets'])} M buckets"
    if all(k in config for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
        return config_text(config)
    return json.dumps(config, sort_keys=True)
