"""What an untuned fp8 call with exact accumulation runs on this GPU, against the heuristic's
Triton loop and cuBLASLt (issue 44).

    python3 benchmarks/untuned_fp8.py [--only 0-10] [--rounds 3] [--json out.json]

``epilab.matmul(x8, w8.t(), scale_a=, scale_b=)`` without a config takes
``registry.default_config`` with the device's capability: on sm_90 the kind's ``device_default``
(the cooperative kernel where its tiles fill the GPU), elsewhere the heuristic's Triton loop.
Problems (e4m3, bf16 out, no epilogue beyond the scales): block-scaled, the ``fp8-block``
suite's DeepSeek-V3 dense projections at M = 4096 (DeepGEMM's table) and two of Llama-3-8B's
at M = 128; rowwise with exact accumulation (``use_fast_accum=False``, torch's default), 8192^3
and Llama-3-8B's projections at M = 2048.

Method: both configs are compiled in a process pool, checked against float64 once
(``verify.checked_launch``), then they and cuBLASLt (``torch._scaled_mm`` with the same scales
and accumulation: ``fp8.scaled_mm_alone``) are timed in ``--rounds`` interleaved rounds (CUDA
events, L2 flushed; calls under 50 us also by CUDA-graph replay): median of the rounds' medians and
their min..max (of the events). Ratios compare like with like: replay times (``*``) where every
side of the problem was replayed, else event times. Kernel times, not the API call's host work.
"""

from __future__ import annotations

import argparse

import torch
from epilogue_cost import precompile
from fp8 import scaled_mm_alone
from rounds import device_header, interleaved, like_with_like, only, save, spread_text

from epilab.policy.suites import suite
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.registry import bind, default_config
from epilab.templates.verify import checked_launch, random_inputs


def cases() -> list[Spec]:
    """The ``fp8-block`` suite's DeepSeek-V3 projections at M = 4096 and Llama-3-8B's fused QKV
    and down projection at M = 128; rowwise exact 8192^3 and Llama-3-8B's up and down
    projections at M = 2048 (no epilogue beyond the scales)."""
    blocks = [s for s in suite("fp8-block") if s.m == 4096]
    blocks += [s for s in suite("fp8-block") if s.m == 128 and (s.n, s.k) in ((6144, 4096), (4096, 14336))]
    rows = [(8192, 8192, 8192), (2048, 14336, 4096), (2048, 4096, 14336)]
    return [*blocks, *(Spec(m, n, k, dtype="float8_e4m3fn", scales="row") for m, n, k in rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="1-based case numbers, e.g. 1-4,9")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    facts = {"sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}
    every = cases()
    chosen = [every[i] for i in only(args.only, len(every))]
    problems = [spec.problem() for spec in chosen]
    configs = [
        {"heuristic": default_config(p, sm_count=facts["sm_count"]), "untuned": default_config(p, **facts)}
        for p in problems
    ]
    unique = [
        (p, c)
        for p, cs in zip(problems, configs, strict=True)
        for name, c in cs.items()
        if name == "heuristic" or c != cs["heuristic"]
    ]
    precompile([(p, c, False) for p, c in unique])
    header = device_header(facts["sm_count"])
    results = []
    for index, (problem, cs) in enumerate(zip(problems, configs, strict=True)):
        a, b, scales = random_inputs(problem, "cuda", index)
        variants = {}
        for name, config in cs.items():
            checked_launch(problem, config, a, b, scales)
            variants[name] = bind(problem, config, a, b, scales).run
        variants["_scaled_mm"] = scaled_mm_alone(problem, a, b, scales)
        times = interleaved(variants, args.rounds)
        s = problem.shape
        results.append(
            {
                "problem": f"{chosen[index].scales} {s.m}x{s.n}x{s.k}",
                "flops": 2 * s.m * s.n * s.k,
                "configs": {name: c.short() for name, c in cs.items()},
                "times": times,
            }
        )
        save(args.json, header, results)
    print(header)
    print(f"e4m3 -> bf16, exact accumulation; ms: median of {args.rounds} rounds [min, max] (* graph replay)")
    names = ("problem", "untuned config", "untuned", "heuristic loop", "_scaled_mm", "vs cuBLASLt", "vs loop")
    print(" ".join(f"{x:{w}}" for x, w in zip(names, (22, 42, 24, 24, 24, 11, 8), strict=True)))
    for r in results:
        t = r["times"]
        cells = []
        graph, ms = like_with_like(t)
        star = "*" if graph else ""
        for name in ("untuned", "heuristic", "_scaled_mm"):
            cells.append(f"{ms[name]:.4f}{star}{spread_text(t[name], graph, 3)}")
        untuned = ms["untuned"]
        vs_lt, vs_loop = ms["_scaled_mm"] / untuned, ms["heuristic"] / untuned
        print(
            f"{r['problem']:22} {r['configs']['untuned']:42} {cells[0]:>24} {cells[1]:>24} {cells[2]:>24} "
            f"{vs_lt:10.2f}x {vs_loop:7.2f}x  ({r['flops'] / untuned / 1e9:.0f} TFLOP/s)"
        )


if __name__ == "__main__":
    main()
