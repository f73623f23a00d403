"""What the sweep benchmarks (``dual_mlp.py``, ``split_k.py``) share: timing one call by CUDA
events and, when it is short, by CUDA-graph replay; the median and spread of interleaved
rounds; the comparable time; geomeans; ``--only`` index lists. Imported by those scripts
(run as ``python3 benchmarks/<script>.py``, this folder is on the path)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from epilab.tuner.timing import time_cuda, time_graph

GRAPH_BELOW_MS = 0.05  # calls shorter than this are also timed by CUDA-graph replay


def timed(fn: Callable[[], object], graph: bool = False) -> tuple[float, float | None]:
    """Events (L2 flushed) and, for short calls or when ``graph``, CUDA-graph replay."""
    events = time_cuda(fn, rep_ms=60).median_ms
    short = graph or events < GRAPH_BELOW_MS
    replayed = time_graph(fn, calls=20, replays=10).median_ms if short else None
    return events, replayed


def summary(times: list[tuple[float, float | None]]) -> dict:
    """Median and spread (min..max) of the rounds' event times; the graph median when every
    round replayed."""
    ev = [t[0] for t in times]
    gr = [t[1] for t in times if t[1] is not None]
    return {
        "ms": statistics.median(ev),
        "spread": [min(ev), max(ev)],
        "graph_ms": statistics.median(gr) if len(gr) == len(times) else None,
    }


def comparable_ms(entry: dict | None) -> float | None:
    """The comparable time: CUDA-graph replay where the call is short, else events."""
    if entry is None:
        return None
    return entry["graph_ms"] or entry["ms"]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else float("nan")


def only(text: str | None, count: int) -> list[int]:
    """Indices from an ``--only`` list such as ``0-4,8`` (all when empty), below ``count``."""
    if not text:
        return list(range(count))
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return [i for i in out if i < count]
