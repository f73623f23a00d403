"""The convolution alone: cuDNN (torch's conv2d, no epilogue) against the tuned conv2d
template (with its fused epilogue) for the 3x3 layers of the ``conv`` suite.

    python benchmarks/conv_alone.py --db conv.db [--json out.json]

cuDNN is timed exactly as the tuner times everything (``tuner.evaluate._measure``:
CUDA events with L2 flushed, and for kernels under 50 us a CUDA graph rotating over
input sets larger than L2); the template's time is its best record in the database,
compared like with like (graph times when both have one).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from rounds import run_meta

from epilab.db import DeviceInfo, TuningDB
from epilab.policy.suites import SUITES
from epilab.tuner.evaluate import _measure, make_inputs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    here = DeviceInfo.of_cuda(0)
    rows = []
    print("| layer | cuDNN conv alone ms | tuned template (+epilogue) ms | template / cuDNN speed |")
    print("|---|---:|---:|---:|")
    with TuningDB.open(args.db) as db:
        for spec in SUITES["conv"]:
            if spec.r != 3:
                continue
            problem = spec.problem()
            g = problem.geometry
            sets = [make_inputs(problem, device, seed) for seed in range(6)]

            runs = [
                lambda x=x, w=w, g=g: F.conv2d(x, w, None, g.stride, g.padding, g.dilation, g.groups)
                for x, w, _ in sets
            ]
            events, graph = _measure(runs[0], False, lambda runs=runs: runs[1:])
            ok = [r for r in db.records(problem.key) if r.status == "ok" and r.device == here and r.median_ms]
            if not ok:
                continue
            best = min(ok, key=lambda r: r.graph_ms or r.median_ms)
            both_graph = graph is not None and best.graph_ms is not None
            cudnn_ms = graph.median_ms if both_graph else events.median_ms
            ours = best.graph_ms if both_graph else best.median_ms
            rows.append(
                {"label": spec.label(), "cudnn_ms": cudnn_ms, "template_ms": ours, "ratio": cudnn_ms / ours}
            )
            print(f"| {spec.label()} | {cudnn_ms:.4f} | {ours:.4f} | {cudnn_ms / ours:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run_meta(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
