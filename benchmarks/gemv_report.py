"""The tuned gemv suite against the memory floor and cuBLAS, from a tuning database.

    epilab tune --suite gemv --db gemv.db --baselines cublas
    python benchmarks/gemv_report.py --db gemv.db [--json out.json]

For each problem of the ``gemv`` suite: the best tuned kernel time, bytes moved
once (weights + activations + output), achieved GB/s, % of the device copy
bandwidth measured by this script (read + write of a 1 GiB buffer, median of 20;
``--copy-gbs`` re-renders a report with the value measured in an earlier run), and
the cuBLAS (+ eager epilogue) baseline measured the same way.

Which time: these kernels take 10-50 us, where one call at a time (CUDA events,
L2 flushed, as ``epilab tune`` records ``median_ms``) includes launch gaps. So
for problems that move more than the 60 MB of L2 (they stream from DRAM on
every replay) the CUDA-graph per-call time is used; smaller ones keep the
flushed per-call time (their graph replays would hit L2). The column says which.
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


L2_BYTES = 60e6  # H100/H200 L2 (50/60 MB): larger problems stream from DRAM in a graph replay


def kernel_ms(record: object, use_graph: bool) -> float:
    """The CUDA-graph time where it is meaningful and recorded, else the flushed per-call median."""
    graph = getattr(record, "graph_ms", None)
    return graph if use_graph and graph else record.median_ms  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--json")
    parser.add_argument("--device", help="device name in the db (default: CUDA device 0)")
    parser.add_argument(
        "--copy-gbs", type=float, help="copy bandwidth measured earlier (default: measure now)"
    )
    args = parser.parse_args()
    device = DeviceInfo.of_cuda(0) if args.device is None else None
    copy = args.copy_gbs or copy_bandwidth_gbs()
    rows = []
    with TuningDB.open(args.db) as db:

        def here(r: object) -> bool:
            d = r.device  # type: ignore[attr-defined]
            return d == device if device is not None else d.name == args.device

        for spec in SUITES["gemv"]:
            problem = spec.problem()
            nbytes = problem_bytes(problem)
            use_graph = nbytes > L2_BYTES
            ok = [x for x in db.records(problem.key) if x.status == "ok" and here(x)]
            if not ok:
                continue
            r = min(ok, key=lambda x: kernel_ms(x, use_graph))
            cublas = next((b for b in db.baselines(problem.key) if b.library == "cublas" and here(b)), None)
            ms = kernel_ms(r, use_graph)
            base = kernel_ms(cublas, use_graph) if cublas else None
            rows.append(
                {
                    "label": spec.label(),
                    "ms": ms,
                    "time": "graph" if use_graph and r.graph_ms else "flushed",
                    "config": r.config,
                    "mbytes": nbytes / 1e6,
                    "gbs": nbytes / (ms * 1e6),
                    "pct_copy": 100 * nbytes / (ms * 1e6) / copy,
                    "cublas_ms": base,
                    "speedup": base / ms if base else None,
                }
            )
    name = device.name if device is not None else args.device
    print(f"GPU: {name}; copy bandwidth: {copy:.0f} GB/s")
    print("| problem | MB | time | tuned ms | GB/s | % of copy | cuBLAS+eager ms | speedup | config |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        c = r["config"]
        cfg = f"{c['BLOCK_N']}x{c['BLOCK_K']} s{c['SPLIT_K']} {c['variant']}"
        cfg += f" w{c['num_warps']} st{c['num_stages']}"
        cub = f"{r['cublas_ms']:.4f}" if r["cublas_ms"] else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(
            f"| {r['label']} | {r['mbytes']:.1f} | {r['time']} | {r['ms']:.4f} | {r['gbs']:.0f} | "
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
            json.dump({"gpu": name, "copy_gbs": copy, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
