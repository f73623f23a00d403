"""The weight-only main loops: Triton's with the fp8 weight as the dot's left operand
(``SWAP_AB=1``) and on the right (``SWAP_AB=0``), the Gluon kernel (``sm90_weight_only``: the
weight wgmma's left operand, converted a K step ahead by warp groups of 64 weight rows),
dequantize + cuBLAS + eager, Inductor and cuBLAS on a bf16 weight, in one process (issue 44).

    python3 benchmarks/weight_only_swap.py [--only 0-9] [--rounds 5] [--old OLD.jinja] [--gluon-only]
        [--json out.json]

Cases: suite ``fp8-weight``'s problems of M >= 128 (Llama-3-8B's projections and its gate and
up pair as one dual GEMM, bf16 activations, e4m3 weights; decode runs on the GEMV twins).
Hopper's wgmma reads its right operand only from shared memory: with the weight on the right
the converted tile makes a trip through shared memory each K step; on the left it stays in
registers (``sass.Loop.register_a_mmas``).

Method: FLOPs = 2 x MNK (twice for the dual). Each config of ``CONFIGS`` feasible here (and
the kind's default) is compiled in a process pool with SWAP_AB 0 and 1, and each of
``GLUON_CONFIGS`` (for the dual those of BLOCK_M 128 at most: two accumulators, and the paired
form's, BLOCK_N 64, in a column of its own), checked against the float64 reference and timed
once (CUDA events, L2 flushed); then the best of each side, dequantize + cuBLAS + eager (the
kind's baseline: what the unfused graph runs), Inductor (torch.compile of that baseline) and
cuBLAS on a weight converted to bf16 beforehand are timed in ``--rounds`` interleaved rounds:
median of the rounds' medians, spread min..max. ``--old FILE`` (an earlier
``matmul_sm90.py.jinja``) times the Gluon columns' configs rendered from it too, each checked
against float64, in the same rounds: a change of the Gluon kernel measured on like configs.
``--gluon-only`` leaves the Triton loops out of the sweep (their columns empty).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from epilogue_cost import precompile
from fp8 import scaled_mm_alone
from rounds import device_header, interleaved, only, save, spread_text
from split_k import sweep
from template_ab import template_replaced

from epilab.ir.problem import DUAL_WEIGHT_ONLY_OP, Config
from epilab.policy.space import DeviceLimits, infeasible
from epilab.policy.suites import suite
from epilab.templates.kinds import bind, default_config, kind_of
from epilab.templates.matmul_sm90 import paired
from epilab.templates.verify import checked_launch, random_inputs
from epilab.tuner.evaluate import baseline_fn
from epilab.tuner.tune import problem_flops

CONFIGS = [  # tiles of the 16-bit loops on Hopper (benchmarks/matmul_hopper.py) and the swapped probe's
    Config(256, 128, 128, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(256, 128, 64, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(64, 128, 128, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
]
GLUON_CONFIGS = [  # the Gluon kernel: 2 warp groups (BLOCK_N 128) or 3 (192) of 64 weight rows
    Config(256, 128, 64, 8, num_warps=4, num_stages=3, variant="sm90_weight_only"),
    Config(256, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    Config(128, 192, 64, 8, num_warps=4, num_stages=5, variant="sm90_weight_only"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=6, variant="sm90_weight_only"),
    Config(128, 128, 128, 8, num_warps=4, num_stages=3, variant="sm90_weight_only"),
    Config(64, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    Config(64, 192, 64, 8, num_warps=4, num_stages=6, variant="sm90_weight_only"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),  # the dual's
    Config(64, 192, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    # a dual's paired form (BLOCK_N 64: a warp group a weight, BLOCK_M tokens in two halves)
    Config(256, 64, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    Config(256, 64, 64, 8, num_warps=4, num_stages=3, variant="sm90_weight_only"),
    Config(256, 64, 128, 8, num_warps=4, num_stages=2, variant="sm90_weight_only"),
    Config(128, 64, 64, 8, num_warps=4, num_stages=6, variant="sm90_weight_only"),
    Config(128, 64, 128, 8, num_warps=4, num_stages=3, variant="sm90_weight_only"),
]
SIDES = ("dequantize + cuBLAS + eager", "inductor", "cuBLAS, bf16 weight")
GLUON = "gluon"
PAIRED = "gluon paired"  # a dual's paired form (``matmul_sm90.paired``)
BEFORE = ", before"  # the suffix of a Gluon column rendered from ``--old``


def run_problem(
    index: int, spec, problem, configs: list[Config], rounds: int, old: str | None = None
) -> dict:
    a, b, ops = random_inputs(problem, "cuda", index)
    refs = kind_of(problem).reference(problem, a, b, ops)
    swept = sweep(problem, configs, a, b, ops, refs)
    del refs
    variants = {}
    for name, pick in (
        ("swap 0", lambda c: c.variant != GLUON_CONFIGS[0].variant and not c.SWAP_AB),
        ("swap 1", lambda c: bool(c.SWAP_AB)),
        (GLUON, lambda c: c.variant == GLUON_CONFIGS[0].variant and not paired(problem, c)),
        (PAIRED, lambda c: paired(problem, c)),
    ):
        ok = [r for r in swept if "ms" in r and pick(r["obj"])]
        if ok:
            variants[name] = min(ok, key=lambda r: r["ms"])["obj"]
    runs = {name: bind(problem, c, a, b, ops).run for name, c in variants.items()}
    if old is not None:
        with template_replaced("matmul_sm90.py.jinja", old):
            for name in (GLUON, PAIRED):
                if name in variants:
                    checked_launch(problem, variants[name], a, b, ops)
                    runs[name + BEFORE] = bind(problem, variants[name], a, b, ops).run
    eager, compiled = baseline_fn(problem, "cublas"), baseline_fn(problem, "inductor")
    runs[SIDES[0]] = lambda: eager(a, b, ops)
    runs[SIDES[1]] = lambda: compiled(a, b, ops)
    runs[SIDES[2]] = scaled_mm_alone(problem, a, b, ops)
    return {
        "problem": f"{spec.m}x{spec.n}x{spec.k}" + (" dual" if problem.op == DUAL_WEIGHT_ONLY_OP else ""),
        "flops": problem_flops(problem),
        "configs": {name: c.short() for name, c in variants.items()},
        "sweep": [{k: v for k, v in r.items() if k != "obj"} for r in swept],
        "times": interleaved(runs, rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="indices of the cases, e.g. 0-4,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old", help="an earlier matmul_sm90.py.jinja: its Gluon kernels timed too")
    parser.add_argument("--gluon-only", action="store_true", help="sweep the Gluon kernel's configs alone")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"), help="A's dtype")
    parser.add_argument("--json")
    args = parser.parse_args()
    old = Path(args.old).read_text() if args.old else None
    limits = DeviceLimits.of(torch.device("cuda"))
    specs = [dataclasses.replace(s, dtype=args.dtype) for s in suite("fp8-weight") if s.m >= 128]
    chosen = only(args.only, len(specs))
    problems = {i: specs[i].problem() for i in chosen}
    configs = {}
    for i, p in problems.items():
        base = [default_config(p, sm_count=limits.sm_count), *CONFIGS]
        both = [] if args.gluon_only else [dataclasses.replace(c, SWAP_AB=s) for c in base for s in (0, 1)]
        configs[i] = [c for c in dict.fromkeys([*both, *GLUON_CONFIGS]) if infeasible(p, c, limits) is None]
    precompile([(problems[i], c, False) for i in chosen for c in configs[i]])
    header = device_header(limits.sm_count)
    results = []
    for i in chosen:
        results.append(run_problem(i, specs[i], problems[i], configs[i], args.rounds, old))
        save(args.json, header, results)
    print(header)
    rounds = f"median of {args.rounds} interleaved rounds [min-max], CUDA events"
    print(f"{args.dtype} x e4m3 weight-only; ms: {rounds}")
    print(
        "| problem | weight right ms | weight left (swap) ms | Gluon ms | config (Gluon) | Gluon paired ms | "
        + " | ".join(f"{s} ms" for s in SIDES)
        + " | best vs dequantize | best vs inductor | TFLOP/s (best) |"
    )
    print("|---|---:|---:|---:|---|---:|" + "---:|" * (len(SIDES) + 3))
    for r in results:
        t = r["times"]

        def cell(name: str, t: dict = t) -> str:
            return f"{t[name]['ms']:.4f}{spread_text(t[name], False)}" if name in t else "-"

        ours = [t[n]["ms"] for n in ("swap 0", "swap 1", GLUON, PAIRED) if n in t]
        best = min(ours) if ours else None
        versus = [f"{t[s]['ms'] / best:.2f}x" if best else "-" for s in SIDES[:2]]
        rate = f"{r['flops'] / best / 1e9:.0f}" if best else "-"
        print(
            f"| {r['problem']} | {cell('swap 0')} | {cell('swap 1')} | {cell(GLUON)} | "
            f"{r['configs'].get(GLUON, '-')} | {cell(PAIRED)} | {' | '.join(cell(s) for s in SIDES)} | "
            f"{' | '.join(versus)} | {rate} |"
        )

    if old is None:
        return
    print(f"\nThe Gluon kernel against {args.old}, like configs, same rounds")
    print("| problem | column | config | before ms | now ms | before / now |")
    print("|---|---|---|---:|---:|---:|")
    for r in results:
        t = r["times"]
        for name in (GLUON, PAIRED):
            if name + BEFORE in t:
                then, now = t[name + BEFORE], t[name]
                cells = [f"{x['ms']:.4f}{spread_text(x, False)}" for x in (then, now)]
                print(
                    f"| {r['problem']} | {name} | {r['configs'][name]} | {' | '.join(cells)} | "
                    f"{then['ms'] / now['ms']:.3f} |"
                )


if __name__ == "__main__":
    main()
