"""The dual GEMM on the `mlp` suite: one kernel for a gated MLP's gate and up projections
against cuBLAS twice + the eager join, Inductor, Inductor max-autotune and Inductor with
``freezing=True`` (inference: it may concatenate the two linears), in one process.

    python3 benchmarks/dual_mlp.py [--only 0-9] [--rounds 3] [--max-autotune-from 2048] \
        [--json out.json]

Method. FLOPs = 2 x 2MNK (two products); bytes = A + B + B2 + the output (the floor a fused
kernel must move). For each problem a fixed sweep of dual configs — the kind's default and
seeds on each dual template that can run it (``dual_matmul``; ``dual_gemv`` for M <= 16) — is
checked against the float64 reference and timed once (CUDA events, L2 flushed); then the best
config and every baseline are timed in ``--rounds`` interleaved rounds (events, L2 flushed
before each repetition, median of the rounds' medians, spread = min..max of the rounds'
medians). Calls under 50 us, and every call of a problem whose dual kernel is under 50 us or
whose M <= 16 (decode), are also timed by CUDA-graph replay (weights of 64 MB and more: they
do not stay in L2); like with like: a baseline's host work must not be what its events time.
Inductor's baselines compile the same eager code (``tuner/evaluate``); max-autotune (without
its CUDA graphs) only from M >= ``--max-autotune-from``; freezing compiles an ``nn.Module``
with the two linears under ``torch.no_grad``. The device's copy bandwidth (a 1 GiB ``copy_``,
read + write) is measured in the same run, for decode's "percent of copy bandwidth" of the
gate and up weights.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from collections.abc import Callable

import torch
import torch.nn as nn
import triton
from rounds import comparable_ms, geomean, interleaved, only, timed

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.space import DeviceLimits, infeasible
from epilab.policy.suites import suite
from epilab.templates.gemm.dual_matmul import B2
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.registry import bind, default_config, kind_of, twins
from epilab.templates.verify import failure, output_errors
from epilab.tuner.evaluate import baseline_fn
from epilab.tuner.timing import time_cuda

# decode: more column widths, depths and split-K reductions than the dual GEMV's seeds
DECODE_SWEEP = tuple(
    Config(16, bn, bk, 1, split, num_warps=4, num_stages=3, variant=variant)
    for bn, bk, split, variant in (
        (32, 128, 1, "default"),
        (64, 256, 1, "default"),
        (32, 256, 2, "two_pass"),
        (64, 128, 2, "two_pass"),
        (128, 128, 2, "two_pass"),
        (64, 128, 8, "two_pass"),
        (32, 128, 4, "atomic"),
        (64, 256, 4, "atomic"),
    )
)


# prefill: the Hopper loops' other knobs (warp specialization, deeper K steps, TMA stores)
PREFILL_SWEEP = (
    Config(128, 128, 64, 8, 1, 8, 3, "tma_persistent", FLATTEN=1, WARP_SPECIALIZE=1),
    Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma_persistent", FLATTEN=1),
    Config(128, 128, 64, 16, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 128, 128, 8, num_warps=8, num_stages=2, variant="tma"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma", EPILOGUE_SUBTILE=2, TMA_STORE=1),
    Config(64, 256, 64, 8, num_warps=8, num_stages=4, variant="tma"),
)


def candidates(problem: Problem, limits: DeviceLimits) -> list[tuple[Problem, Config]]:
    """Every dual template that can run ``problem`` with its default config and seeds (and the
    decode sweep on the dual GEMV), the feasible ones."""
    out = []
    for p in twins(problem):
        kind = kind_of(p)
        seen = set()
        extra = DECODE_SWEEP if p.template == "dual_gemv" else PREFILL_SWEEP
        for c in (default_config(p, sm_count=limits.sm_count), *kind.seeds, *extra):
            if c not in seen and infeasible(p, c, limits) is None:
                seen.add(c)
                out.append((p, c))
    return out


class Gated(nn.Module):
    """The two projections as nn.Linear layers (for Inductor's freezing)."""

    def __init__(self, w: torch.Tensor, w2: torch.Tensor, join: Callable) -> None:
        super().__init__()
        self.gate = nn.Linear(w.shape[1], w.shape[0], bias=False)
        self.up = nn.Linear(w.shape[1], w.shape[0], bias=False)
        self.gate.weight.data, self.up.weight.data = w, w2
        self.join = join

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.join(self.gate(x), self.up(x))


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device copy (bytes read + written)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), rep_ms=200).median_ms
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def run_spec(index: int, spec: Spec, args: argparse.Namespace, limits: DeviceLimits) -> dict:
    problem = spec.problem()
    s = problem.shape
    m, n, k = int(s.m), int(s.n), int(s.k)
    dt = dtypes.torch_dtype(problem.dtype)
    gen = torch.Generator(device="cuda").manual_seed(index)
    x = torch.randn(m, k, generator=gen, device="cuda").to(dt)
    w = (torch.randn(n, k, generator=gen, device="cuda") / math.sqrt(k)).to(dt)
    w2 = (torch.randn(n, k, generator=gen, device="cuda") / math.sqrt(k)).to(dt)
    b, b2 = w.t(), w2.t()
    call = {B2: b2}
    refs = kind_of(problem).reference(problem, x, b, call)
    sweep = []
    for p, c in candidates(problem, limits):
        bound = bind(p, c, x, b, call)
        try:
            bound.run()
            torch.cuda.synchronize()
        except Exception as e:  # a config the compiler refuses: noted, not fatal
            sweep.append({"template": p.template, "config": c.short(), "error": str(e)[:200]})
            continue
        why = failure(output_errors(p, bound.outs, refs))
        if why is not None:
            sweep.append({"template": p.template, "config": c.short(), "error": why})
            continue
        events, graph = timed(bound.run)
        sweep.append({"template": p.template, "config": c.short(), "ms": events, "graph_ms": graph})
        print(
            f"  {p.template} {c.short()}: {events:.4f} ms" + (f" (graph {graph:.4f})" if graph else ""),
            file=sys.stderr,
        )
    ok = [r for r in sweep if "ms" in r]
    if not ok:
        return {"problem": spec.label(), "error": "no config passed", "sweep": sweep}
    best = min(ok, key=lambda r: r["graph_ms"] or r["ms"])
    best_problem, best_config = next(
        (p, c)
        for p, c in candidates(problem, limits)
        if p.template == best["template"] and c.short() == best["config"]
    )
    dual = bind(best_problem, best_config, x, b, call)
    del refs
    variants: dict[str, Callable[[], object]] = {"dual": dual.run}
    eager = baseline_fn(problem, "cublas")
    variants["cublas x2 + eager"] = lambda: eager(x, b, call)
    inductor = baseline_fn(problem, "inductor")
    inductor(x, b, call)
    variants["inductor"] = lambda: inductor(x, b, call)
    if m >= args.max_autotune_from:
        tuned = baseline_fn(problem, "inductor-max-autotune")
        tuned(x, b, call)
        variants["max-autotune"] = lambda: tuned(x, b, call)
    module = Gated(w, w2, lambda g, u: problem.epilogue.evaluate(g, {}, acc2=u)[0].to(dt))
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        frozen = torch.compile(module)
        frozen(x)

        def run_frozen() -> object:
            with torch.no_grad():
                return frozen(x)

        variants["freezing"] = run_frozen
        # decode, or a short kernel: every side under CUDA graphs too (like with like)
        times = interleaved(variants, args.rounds, graph=m <= 16 or best["graph_ms"] is not None)
    result = {
        "index": index,
        "problem": spec.label(),
        "m": m,
        "n": n,
        "k": k,
        "flops": 4 * m * n * k,
        "bytes": (m * k + 2 * k * n + m * n) * dt.itemsize,
        "template": best_problem.template,
        "config": best_config.short(),
        "sweep": sweep,
        "times": times,
    }
    return result


def table(results: list[dict], copy_gbs: float | None) -> str:
    names = ["cublas x2 + eager", "inductor", "max-autotune", "freezing"]
    lines = [
        "| problem | dual ms (TFLOP/s) | GB/s (% of copy) | template, config | "
        + " | ".join(f"{n} ms" for n in names)
        + " | vs cuBLAS x2+eager | vs Inductor | vs max-autotune | vs freezing |",
        "|---|---:|---:|---|" + "---:|" * (2 * len(names)),
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['problem']} | {r['error']} |")
            continue
        t = r["times"]
        dual = comparable_ms(t["dual"])
        gbs = r["bytes"] / (dual * 1e-3) / 1e9
        share = f" ({100 * gbs / copy_gbs:.0f}%)" if copy_gbs else ""
        cells = [f"{comparable_ms(t.get(n)):.4f}" if t.get(n) else "-" for n in names]
        ratios = [f"{comparable_ms(t[n]) / dual:.2f}x" if t.get(n) else "-" for n in names]
        graph = "*" if t["dual"]["graph_ms"] else ""
        tflops = r["flops"] / (dual * 1e-3) / 1e12
        lines.append(
            f"| {r['problem']} | {dual:.4f}{graph} ({tflops:.0f}) | {gbs:.0f}{share} | "
            f"{r['template']} {r['config']} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |"
        )
    lines.append("")
    lines.append(
        "`*`: CUDA-graph replay times (decode, M <= 16, and calls under 50 us);"
        " the rest CUDA events with L2 flushed."
    )
    for label, pick in (
        ("M >= 2048", lambda r: r["m"] >= 2048),
        ("M = 128", lambda r: r["m"] == 128),
        ("M <= 16 (decode)", lambda r: r["m"] <= 16),
    ):
        chosen = [r for r in results if "error" not in r and pick(r)]
        if not chosen:
            continue
        parts = []
        for n in names:
            xs = [
                comparable_ms(r["times"][n]) / comparable_ms(r["times"]["dual"])
                for r in chosen
                if r["times"].get(n)
            ]
            if xs:
                parts.append(f"vs {n} {geomean(xs):.3f}x (min {min(xs):.3f}x, n={len(xs)})")
        lines.append(f"- {label}: " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="mlp")
    parser.add_argument("--only", help="1-based spec numbers, e.g. 4-5,9")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--max-autotune-from", type=int, default=2048, help="smallest M timed with max-autotune"
    )
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print(table(saved["results"], saved.get("copy_gbs")))
        return
    limits = DeviceLimits.of(torch.device("cuda"))
    copy_gbs = copy_bandwidth()
    specs = suite(args.suite)
    results = []
    for i in only(args.only, len(specs)):
        print(f"[{i}] {specs[i].label()}", file=sys.stderr)
        results.append(run_spec(i, specs[i], args, limits))
        torch.cuda.empty_cache()
    header = (
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, "
        f"python {platform.python_version()}; copy {copy_gbs:.0f} GB/s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": header, "copy_gbs": copy_gbs, "results": results}, f, indent=1)
    print(header)
    print(table(results, copy_gbs))


if __name__ == "__main__":
    main()
