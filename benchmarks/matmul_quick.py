"""Quick matmul benchmark: epilab (untuned default config) against cuBLAS and Inductor.

    python benchmarks/matmul_quick.py [--json out.json] [--probe]

Problem: C = gelu_tanh(A @ B + bias) + residual, bf16, for a few (M, N, K).
Columns:
- epilab: one fused kernel, config from the default heuristic (no tuning);
- mm: torch.mm alone (cuBLAS), the floor of any unfused version;
- eager: torch addmm + gelu + add, as eager PyTorch runs it (3 kernels);
- inductor: torch.compile of that function (cuBLAS addmm + one fused Triton kernel).

Method: floors from FLOPs and bytes against ceilings measured in the
same run (a 2 GiB device copy, an 8192^3 bf16 cuBLAS matmul); every version is
checked against a float64 reference before it is timed; random inputs; times are
medians of CUDA-event timings after warm-up, two ways: (1) per-call time of
CUDA-graph replay over rotating input sets larger than L2 (kernel time without
launch gaps); (2) one call at a time from Python with L2 flushed before each
(``tuner/timing.py``'s ``time_cuda``, as the tuner times: p20-p80 in the JSON; runs before
2026-11-25 used ``triton.testing.do_bench``, the same events-and-flush method), which includes
launch cost.
``--probe`` also times a few other configs of the epilab kernel, to judge the
default heuristic.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rounds import run_meta

import epilab
from epilab.api.matmul import simple_epilogue
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_reference import reference
from epilab.templates.registry import default_config, launch
from epilab.tuner.timing import time_cuda, time_graph

SHAPES = [(4096, 4096, 4096), (8192, 14336, 4096), (2048, 4096, 4096), (128, 4096, 4096)]
PROBE = [
    Config(128, 256, 64, 8, num_warps=8, num_stages=3),
    Config(128, 256, 64, 8, num_warps=8, num_stages=4),
    Config(256, 128, 64, 8, num_warps=8, num_stages=3),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4),
    Config(64, 64, 64, 8, num_warps=4, num_stages=4),
    Config(32, 64, 64, 8, num_warps=4, num_stages=4),
    Config(32, 64, 128, 8, num_warps=4, num_stages=4),
]


def bench(fn: Callable[[], object]) -> dict[str, float]:
    """Median and p20/p80 ms per call, L2 flushed before every call."""
    t = time_cuda(fn, warmup_ms=50, rep_ms=300)
    return {"ms": t.median_ms, "p20": t.p20_ms, "p80": t.p80_ms}


def bench_graph(fns: list[Callable[[], object]]) -> float:
    """Median per-call ms of CUDA-graph replay cycling through ``fns`` (rotating inputs)."""
    return time_graph(fns, calls=20, replays=30).median_ms


def ceilings() -> dict[str, float]:
    """Measured copy bandwidth (GB/s, read + write) and bf16 cuBLAS rate (TFLOP/s)."""
    src = torch.randn(2**28, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))["ms"]
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mm_ms = bench(lambda: torch.mm(a, b))["ms"]
    return {"copy_GBps": 2 * src.numel() * 4 / copy_ms / 1e6, "bf16_mm_TFLOPs": 2 * n**3 / mm_ms / 1e9}


def run_shape(m: int, n: int, k: int, ceil: dict[str, float], probe: bool) -> dict[str, object]:
    dt = torch.bfloat16
    flops = 2 * m * n * k
    bytes_moved = 2 * (m * k + k * n + n + 2 * m * n)  # A, B, bias, residual read; C written
    floor_ms = max(flops / (ceil["bf16_mm_TFLOPs"] * 1e9), bytes_moved / (ceil["copy_GBps"] * 1e6))
    # enough input sets to exceed L2 several times over when rotating through them
    sets = max(2, min(8, int(3 * 60e6 // bytes_moved) + 1))
    inputs = []
    for i in range(sets):
        g = torch.Generator(device="cuda").manual_seed(i)
        inputs.append(
            tuple(
                torch.randn(shape, device="cuda", generator=g, dtype=dt)
                for shape in ((m, k), (k, n), (n,), (m, n))
            )
        )
    a, b, bias, res = inputs[0]
    ep, operands = simple_epilogue(a, b, bias=bias, activation="gelu_tanh", residual=res)
    problem = make_problem(a, b, ep, operands)
    cfg = default_config(problem)

    def eager(a, b, bias, res):
        return F.gelu(torch.addmm(bias, a, b), approximate="tanh") + res

    compiled = torch.compile(eager, dynamic=False)
    versions: dict[str, Callable[..., torch.Tensor]] = {
        "epilab": lambda a, b, bias, res: epilab.matmul(
            a, b, bias=bias, activation="gelu_tanh", residual=res, config=cfg
        ),
        "mm": lambda a, b, bias, res: torch.mm(a, b),
        "eager": eager,
        "inductor": compiled,
    }
    (ref,) = reference(ep, a, b, operands)
    row: dict[str, object] = {
        "M": m,
        "N": n,
        "K": k,
        "GFLOP": flops / 1e9,
        "MB": bytes_moved / 1e6,
        "floor_ms": floor_ms,
        "config": cfg.to_dict(),
        "sets": sets,
    }
    for name, fn in versions.items():
        out = fn(a, b, bias, res)
        torch.cuda.synchronize()
        if name != "mm":  # mm computes only A @ B
            row[f"{name}_err"] = rel_error(out, ref)
        t = bench(lambda fn=fn: fn(a, b, bias, res))
        row[name] = t
        row[f"{name}_tflops"] = flops / (t["ms"] * 1e9)
        row[f"{name}_graph_ms"] = bench_graph([lambda fn=fn, x=x: fn(*x) for x in inputs])
    if probe:
        row["probe"] = []
        for c in PROBE:
            try:
                outs = tuple(torch.full((m, n), float("nan"), device="cuda", dtype=dt) for _ in ep.outputs)
                launch(problem, c, a, b, operands, out=outs)
                err = rel_error(outs[0], ref)
                ms = bench_graph(
                    [
                        lambda c=c, x=x: launch(
                            problem, c, x[0], x[1], dict(zip(operands, x[2:], strict=True))
                        )
                        for x in inputs
                    ]
                )
                row["probe"].append({"config": c.short(), "ms": ms, "err": err})
            except Exception as e:  # out of resources etc.: report and go on
                row["probe"].append({"config": c.short(), "error": f"{type(e).__name__}: {e}"[:200]})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write full results here")
    parser.add_argument("--probe", action="store_true", help="also time a few other configs")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("matmul_quick.py needs a CUDA device")
    env = run_meta()
    ceil = ceilings()
    rows = [run_shape(m, n, k, ceil, args.probe) for m, n, k in SHAPES]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "ceilings": ceil, "rows": rows}, f, indent=1)
    print(f"\n{env}")
    print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 cuBLAS mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s")
    versions = ("epilab", "mm", "eager", "inductor")
    head = (
        f"{'M':>5} {'N':>6} {'K':>5} | {'floor':>6} | {'epilab':>14} | {'mm (cuBLAS)':>14} | "
        f"{'eager 3 ops':>14} | {'inductor':>14}"
    )
    print("\ngelu_tanh(A @ B + bias) + residual, bf16: per-call ms (TFLOP/s)")
    print("1) CUDA-graph replay over rotating input sets larger than L2 (kernel time, no launch gaps)")
    print(head)
    print("-" * len(head))
    for r in rows:
        flops = r["GFLOP"] * 1e9
        cells = [f"{r[v + '_graph_ms']:6.3f} ({flops / (r[v + '_graph_ms'] * 1e9):4.0f})" for v in versions]
        print(f"{r['M']:>5} {r['N']:>6} {r['K']:>5} | {r['floor_ms']:6.3f} | " + " | ".join(cells))
    print("2) one call at a time from Python, L2 flushed before each (do_bench median; includes launch cost)")
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = [f"{r[v]['ms']:6.3f} ({r[v + '_tflops']:4.0f})" for v in versions]
        print(f"{r['M']:>5} {r['N']:>6} {r['K']:>5} | {r['floor_ms']:6.3f} | " + " | ".join(cells))
    configs = [f"{r['M']}x{r['N']}x{r['K']}: {Config.from_dict(r['config']).short()}" for r in rows]
    print("epilab configs (default heuristic): " + "; ".join(configs))
    print(
        "\nerror ||out-ref||/||ref|| vs float64: "
        + "; ".join(
            f"{r['M']}x{r['N']}x{r['K']}: epilab {r['epilab_err']:.1e} eager {r['eager_err']:.1e} "
            f"inductor {r['inductor_err']:.1e}"
            for r in rows
        )
    )
    if args.probe:
        print("\nconfig probe (graph replay ms per call, rotating inputs):")
        for r in rows:
            print(
                f"{r['M']}x{r['N']}x{r['K']}: "
                + "; ".join(
                    f"{p['config']} {p['ms']:.3f}" if "ms" in p else f"{p['config']} {p['error'][:40]}"
                    for p in r["probe"]
                )
            )


if __name__ == "__main__":
    main()
