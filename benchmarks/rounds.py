"""What the sweep benchmarks (``dual_mlp.py``, ``split_k.py``, ``fp8.py``) share: timing one call
by CUDA events and, when it is short, by CUDA-graph replay; the median and spread of
interleaved rounds; the comparable time; geomeans; ``--only`` index lists; the suite options,
the device header and the JSON written after every problem. Imported by those scripts (run as
``python3 benchmarks/<script>.py``, this folder is on the path)."""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
from collections.abc import Callable, Mapping

import torch
import triton

from epilab.tuner.timing import time_cuda, time_graph

GRAPH_BELOW_MS = 0.05  # calls shorter than this are also timed by CUDA-graph replay


def timed(fn: Callable[[], object], graph: bool = False) -> tuple[float, float | None]:
    """Events (L2 flushed) and, for short calls or when ``graph``, CUDA-graph replay."""
    events = time_cuda(fn, rep_ms=60).median_ms
    short = graph or events < GRAPH_BELOW_MS
    replayed = time_graph(fn, calls=20, replays=10).median_ms if short else None
    return events, replayed


def interleaved(
    variants: Mapping[str, Callable[[], object]], rounds: int, graph: bool = False
) -> dict[str, dict]:
    """Each variant's ``summary`` over ``rounds`` interleaved rounds. Once a variant's call was
    short, every later round replays it too (one noisy round must not drop it); with ``graph``
    every variant is replayed from the first round: like with like where the kernel under test
    is short (a compiled or eager baseline's host work would otherwise be what its events time)."""
    times: dict[str, list[tuple[float, float | None]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(timed(fn, graph=graph or any(g is not None for _, g in times[name])))
    return {name: summary(t) for name, t in times.items()}


def summary(times: list[tuple[float, float | None]]) -> dict:
    """Median and spread (min..max) of the rounds' event times; the graph median and spread
    when every round replayed."""
    ev = [t[0] for t in times]
    gr = [t[1] for t in times if t[1] is not None]
    replayed = len(gr) == len(times)
    return {
        "ms": statistics.median(ev),
        "spread": [min(ev), max(ev)],
        "graph_ms": statistics.median(gr) if replayed else None,
        "graph_spread": [min(gr), max(gr)] if replayed else None,
    }


def spread_text(entry: dict, graph: bool, digits: int = 4) -> str:
    """``[min-max]`` of the rounds timed by the method whose median is shown: replay where
    ``graph``, else events (never a replay median beside the events' spread); empty for a
    replay in a file saved before replay spreads were kept."""
    lo_hi = entry.get("graph_spread") if graph else entry["spread"]
    return f" [{lo_hi[0]:.{digits}f}-{lo_hi[1]:.{digits}f}]" if lo_hi else ""


def comparable_ms(entry: dict | None) -> float | None:
    """The comparable time: CUDA-graph replay where the call is short, else events."""
    if entry is None:
        return None
    return entry["graph_ms"] or entry["ms"]


def like_with_like(times: Mapping[str, dict]) -> tuple[bool, dict[str, float]]:
    """(replayed, each variant's time): CUDA-graph replay times where every variant has one,
    else every variant's events; never one method against the other."""
    graph = all(v["graph_ms"] is not None for v in times.values())
    return graph, {name: v["graph_ms"] if graph else v["ms"] for name, v in times.items()}


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else float("nan")


def only(text: str | None, count: int) -> list[int]:
    """0-based indices from an ``--only`` list such as ``1-5,9``: 1-based, as ``epilab tune
    --only`` reads it (``tuner.work.only``); all when empty."""
    if not text:
        return list(range(count))
    from epilab.tuner.work import only as picked

    return picked(text, count)


def suite_arguments(parser: argparse.ArgumentParser, default_suite: str) -> None:
    """--suite, --only, --rounds, --max-autotune, --json and --from-json."""
    parser.add_argument("--suite", default=default_suite)
    parser.add_argument("--only", help="1-based spec numbers, e.g. 1-5,9")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-autotune", action="store_true", help="also time Inductor max-autotune")
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")


def device_header(sm_count: int) -> str:
    return (
        f"{torch.cuda.get_device_name()} ({sm_count} SMs); torch {torch.__version__}, "
        f"triton {triton.__version__}, python {platform.python_version()}"
    )


def save(path: str | None, header: str, results: list[dict]) -> None:
    """The results so far (called after every problem: a run cut short keeps what it measured)."""
    if path:
        with open(path, "w") as f:
            json.dump({"device": header, "results": results}, f, indent=1)


def print_saved(path: str | None, table: Callable[[list[dict]], str]) -> bool:
    """``--from-json``: print the table of an earlier run; False when there is none to print."""
    if not path:
        return False
    with open(path) as f:
        print(table(json.load(f)["results"]))
    return True


def run_meta(interpret: bool = False) -> dict:
    """Where a run was made, as every benchmark's JSON records it: the GPU (or the
    interpreter), its SMs and capability, and the versions of python, torch, CUDA, triton
    and epilab."""
    import epilab

    meta: dict = {"gpu": "interpreter (not GPU times)"}
    if not interpret and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta = {"gpu": props.name, "sm_count": props.multi_processor_count}
        meta["capability"] = f"{props.major}.{props.minor}"
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__}
    return meta | versions | {"python": platform.python_version(), "epilab": epilab.__version__}
