"""fp8 (e4m3) scaled matmuls with fused epilogues against torch._scaled_mm (cuBLASLt) + the
eager epilogue, _scaled_mm alone, Inductor and Inductor max-autotune, in one process.

    python3 benchmarks/fp8.py [--suite fp8] [--only 0-4] [--epilogue none] [--fast-accum] \
        [--rounds 3] [--max-autotune] [--json out.json]
    python3 benchmarks/fp8.py --suite fp8-block [--only 40-45]
    python3 benchmarks/fp8.py --suite fp8-weight

Block-scaled problems (suite ``fp8-block``) are compared with _scaled_mm's block scaling
(cuBLASLt, the one block-scaled GEMM installable here: DeepGEMM and FlashInfer are not); every
baseline side gets the scales laid out as cuBLASLt takes them (``baseline_layouts``), once,
outside the timed calls, as the tuner's baseline does. Where DeepGEMM published a shape's rate
(``DEEPGEMM_PUBLISHED``) a second table puts it beside epilab's, labelled as published: another
GPU, not run here.
Weight-only problems (suite ``fp8-weight``: bf16 activations, e4m3 weights) are compared
with their baseline, the weight converted to bf16 then cuBLAS then the eager epilogue
("dequantize + cuBLAS + eager", what the unfused graph runs), and with cuBLAS on a bf16 weight
converted beforehand ("cuBLAS, bf16 weight": the model without fp8 weights, which reads twice
the bytes); Inductor compiles the baseline (its dequantize kernel and cuBLAS).

Method. FLOPs = 2 x MNK; bytes = A + B (one byte an element) + scales, bias + outputs. For
each problem (and a weight-only problem's GEMV twin at M <= 16, ``weight_only_gemv``: the same
tensors on the gemv kernel) a fixed sweep — the default config, the kind's feasible seeds and
``FP8_SWEEP`` — is checked against the float64 reference (inputs dequantized exactly) and
timed once (CUDA events, L2 flushed before each repetition). Then the best config,
_scaled_mm with the epilogue's scales and bias + the rest of the epilogue in eager torch
("scaled_mm + eager", the kind's baseline), _scaled_mm with the scales alone (bf16 out, no
epilogue: what the GEMM costs in cuBLASLt), Inductor (torch.compile of the eager baseline;
its own _scaled_mm lowering) and with ``--max-autotune`` Inductor max-autotune (its
scaled-mm Triton templates with the epilogue fused; no CUDA graphs) are timed in ``--rounds``
interleaved rounds: median of the rounds' medians, spread = min..max. Calls under 50 us
are also timed by CUDA-graph replay (``*``), the time compared for them; where epilab's
kernel is that short, every side of the problem is replayed too (like with like). ``--fast-accum``
makes every side accumulate fast (use_fast_accum=True; Triton's default fp8 dot on sm_90);
without it the template adds the products of PROMOTE K blocks in fp32 (every 256 elements of
K at most) and cuBLASLt runs its default (every 128, measured: RESULTS.md, issue 44).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
from rounds import (
    comparable_ms,
    device_header,
    geomean,
    interleaved,
    like_with_like,
    only,
    print_saved,
    save,
    suite_arguments,
)
from split_k import sweep

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.space import DeviceLimits, infeasible
from epilab.policy.suites import suite
from epilab.templates.gemm.block_scaled import scaled_mm_blocks
from epilab.templates.gemm.matmul_config import STREAM_K_VARIANTS
from epilab.templates.gemm.matmul_reference import scaled_mm_prefix
from epilab.templates.gemm.ops import BLOCK_SCALED_OP, WEIGHT_ONLY_OPS
from epilab.templates.registry import bind, default_config, kind_of, twins
from epilab.templates.verify import random_inputs
from epilab.tuner.evaluate import baseline_fn

FP8_SWEEP = tuple(  # the winners at 8192^3 on an H100 first (RESULTS.md, issue 21)
    Config(bm, bn, bk, g, num_warps=w, num_stages=st, variant=v, EPILOGUE_SUBTILE=sub, FLATTEN=fl)
    for bm, bn, bk, g, w, st, v, sub, fl in (
        (128, 256, 128, 8, 8, 3, "tma_persistent", 2, 0),
        (128, 256, 128, 16, 8, 3, "tma", 2, 0),
        (128, 256, 128, 8, 8, 4, "tma_persistent", 2, 1),
        (128, 128, 256, 8, 8, 3, "tma", 1, 0),
        (128, 128, 128, 8, 8, 4, "tma_persistent", 1, 1),
        (128, 128, 128, 8, 4, 4, "tma", 1, 0),
        (64, 128, 128, 8, 4, 5, "tma", 1, 0),
        (64, 64, 128, 8, 4, 6, "tma", 1, 0),
        (64, 128, 256, 8, 4, 3, "tma", 1, 0),
    )
)
EXACT_SWEEP = (  # exact accumulation: promotion every 256 elements of K (issue 44), feasible only there
    Config(128, 128, 256, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1, PROMOTE=2),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma", PROMOTE=2),
    Config(128, 256, 64, 8, num_warps=8, num_stages=4, variant="tma_persistent", FLATTEN=1, PROMOTE=2),
    Config(128, 256, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1, PROMOTE=2),
)

COOPERATIVE_SWEEP = (  # sm_90, exact: warp groups promoting while the others' MMAs run (issue 44)
    Config(192, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative"),
    Config(192, 128, 128, 16, num_warps=4, num_stages=4, variant="sm90_cooperative"),
    Config(128, 128, 128, 8, num_warps=4, num_stages=6, variant="sm90_cooperative"),
    Config(128, 128, 128, 16, num_warps=4, num_stages=4, variant="sm90_cooperative"),
    Config(192, 64, 128, 8, num_warps=4, num_stages=6, variant="sm90_cooperative"),
    Config(128, 64, 128, 8, num_warps=4, num_stages=7, variant="sm90_cooperative"),
    # each warp group's rows of the outputs staged in shared memory and stored by TMA
    Config(192, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(192, 128, 128, 16, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(128, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative", TMA_STORE=1),
)

# the two library sides of a problem: (its kind's baseline, the library's GEMM alone)
SIDES = {
    "scaled": ("scaled_mm + eager", "scaled_mm alone"),
    "weight": ("dequantize + cuBLAS + eager", "cuBLAS, bf16 weight"),
}


def sides(problem: Problem) -> tuple[str, str]:
    return SIDES["weight" if problem.op in WEIGHT_ONLY_OPS else "scaled"]


def candidates(problem: Problem, limits: DeviceLimits) -> list[Config]:
    """The default config, the kind's fp8 seeds (a weight-only kind's every seed: its decode
    tiles), its split-K and stream-K seeds, FP8_SWEEP, EXACT_SWEEP and COOPERATIVE_SWEEP: those
    feasible on this device."""
    out = [default_config(problem, sm_count=limits.sm_count)]
    kind = kind_of(problem)
    seeds = [
        *(c for c in kind.seeds_for(problem) if c not in kind.seeds or problem.op in WEIGHT_ONLY_OPS),
        *(c for c in kind.seeds if c.SPLIT_K > 1 or c.variant in STREAM_K_VARIANTS),
    ]
    for c in (*seeds, *FP8_SWEEP, *EXACT_SWEEP, *COOPERATIVE_SWEEP):
        if c not in out and infeasible(problem, c, limits) is None:
            out.append(c)
    return out


def scaled_mm_alone(problem: Problem, a, b, ops):
    """_scaled_mm with the epilogue's scales (or the block scales, laid out as the kind's
    ``baseline_layouts`` says once, here, not in each call: a no-op for scales laid out so
    already), bf16 out, nothing else; for a weight-only problem cuBLAS on the weight converted
    to bf16 beforehand."""
    if problem.op in WEIGHT_ONLY_OPS:  # a dual problem's second weight too (two GEMMs)
        wides = [w.to(a.dtype) for w in (b, ops.get("b2")) if w is not None]
        return lambda: [a @ w for w in wides]
    if problem.op == BLOCK_SCALED_OP:
        laid = kind_of(problem).baseline_layouts(ops)
        return lambda: scaled_mm_blocks(a, b, laid)
    prefix = scaled_mm_prefix(problem.epilogue)
    scale_a, scale_b = prefix.scale_a, prefix.scale_b
    one = torch.ones((), device=a.device)
    sa = ops[scale_a] if scale_a else one
    sb = (ops[scale_b].reshape(1, -1) if ops[scale_b].numel() > 1 else ops[scale_b]) if scale_b else one
    fast = problem.precision == "fast"
    return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)


def run_problem(index: int, problem: Problem, label: str, args: argparse.Namespace, limits) -> dict:
    a, b, ops = random_inputs(problem, "cuda", index)
    refs = kind_of(problem).reference(problem, a, b, ops)
    swept = []
    for p in twins(problem):  # a decode-time weight-only problem's GEMV twin too (same tensors)
        for r in sweep(p, candidates(p, limits), a, b, ops, refs):
            r["template"], r["run_as"] = p.template, p
            if p is not problem:
                r["config"] = f"{p.template} {r['config']}"
            swept.append(r)
    del refs
    ok = [r for r in swept if "ms" in r]
    variants = {}
    if ok:
        best = min(ok, key=comparable_ms)
        variants["epilab"] = bind(best["run_as"], best["obj"], a, b, ops).run
    # the baselines' operands laid out as their library takes them, once, as the tuner does
    # (cuBLASLt's block scales: a copy inside each timed call would be charged to them)
    laid = kind_of(problem).baseline_layouts(ops)
    eager = baseline_fn(problem, "cublas")
    baseline, alone = sides(problem)
    variants[baseline] = lambda: eager(a, b, laid)
    variants[alone] = scaled_mm_alone(problem, a, b, laid)
    errors = {}
    for name, library in (("inductor", "inductor"), ("max-autotune", "inductor-max-autotune")):
        if name == "max-autotune" and not args.max_autotune:
            continue
        compiled = baseline_fn(problem, library)
        try:
            compiled(a, b, laid)
        except RuntimeError as e:  # cuBLASLt refused a shape Inductor handed it: noted, not fatal
            errors[name] = str(e)[:300]
            print(f"  {name}: {errors[name]}", file=sys.stderr)
            continue
        variants[name] = lambda compiled=compiled: compiled(a, b, laid)
    # like with like: where epilab's kernel is short, every side is also replayed in CUDA
    # graphs (a compiled or eager call's host work would otherwise be what events time)
    times = interleaved(variants, args.rounds, graph=bool(ok) and best["graph_ms"] is not None)
    s = problem.shape
    m, n, k = int(s.m), int(s.n), int(s.k)
    out_bytes = sum(m * n * dtypes.itemsize(o.dtype) for o in problem.epilogue.outputs)
    return {
        "index": index,
        "problem": label,
        "m": m,
        "n": n,
        "k": k,
        "precision": problem.precision,
        "flops": 2 * m * n * k,
        "sides": [baseline, alone],
        "bytes": sum(t.numel() * t.element_size() for t in (a, b, *ops.values())) + out_bytes,
        "chosen": best["config"] if ok else None,
        "sweep": [{k: v for k, v in r.items() if k not in ("obj", "run_as")} for r in swept],
        "times": times,
        "errors": errors,
    }


# DeepGEMM's published rates, TFLOP/s by (M, N, K): its README at 55ab91f (2025-03-25), "Normal
# GEMMs for dense models", measured on an H800 SXM5 (an H100 SXM's SMs and clocks) with NVCC 12.8,
# e4m3 with DeepSeek-V3's block scales, bf16 out. Later READMEs dropped the per-shape table
# (the 2025-04 kernels: "up to 1550 TFLOPS on H800", no shapes given).
DEEPGEMM_SOURCE = "DeepGEMM README 55ab91f (2025-03-25), H800 SXM5, NVCC 12.8"
DEEPGEMM_SHAPES = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
DEEPGEMM_PUBLISHED = {  # (M, N, K) -> TFLOP/s, the table's rows at M = 4096 and M = 128
    (m, n, k): rate
    for m, rates in ((4096, (1009, 1125, 751, 1426, 1265, 1168)), (128, (352, 535, 358, 645, 533, 510)))
    for (n, k), rate in zip(DEEPGEMM_SHAPES, rates, strict=True)
}


def published_table(results: list[dict]) -> str:
    """epilab's rate on this GPU beside DeepGEMM's published one for the block-scaled problems
    it published (empty when none is among ``results``)."""
    rows = []
    for r in results:
        rate = DEEPGEMM_PUBLISHED.get((r["m"], r["n"], r["k"]))
        if rate is None or "block" not in r["problem"] or "epilab" not in r["times"]:
            continue
        mine = r["flops"] / (like_with_like(r["times"])[1]["epilab"] * 1e-3) / 1e12
        rows.append(f"| {r['problem']} | {mine:.0f} | {rate} | {mine / rate:.2f}x |")
    if not rows:
        return ""
    head = [
        f"Beside DeepGEMM's published rates ({DEEPGEMM_SOURCE}; not run here, another GPU):",
        "| problem | epilab TFLOP/s (this run) | DeepGEMM TFLOP/s (published) | epilab / DeepGEMM |",
        "|---|---:|---:|---:|",
    ]
    return "\n".join(head + rows)


def table(results: list[dict]) -> str:
    names = [*results[0].get("sides", SIDES["scaled"]), "inductor", "max-autotune"]
    lines = [
        "| problem | epilab ms (TFLOP/s) | config | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"vs {n}" for n in names)
        + " |",
        "|---|---:|---|" + "---:|" * (2 * len(names)),
    ]
    ratios: dict[str, list[float]] = {n: [] for n in names}
    big: dict[str, list[float]] = {n: [] for n in names}
    for r in results:
        t = r["times"]
        if "epilab" not in t:
            lines.append(f"| {r['problem']} | no config passed | | " + " | " * (2 * len(names) - 1) + " |")
            continue
        graph, ms = like_with_like(t)  # one method for every side of the problem
        star = "*" if graph else ""
        mine = ms["epilab"]
        cells, vs = [], []
        for n in names:
            if n not in t:
                cells.append("-")
                vs.append("-")
                continue
            theirs = ms[n]
            cells.append(f"{theirs:.4f}{star}")
            vs.append(f"{theirs / mine:.2f}x")
            ratios[n].append(theirs / mine)
            if r["m"] >= 2048:
                big[n].append(theirs / mine)
        tflops = r["flops"] / (mine * 1e-3) / 1e12
        lines.append(
            "| "
            + " | ".join([r["problem"], f"{mine:.4f}{star} ({tflops:.0f})", r["chosen"], *cells, *vs])
            + " |"
        )
    lines.append("")
    lines.append(
        "`*`: CUDA-graph replay, where every side of the problem was replayed (calls under 50 us); "
        "the rest CUDA events with L2 flushed, on every side of the problem"
    )
    lines.append("- ratios are the other's time over epilab's (above 1: epilab faster)")
    for label, group in (("all", ratios), ("M >= 2048", big)):
        parts = [
            f"vs {n} {geomean(xs):.3f}x (min {min(xs):.3f}x, n={len(xs)})" for n, xs in group.items() if xs
        ]
        lines.append(f"- geomean, {label}: " + "; ".join(parts))
    published = published_table(results)
    return "\n".join(lines + (["", published] if published else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    suite_arguments(parser, "fp8")
    parser.add_argument("--epilogue", help="replace every spec's epilogue (e.g. none)")
    parser.add_argument("--fast-accum", action="store_true", help="use_fast_accum on every side")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    limits = DeviceLimits.of(torch.device("cuda"))
    specs = suite(args.suite)
    header = device_header(limits.sm_count)
    results = []
    for i in only(args.only, len(specs)):
        spec = specs[i] if args.epilogue is None else dataclasses.replace(specs[i], epilogue=args.epilogue)
        problem = spec.problem()
        if args.fast_accum:
            problem = dataclasses.replace(problem, precision="fast")
        label = spec.label() + (" fast-accum" if args.fast_accum else "")
        print(f"[{i}] {label}", file=sys.stderr)
        results.append(run_problem(i, problem, label, args, limits))
        torch.cuda.empty_cache()
        save(args.json, header, results)
    print(header)
    print(table(results))


if __name__ == "__main__":
    main()
