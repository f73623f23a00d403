"""Offline `epilab tune --shapes` records serving `torch.compile` (issue 18's example).

    python benchmarks/offline_to_compile.py --db offline.db [--m 2048 --trials 8 --seconds 8]

Five transformer projections are written as a user writes them in a shapes file
(``gelu_tanh(acc + bias[n])``, ``acc + residual``, ...) and tuned with `epilab tune
--shapes`; then the same math as PyTorch functions (``F.gelu(x @ w.t() + b,
approximate="tanh")``, ``x @ w.t() + r``, ...) is compiled with the epilab backend over that
database. The table: each function's decision (template or aten, and where its config came
from: an exact record, a record of the same math, a transfer) and its time against
Inductor's (CUDA events, L2 flushed, median; `tuner.timing.time_cuda`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from rounds import run_meta

import epilab
from epilab.tuner.timing import time_cuda

D, FF = 4096, 14336


def functions(m: int) -> dict[str, tuple[tuple[int, int], object]]:
    """epilogue text -> ((N, K), the function of x)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * scale

    w_up, b_up = rand(FF, D, scale=D**-0.5), rand(FF)
    w_down, r = rand(D, FF, scale=FF**-0.5), rand(m, D)
    w_o, b_o = rand(D, D, scale=D**-0.5), rand(D)
    return {
        "gelu_tanh(acc + bias[n])": ((FF, D), lambda x: F.gelu(x @ w_up.t() + b_up, approximate="tanh")),
        "silu(acc)": ((FF, D), lambda x: F.silu(x @ w_up.t())),
        "acc + residual": ((D, FF), lambda x: x @ w_down.t() + r),
        "acc + bias[n] + residual": ((D, D), lambda x: x @ w_o.t() + b_o + r),
        "relu(acc + bias[n])": ((D, D), lambda x: F.relu(x @ w_o.t() + b_o)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--m", type=int, default=2048)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    fns = functions(args.m)
    shapes = [{"m": args.m, "n": n, "k": k, "epilogue": text} for text, ((n, k), _) in fns.items()]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(shapes, f)
    tune = [sys.executable, "-m", "epilab.cli", "tune", "--shapes", f.name, "--db", args.db]
    tune += [
        "--trials",
        str(args.trials),
        "--time-budget",
        str(args.seconds),
        "--baselines",
        "cublas,inductor",
    ]
    subprocess.run(tune, check=True)
    rows = []
    for text, ((n, k), fn) in fns.items():
        x = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
        torch._dynamo.reset()
        epilab.explain(clear=True)
        ours = torch.compile(fn, backend="epilab", options={"db": args.db, "policy": "auto"})
        with torch.no_grad():
            torch.testing.assert_close(ours(x), fn(x), rtol=3e-2, atol=3e-2)
        (d,) = epilab.explain(clear=True)
        theirs = torch.compile(fn)
        with torch.no_grad():
            t_ours = time_cuda(lambda ours=ours, x=x: ours(x)).median_ms
            t_ind = time_cuda(lambda theirs=theirs, x=x: theirs(x)).median_ms
        rows.append(
            {
                "epilogue": text,
                "shape": f"{args.m}x{n}x{k}",
                "template": d.template,
                "source": d.source,
                "reason": d.reason,
                "epilab_ms": t_ours,
                "inductor_ms": t_ind,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**run_meta(), "rows": rows}, out, indent=1)
    print("| function (shapes file) | M x N x K | decision | source | epilab ms | Inductor ms | speedup |")
    print("|---|---|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['epilogue']} | {r['shape']} | {r['template'] or 'aten'} | {r['source'] or '-'} | "
            f"{r['epilab_ms']:.4f} | {r['inductor_ms']:.4f} | {r['inductor_ms'] / r['epilab_ms']:.3f}x |"
        )


if __name__ == "__main__":
    main()
