"""The tuned gemv suite against the memory floor and cuBLAS, from a tuning database.

    epilab tune --suite gemv --db gemv.db --baselines cublas
    python benchmarks/gemv_report.py --db gemv.db [--json out.json]

For each problem of the ``gemv`` suite: the best tuned kernel time, bytes moved
once (weights + activations + output), achieved GB/s, % of the device copy
bandwidth measured by this script (read + write of a 1 GiB buffer, median of 20;
``--copy-gbs`` re-renders a report with the value measured in an earlier run), the
bandwidth of a copy of the problem's own size timed like ``graph_ms`` (what launch
ramp and tail leave of the peak at that size; only when measuring), and the cuBLAS
(+ eager epilogue) and Inductor baselines measured the same way as the kernel.

Which time: these kernels take 10-50 us, where one call at a time (CUDA events,
L2 flushed, as ``epilab tune`` records ``median_ms``) includes launch gaps. For
kernels under 50 us the tuner also records ``graph_ms``: the per-call time of a
CUDA graph that rotates over input sets three times the size of L2 together, so
the weights stream from DRAM on every call without launch gaps. The kernel's
GB/s use that time where recorded (the "time" column says which). Speedups compare
like with like: graph times when both sides have one, else both flushed times (a
cuBLAS + eager epilogue pipeline over 50 us has no graph time), marked "(flushed)".
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from rounds import run_meta

from epilab.db import DeviceInfo, TuningDB, comparable_ms
from epilab.policy.suites import SUITES
from epilab.tuner.evaluate import input_set_count
from epilab.tuner.timing import time_cuda, time_graph
from epilab.tuner.tune import problem_bytes


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), min_reps=20).median_ms
    return 2 * src.numel() / (ms * 1e6)


def copy_gbs_at(nbytes: int) -> float:
    """Bandwidth of an elementwise copy kernel (bf16 ``x * 1``, read + write) that moves
    ``nbytes``, timed the way ``graph_ms`` is: a CUDA graph rotating over buffers that
    together outgrow L2. What a kernel streaming this many bytes can hope for, launch
    ramp and tail included. (A graph of ``copy_`` is a memcpy node: not a kernel.)"""
    device = torch.device("cuda", 0)
    half = max(nbytes // 4, 1)  # bf16 elements per buffer: half the bytes read, half written
    sets = input_set_count(nbytes, device)
    pairs = [
        (
            torch.ones(half, dtype=torch.bfloat16, device=device),
            torch.empty(half, dtype=torch.bfloat16, device=device),
        )
        for _ in range(sets)
    ]
    fns = [lambda s=s, d=d: torch.mul(s, 1, out=d) for s, d in pairs]
    ms = time_graph(fns, calls=max(4, 64 // sets)).median_ms
    return 4 * half / (ms * 1e6)


def kernel_ms(record: object) -> float:
    """The rotating CUDA-graph time where recorded, else the flushed per-call median."""
    graph = getattr(record, "graph_ms", None)
    return graph if graph else record.median_ms  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--suite", default="gemv", choices=("gemv", "gemv-fused"))
    parser.add_argument("--json")
    parser.add_argument("--device", help="device name in the db (default: CUDA device 0)")
    parser.add_argument(
        "--copy-gbs", type=float, help="copy bandwidth measured earlier (default: measure now)"
    )
    args = parser.parse_args()
    device = DeviceInfo.of_cuda(0) if args.device is None else None
    measure = args.copy_gbs is None
    copy = args.copy_gbs or copy_bandwidth_gbs()
    at_size: dict[int, float] = {}

    def copy_at(nbytes: int) -> float:
        if nbytes >> 20 not in at_size:
            at_size[nbytes >> 20] = copy_gbs_at(nbytes)
        return at_size[nbytes >> 20]

    rows = []
    with TuningDB.open(args.db) as db:

        def here(r: object) -> bool:
            d = r.device  # type: ignore[attr-defined]
            return d == device if device is not None else d.name == args.device

        for spec in SUITES[args.suite]:
            problem = spec.problem()
            nbytes = problem_bytes(problem)
            ok = [x for x in db.records(problem.key) if x.status == "ok" and here(x)]
            if not ok:
                continue
            r = min(ok, key=lambda x: kernel_ms(x))
            found = {b.library: b for b in db.baselines(problem.key) if here(b) and b.median_ms}
            ms = kernel_ms(r)
            # Speedups compare like with like: graph times only when both sides have one
            # (a baseline over 50 us has only its flushed time, and so is the kernel then)
            cub, ind = found.get("cublas"), found.get("inductor")
            base = comparable_ms(cub, r) if cub else None
            inductor = comparable_ms(ind, r) if ind else None
            rows.append(
                {
                    "label": spec.label(),
                    "ms": ms,
                    "time": "graph" if r.graph_ms else "flushed",
                    "config": r.config,
                    "mbytes": nbytes / 1e6,
                    "gbs": nbytes / (ms * 1e6),
                    "pct_copy": 100 * nbytes / (ms * 1e6) / copy,
                    "size_copy_gbs": copy_at(nbytes) if measure else None,
                    "cublas_ms": base,
                    "speedup": base / comparable_ms(r, cub) if cub else None,
                    "speedup_by": "graph" if cub and cub.graph_ms and r.graph_ms else "flushed",
                    "inductor_ms": inductor,
                    "vs_inductor": inductor / comparable_ms(r, ind) if ind else None,
                    "inductor_by": "graph" if ind and ind.graph_ms and r.graph_ms else "flushed",
                }
            )
    name = device.name if device is not None else args.device
    print(f"GPU: {name}; copy bandwidth: {copy:.0f} GB/s")
    print(
        "| problem | MB | time | tuned ms | GB/s | % of copy | copy at this size GB/s | cuBLAS+eager ms "
        "| speedup | Inductor ms | vs Inductor | config |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")

    def cell(v: float | None, fmt: str) -> str:
        return (format(v, fmt) + ("x" if fmt == ".2f" else "")) if v else "-"

    def by(r: dict, key: str) -> str:
        ratio = r["speedup" if key == "speedup_by" else "vs_inductor"]
        return " (flushed)" if ratio and r["time"] == "graph" and r[key] == "flushed" else ""

    for r in rows:
        c = r["config"]
        cfg = f"{c['BLOCK_N']}x{c['BLOCK_K']} s{c['SPLIT_K']} {c['variant']}"
        cfg += f" w{c['num_warps']} st{c['num_stages']}"
        print(
            f"| {r['label']} | {r['mbytes']:.1f} | {r['time']} | {r['ms']:.4f} | {r['gbs']:.0f} | "
            f"{r['pct_copy']:.0f}% | {cell(r['size_copy_gbs'], '.0f')} | "
            f"{cell(r['cublas_ms'], '.4f')} | {cell(r['speedup'], '.2f')}{by(r, 'speedup_by')} | "
            f"{cell(r['inductor_ms'], '.4f')} | {cell(r['vs_inductor'], '.2f')}{by(r, 'inductor_by')} | "
            f"{cfg} |"
        )
    for key, name in (("speedup", "cuBLAS+eager"), ("vs_inductor", "Inductor")):
        speedups = [r[key] for r in rows if r[key]]
        if speedups:
            geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
            print(f"\ngeomean speedup over {name}: {geo:.2f}x over {len(speedups)} problems")
    big = [r for r in rows if r["mbytes"] >= 32]
    if big:
        print(
            f"problems moving >= 32 MB: {sum(r['pct_copy'] >= 85 for r in big)}/{len(big)} "
            "at >= 85% of copy bandwidth"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run_meta(), "copy_gbs": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
