"""The tuned gemv suite against the memory floor and cuBLAS, from a tuning database.

    epilab tune --suite gemv --db gemv.db --baselines cublas
    python benchmarks/gemv_report.py --db gemv.db [--json out.json]

For each problem of the ``gemv`` suite: the best tuned time (CUDA events, L2
flushed, median, as ``epilab tune`` measured it; CUDA-graph time beside it when
recorded), bytes moved once (weights + activations + output), achieved GB/s, %
of the device copy bandwidth measured now by this script (read + write of a
1 GiB buffer, median of 20), and the cuBLAS (+ eager epilogue) baseline.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from epilab.db import DeviceInfo, TuningDB
from epilab.tuner.suites import SUITES
from epilab.tuner.timing import time_cuda
from epilab.tuner.tune import problem_bytes


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), min_reps=20).median_ms
    return 2 * src.numel() / (ms * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = DeviceInfo.of_cuda(0)
    copy = copy_bandwidth_gbs()
    rows = []
    with TuningDB.open(args.db) as db:
        for spec in SUITES["gemv"]:
            problem = spec.problem()
            hit = db.best(problem.key, device)
            bases = {b.library: b for b in db.baselines(problem.key, device)}
            if hit is None:
                continue
            r = hit.record
            nbytes = problem_bytes(problem)
            cublas = bases.get("cublas")
            rows.append(
                {
                    "label": spec.label(),
                    "ms": r.median_ms,
                    "graph_ms": r.graph_ms,
                    "config": r.config,
                    "mbytes": nbytes / 1e6,
                    "gbs": nbytes / (r.median_ms * 1e6),
                    "pct_copy": 100 * nbytes / (r.median_ms * 1e6) / copy,
                    "cublas_ms": cublas.median_ms if cublas else None,
                    "speedup": cublas.median_ms / r.median_ms if cublas and cublas.median_ms else None,
                }
            )
    print(f"GPU: {device.name}; copy bandwidth measured now: {copy:.0f} GB/s")
    print("| problem | MB | tuned ms (graph) | GB/s | % of copy | cuBLAS+eager ms | speedup | config |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        c = r["config"]
        cfg = f"{c['BLOCK_N']}x{c['BLOCK_K']} s{c['SPLIT_K']} {c['variant']}"
        cfg += f" w{c['num_warps']} st{c['num_stages']}"
        graph = f" ({r['graph_ms']:.4f})" if r["graph_ms"] else ""
        cub = f"{r['cublas_ms']:.4f}" if r["cublas_ms"] else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(
            f"| {r['label']} | {r['mbytes']:.1f} | {r['ms']:.4f}{graph} | {r['gbs']:.0f} | "
            f"{r['pct_copy']:.0f}% | {cub} | {sp} | {cfg} |"
        )
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(f"\ngeomean speedup over cuBLAS+eager: {geo:.2f}x over {len(speedups)} problems")
    big = [r for r in rows if r["mbytes"] >= 32]
    if big:
        print(
            f"weights >= 32 MB: {sum(r['pct_copy'] >= 85 for r in big)}/{len(big)} "
            "at >= 85% of copy bandwidth"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"gpu": device.name, "copy_gbs": copy, "torch": torch.__version__, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
