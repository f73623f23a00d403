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
from epilab.ir.problem import config_text
from epilab.tables import markdown

log = logging.getLogger("epilab.compiler")
_lock = threading.Lock()
_decisions: list[Decision] = []


class Decisions(list[Decision]):
    """The decisions, a list that prints as the table (``table``)."""

    def __str__(self) -> str:
        return table(self) if self else "no decisions: nothing was compiled with backend='epilab'"


def record(decisions: list[Decision]) -> None:
    with _lock:
        _decisions.extend(decisions)
    if decisions and log.isEnabledFor(logging.INFO):
        cached = (
            " (Inductor's cache served it: decided when it was compiled)" if decisions[0].replayed else ""
        )
        log.info("epilab decisions for one graph%s:\n%s", cached, table(decisions))


def explain(clear: bool = False) -> Decisions:
    """The decisions of the compilations so far in this process (oldest first), printing as a
    table; ``clear=True`` also forgets them."""
    with _lock:
        out = Decisions(_decisions)
        if clear:
            _decisions.clear()
    return out


def table(decisions: list[Decision]) -> str:
    """A Markdown table (``tables.markdown``): one row per anchor."""
    rows = [
        [
            d.anchor,
            d.shape,
            d.template or "aten",
            d.source or "",
            "" if d.config is None else _short(d.config),
            _clip(d.runs_as, 50),
            d.reason,
            _clip(d.epilogue, 60),
        ]
        for d in decisions
    ]
    header = ["anchor", "shape", "template", "source", "config", "runs as", "reason", "epilogue"]
    return markdown(header, rows, left=8)


def _short(config: dict) -> str:
    if "buckets" in config:
        return f"{len(config['buckets'])} M buckets"
    if all(k in config for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
        return config_text(config)
    return json.dumps(config, sort_keys=True)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
