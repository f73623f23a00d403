"""The matmul template's main loops on Hopper: classic, tma, persistent, tma_persistent.

    python3 benchmarks/matmul_hopper.py [--suites square,llm] [--min-m 2048] [--json out.json]

For each problem (the ``square`` suite: pure GEMM; ``llm``: the fused projections, M >=
``--min-m``) and each variant, a fixed sweep of configs (``SWEEP``: the tuner's known-good
tiles, with the epilogue subtiled, the persistent loop's knobs and TMA stores) is checked against the
float64 reference and timed by the tuner's own worker code (``tuner.evaluate``: CUDA events
with L2 flushed, CUDA graphs over rotating inputs under 50 us); the best per variant is
reported with cuBLAS on the matmul alone (the same shape, no epilogue), cuBLAS + eager
epilogue and Inductor max-autotune (no CUDA graphs), TFLOP/s, and the best variant's speed
as a fraction of cuBLAS's matmul alone. Configs that fail to compile or run are counted, not
timed. Everything is compared like with like (``db.comparable_ms`` rules on plain dicts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from functools import partial

from rounds import run_meta

from epilab.ir.config import Config
from epilab.policy.suites import SUITES
from epilab.templates.gemm.matmul_config import TRITON_VARIANTS as VARIANTS
from epilab.tuner.evaluate import evaluate_baseline, evaluate_candidate

_WIDE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8}
_SQUARE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}
_TALL = {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8}
_CLASSIC = [  # the known-good tiles of the tuner, and the wide one with a sliced epilogue
    {**_WIDE, "num_stages": 3},
    {**_WIDE, "num_stages": 4},
    {**_WIDE, "num_stages": 3, "EPILOGUE_SUBTILE": 2},
    {**_SQUARE, "num_warps": 4, "num_stages": 4},
    {**_TALL, "num_stages": 3},
]
_PERSISTENT = [  # the same tiles with the persistent loop's knobs (flatten wins for wide tiles)
    {**_WIDE, "num_stages": 3, "FLATTEN": 1},
    {**_WIDE, "num_stages": 3, "FLATTEN": 1, "WARP_SPECIALIZE": 1},
    {**_WIDE, "num_stages": 3, "FLATTEN": 1, "EPILOGUE_SUBTILE": 2},
    {**_WIDE, "num_stages": 4, "FLATTEN": 1},
    {**_SQUARE, "num_warps": 8, "num_stages": 4},
    {**_SQUARE, "num_warps": 4, "num_stages": 3, "PROGRAMS_PER_SM": 2},
    {**_TALL, "num_stages": 3, "FLATTEN": 1},
]
_TMA_STORE = [  # outputs through tensor descriptors too
    {**_WIDE, "num_stages": 3, "EPILOGUE_SUBTILE": 2, "TMA_STORE": 1},
    {**_WIDE, "num_stages": 4, "TMA_STORE": 1},
]
_TMA_PERSISTENT_STORE = [{**knobs, "FLATTEN": 1} for knobs in _TMA_STORE]
SWEEP = {
    "default": _CLASSIC,
    "tma": _CLASSIC + _TMA_STORE,
    "persistent": _PERSISTENT,
    "tma_persistent": _PERSISTENT + _TMA_PERSISTENT_STORE,
}


def ms_of(result: dict, other: dict | None = None) -> float | None:
    """A result's time, like with like: graph time when both have one, else the events median."""
    if result.get("status") != "ok":
        return None
    if result.get("graph_ms") is not None and (other is None or other.get("graph_ms") is not None):
        return result["graph_ms"]
    return result["median_ms"]


def sweep(text: str, variant: str) -> tuple[Config | None, int]:
    """The fastest config of ``variant``'s sweep (one measurement each), and how many failed."""
    best, best_ms, failed = None, None, 0
    for knobs in SWEEP[variant]:
        config = Config(**knobs, variant=variant)
        result = evaluate_candidate(text, config.to_dict(), 0)
        if result["status"] != "ok":
            failed += 1
        elif best_ms is None or ms_of(result) < best_ms:
            best, best_ms = config, ms_of(result)
    return best, failed


def median_result(results: list[dict]) -> dict:
    """The rounds of one contender merged: medians of its events and graph times."""
    ok = [r for r in results if r.get("status") == "ok"]
    if not ok:
        return results[0]
    graphs = [r["graph_ms"] for r in ok if r.get("graph_ms") is not None]
    return {
        "status": "ok",
        "median_ms": statistics.median(r["median_ms"] for r in ok),
        "graph_ms": statistics.median(graphs) if len(graphs) == len(ok) else None,
        "rounds": [ms_of(r) for r in ok],
    }


def contest(jobs: dict[str, Callable[[], dict]], rounds: int) -> dict[str, dict]:
    """Every contender timed once per round, in turn (a GPU that warms up or throttles over a
    run then affects them all alike); the median over the rounds."""
    results: dict[str, list[dict]] = {name: [] for name in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            results[name].append(job())
    return {name: median_result(r) for name, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suites", default="square,llm")
    parser.add_argument("--min-m", type=int, default=2048, help="llm problems with at least this M")
    parser.add_argument("--only", default="", help="problems whose label contains this text")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds of the finalists")
    parser.add_argument("--no-max-autotune", action="store_true", help="skip Inductor max-autotune (slow)")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--from-json", help="print the tables of an earlier run's --json, measure nothing")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print(f"GPU: {saved['gpu']}; torch {saved['torch']}, triton {saved['triton']}, CUDA {saved['cuda']}")
        variants = tuple(saved["rows"][0]["variants"])
        print(table_header(variants))
        for row in saved["rows"]:
            print(table_row(row["flops"], row, variants))
        print(summary(saved["rows"]))
        return
    variants = tuple(args.variants.split(","))
    baselines = ("cublas_alone", "cublas_eager") + (() if args.no_max_autotune else ("max_autotune",))
    specs = []
    for name in args.suites.split(","):
        specs += [s for s in SUITES[name] if (name != "llm" or s.m >= args.min_m) and args.only in s.label()]
    print(table_header(variants))
    rows = []
    for spec in specs:
        text = spec.problem().to_json()
        alone = dataclasses.replace(spec, epilogue="none").problem().to_json()
        picked = {variant: sweep(text, variant) for variant in variants}
        jobs: dict[str, Callable[[], dict]] = {
            "cublas_alone": partial(evaluate_baseline, alone, "cublas", 0),
            "cublas_eager": partial(evaluate_baseline, text, "cublas", 0),
            "max_autotune": partial(evaluate_baseline, text, "inductor-max-autotune", 0),
        }
        jobs = {name: jobs[name] for name in baselines}
        for variant, (config, _) in picked.items():
            if config is not None:
                jobs[variant] = partial(evaluate_candidate, text, config.to_dict(), 0)
        timed = contest(jobs, args.rounds)
        row = {
            "label": spec.label(),
            "flops": spec.flops(),
            "variants": {
                v: {
                    "config": c.to_dict() if c else None,
                    "short": c.short() if c else None,
                    "result": timed.get(v),
                    "failed": failed,
                }
                for v, (c, failed) in picked.items()
            },
            "baselines": {name: timed[name] for name in baselines},
        }
        rows.append(row)
        print(table_row(spec.flops(), row, variants), flush=True)
    print(summary(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run_meta(), "rows": rows}, f, indent=1)


def table_header(variants: tuple[str, ...]) -> str:
    return (
        "| problem | "
        + " | ".join(f"{v} ms (TFLOP/s)" for v in variants)
        + " | cuBLAS mm alone | cuBLAS+eager | max-autotune | best variant | best vs cuBLAS alone"
        " | vs max-autotune |\n" + "|---|" + "---:|" * len(variants) + "---:|---:|---:|---|---:|---:|"
    )


def _large(row: dict) -> bool:
    """M, N and K all >= 2048 (the issue's range for the cuBLAS target)."""
    return all(int(d) >= 2048 for d in row["label"].split()[0].split("x"))


def _winner(row: dict) -> str | None:
    alone = row["baselines"]["cublas_alone"]
    contenders = [v for v, x in row["variants"].items() if x["result"] and x["result"].get("status") == "ok"]
    return min(contenders, key=lambda v: ms_of(row["variants"][v]["result"], alone), default=None)


def table_row(flops: int, row: dict, variants: tuple[str, ...]) -> str:
    base = row["baselines"]
    cells = []
    for variant in variants:
        got = row["variants"][variant]["result"]
        ms = ms_of(got, base["cublas_alone"]) if got else None
        cells.append("-" if ms is None else f"{ms:.4f} ({flops / (ms * 1e9):.0f})")
    winner = _winner(row)
    best = row["variants"][winner]["result"] if winner else None
    ref = {k: (ms_of(v, best) if best else None) for k, v in base.items()}
    best_ms = {k: ms_of(best, v) for k, v in base.items()} if best else {}

    def ratio(name: str) -> str:
        return f"{ref[name] / best_ms[name]:.2f}x" if best and ref.get(name) else "-"

    def ms(name: str) -> str:
        return f"{ref[name]:.4f}" if ref.get(name) else "-"

    return (
        f"| {row['label']} | " + " | ".join(cells) + f" | {ms('cublas_alone')} | {ms('cublas_eager')} | "
        f"{ms('max_autotune')} | {winner} | {ratio('cublas_alone')} | {ratio('max_autotune')} |"
    )


def summary(rows: list[dict]) -> str:
    """Geomeans of the best variant over cuBLAS alone (pure GEMMs) and max-autotune (fused)."""

    def geomean(xs: list[float]) -> str:
        return (
            f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x (min {min(xs):.3f}x, n={len(xs)})"
            if xs
            else "-"
        )

    lines = []
    for what, base, keep in (
        ("pure GEMM: best variant vs cuBLAS mm alone", "cublas_alone", lambda r: "none" in r["label"]),
        (
            "pure GEMM, M, N, K >= 2048: best variant vs cuBLAS mm alone",
            "cublas_alone",
            lambda r: "none" in r["label"] and _large(r),
        ),
        (
            "fused: best variant vs cuBLAS + eager epilogue",
            "cublas_eager",
            lambda r: "none" not in r["label"],
        ),
        ("fused: best variant vs Inductor max-autotune", "max_autotune", lambda r: "none" not in r["label"]),
    ):
        ratios = []
        for r in filter(keep, rows):
            winner, other = _winner(r), r["baselines"].get(base)
            if winner and other and other.get("status") == "ok":
                best = r["variants"][winner]["result"]
                ratios.append(ms_of(other, best) / ms_of(best, other))
        lines.append(f"{what}: {geomean(ratios)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
