"""The matmul template's main loops on Hopper: classic, tma, persistent, tma_persistent.

    python3 benchmarks/matmul_hopper.py [--suites square,llm] [--min-m 2048] [--json out.json]

For each problem (the ``square`` suite: pure GEMM; ``llm``: the fused projections, M >=
``--min-m``) and each variant, a fixed sweep of configs (``SWEEP``) is checked against the
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

import torch

from epilab.templates.problem import Config
from epilab.tuner.evaluate import evaluate_baseline, evaluate_candidate
from epilab.tuner.suites import SUITES

VARIANTS = ("default", "tma", "persistent", "tma_persistent")
SWEEP = [  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages: the known-good tiles of the tuner
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
    (128, 128, 64, 8, 4, 4),
    (128, 128, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (64, 128, 64, 8, 4, 4),
]


def ms_of(result: dict, other: dict | None = None) -> float | None:
    """A result's time, like with like: graph time when both have one, else the events median."""
    if result.get("status") != "ok":
        return None
    if result.get("graph_ms") is not None and (other is None or other.get("graph_ms") is not None):
        return result["graph_ms"]
    return result["median_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suites", default="square,llm")
    parser.add_argument("--min-m", type=int, default=2048, help="llm problems with at least this M")
    parser.add_argument("--only", default="", help="problems whose label contains this text")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-max-autotune", action="store_true", help="skip Inductor max-autotune (slow)")
    parser.add_argument("--json")
    args = parser.parse_args()
    variants = tuple(args.variants.split(","))
    specs = []
    for name in args.suites.split(","):
        specs += [s for s in SUITES[name] if (name != "llm" or s.m >= args.min_m) and args.only in s.label()]
    print(
        "| problem | "
        + " | ".join(f"{v} ms (TFLOP/s)" for v in variants)
        + " | cuBLAS mm alone | cuBLAS+eager | max-autotune | best variant | best vs cuBLAS alone"
        " | vs max-autotune |"
    )
    print("|---|" + "---:|" * len(variants) + "---:|---:|---:|---|---:|---:|")
    rows = []
    for spec in specs:
        problem = spec.problem()
        text = problem.to_json()
        alone = dataclasses.replace(spec, epilogue="none").problem().to_json()
        base = {
            "cublas_alone": evaluate_baseline(alone, "cublas", 0),
            "cublas_eager": evaluate_baseline(text, "cublas", 0),
            "max_autotune": {"status": "skipped"}
            if args.no_max_autotune
            else evaluate_baseline(text, "inductor-max-autotune", 0),
        }
        row: dict = {"label": spec.label(), "flops": spec.flops(), "variants": {}}
        for variant in variants:
            best, failed = None, 0
            for bm, bn, bk, g, w, st in SWEEP:
                config = Config(bm, bn, bk, g, num_warps=w, num_stages=st, variant=variant)
                result = evaluate_candidate(text, config.to_dict(), 0)
                if result["status"] != "ok":
                    failed += 1
                    continue
                if best is None or ms_of(result) < ms_of(best[1]):
                    best = (config.short(), result)
            row["variants"][variant] = {
                "config": best[0] if best else None,
                "result": best[1] if best else None,
                "failed": failed,
            }
        row["baselines"] = base
        rows.append(row)
        cells = []
        for variant in variants:
            got = row["variants"][variant]["result"]
            ms = ms_of(got, base["cublas_alone"]) if got else None
            cells.append("-" if ms is None else f"{ms:.4f} ({spec.flops() / (ms * 1e9):.0f})")
        winner = min(
            (v for v in variants if row["variants"][v]["result"]),
            key=lambda v: ms_of(row["variants"][v]["result"], base["cublas_alone"]),
            default=None,
        )
        ref = {k: ms_of(v, row["variants"][winner]["result"] if winner else None) for k, v in base.items()}
        best_ms = ms_of(row["variants"][winner]["result"], base["cublas_alone"]) if winner else None
        frac = f"{ref['cublas_alone'] / best_ms:.2f}x" if best_ms and ref["cublas_alone"] else "-"
        vs_mx = f"{ref['max_autotune'] / best_ms:.2f}x" if best_ms and ref["max_autotune"] else "-"
        print(
            f"| {spec.label()} | " + " | ".join(cells) + f" | {ref['cublas_alone'] or 0:.4f} | "
            f"{ref['cublas_eager'] or 0:.4f} | {ref['max_autotune'] or 0:.4f} | {winner} | {frac} "
            f"| {vs_mx} |",
            flush=True,
        )
    fused = [r for r in rows if "none" not in r["label"]]
    if fused:
        ratios = []
        for r in fused:
            results = [v["result"] for v in r["variants"].values() if v["result"]]
            mx = r["baselines"]["max_autotune"]
            if results and mx.get("status") == "ok":
                ratios.append(max(ms_of(mx, x) / ms_of(x, mx) for x in results))  # the best variant
        if ratios:
            print(
                "\nfused: geomean vs Inductor max-autotune "
                f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
