"""The error of exact fp8 accumulation by promotion interval, against float64 and cuBLASLt.

    python3 benchmarks/fp8_promotion.py [--m 2048] [--n 2048] [--k 1024,4096,16384] [--json out.json]

Hopper's fp8 tensor cores keep a narrower sum than fp32 over the K elements they add in one
accumulator. Exact accumulation (``use_fast_accum=False``, precision "ieee") adds that sum to
an fp32 accumulator every PROMOTE x BLOCK_K elements of K; fast accumulation never does. For
each interval the matmul template (tma loop, 64x64 tiles; fp32 output, no scales, so that
nothing but the accumulation rounds) multiplies e4m3 inputs drawn from N(0, 1) ("signed") and
from |N(0, 1)| ("same-sign": every product positive, the sums grow with K, the worst case) and
the error ``||out - ref|| / ||ref||`` against the float64 product of the same fp8 values is
printed, with torch._scaled_mm's (cuBLASLt) fast and exact modes in the same run. The
template's bound (``matmul.EXACT_PROMOTION_MAX_K``) comes from this table.
"""

from __future__ import annotations

import argparse
import json

import torch
from rounds import device_header

from epilab.ir.check import rel_error
from epilab.ir.epilogue import Epilogue, acc
from epilab.ir.problem import Config
from epilab.templates.kinds import bind
from epilab.templates.matmul import make_problem
from epilab.templates.runtime import sm_count

INTERVALS = {  # elements of K a promotion: (BLOCK_K, PROMOTE)
    32: (32, 1),
    64: (64, 1),
    128: (128, 1),
    256: (128, 2),
    512: (128, 4),
}


def errors(m: int, n: int, k: int, same_sign: bool) -> dict[str, float]:
    gen = torch.Generator(device="cuda").manual_seed(k)
    x, y = (torch.randn(r, k, device="cuda", generator=gen) for r in (m, n))
    x, y = (t.abs() if same_sign else t for t in (x, y))
    a, b = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn).t()
    ref = a.double() @ b.double()
    ep = Epilogue.build([(acc(), "float32")])
    out: dict[str, float] = {}
    for precision in ("ieee", "fast"):
        problem = make_problem(a, b, ep, {}, precision=precision)
        for interval, (block_k, promote) in INTERVALS.items():
            if precision == "fast" and interval != 128:
                continue
            config = Config(64, 64, block_k, 8, num_warps=4, num_stages=1, variant="tma", PROMOTE=promote)
            bound = bind(problem, config, a, b, {})
            bound.run()
            out[str(interval) if precision == "ieee" else "whole K (fast)"] = rel_error(bound.outs[0], ref)
    one = torch.ones((), device="cuda")
    for fast in (False, True):
        c = torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=fast)
        out[f"cuBLASLt {'fast' if fast else 'exact'}"] = rel_error(c, ref)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=2048)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--k", default="1024,4096,16384", help="comma-separated K values")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    header = device_header(sm_count(torch.device("cuda")))
    rows = []
    for same_sign in (False, True):
        for k in (int(v) for v in args.k.split(",")):
            data = "same-sign" if same_sign else "signed"
            rows.append({"data": data, "k": k, **errors(args.m, args.n, k, same_sign)})
    print(f"{header}\nM = {args.m}, N = {args.n}; ||out - ref|| / ||ref|| against float64, fp32 outputs\n")
    names = [c for c in rows[0] if c not in ("data", "k")]
    print("| data | K | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for r in rows:
        print(f"| {r['data']} | {r['k']} | " + " | ".join(f"{r[c]:.2e}" for c in names) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": header, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
