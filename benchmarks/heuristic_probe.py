"""Where does the untuned template beat cuBLAS + Inductor's fused epilogue?

    python benchmarks/heuristic_probe.py [--json out.json]

The backend's ``auto`` policy could use the heuristic config where no database
record exists, if some shape rule said where it wins. This script measures the
candidates: bf16, x @ W.T, epilogue
gelu_tanh(acc + bias) + residual (residual cases) or gelu_tanh(acc + bias).
Columns: epilab.matmul with the default heuristic config, and torch.compile
(Inductor default: cuBLAS addmm + one fused pointwise kernel) of the same
function; both checked against float64 first. Times: median per call of a
CUDA graph over rotating input sets larger than L2 (``tuner.timing.time_graph``).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

import epilab
from epilab.ir.check import rel_error
from epilab.tuner.timing import time_graph

CASES = [  # (M, N, K, residual)
    (8192, 4096, 64, True),
    (8192, 4096, 128, True),
    (16384, 1024, 128, True),
    (4096, 4096, 32, True),
    (8192, 4096, 128, False),
    (8192, 4096, 256, True),
    (8192, 4096, 512, True),
    (2048, 4096, 4096, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for m, n, k, residual in CASES:
        torch.manual_seed(0)
        sets = []
        per_set = 2 * (m * k + n * k + 2 * m * n)
        for _ in range(max(2, (256 << 20) // per_set)):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) if residual else None
            sets.append((a, w, bias, res))

        def eager(a, w, bias, res):
            y = F.gelu(F.linear(a, w, bias), approximate="tanh")
            return y + res if res is not None else y

        compiled = torch.compile(eager)

        def ours(a, w, bias, res):
            return epilab.matmul(a, w.t(), bias=bias, activation="gelu_tanh", residual=res)

        a, w, bias, res = sets[0]
        ref = eager(a.double(), w.double(), bias.double(), None if res is None else res.double())
        errs = {
            name: rel_error(fn(a, w, bias, res).float(), ref)
            for name, fn in (("epilab", ours), ("inductor", compiled))
        }
        t_ours = time_graph([lambda s=s: ours(*s) for s in sets]).median_ms
        t_ind = time_graph([lambda s=s, c=compiled: c(*s) for s in sets]).median_ms
        row = {
            "m": m,
            "n": n,
            "k": k,
            "residual": residual,
            "epilab_ms": t_ours,
            "inductor_ms": t_ind,
            "speedup": t_ind / t_ours,
            "errors": errs,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "triton": triton.__version__,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    print("| M | N | K | residual | epilab heuristic ms | inductor ms | speedup |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['m']} | {r['n']} | {r['k']} | {r['residual']} | {r['epilab_ms']:.4f} | "
            f"{r['inductor_ms']:.4f} | {r['speedup']:.2f}x |"
        )


if __name__ == "__main__":
    main()
