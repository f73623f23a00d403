"""What each part of the quantize step costs in a block-scaled GEMM's epilogue (issue 44).

    python3 benchmarks/quantize_step_cost.py [--shape 2048x14336x4096] [--epilogues bf16,quantized]
        [--unsplit] [--rounds 5] [--json out.json]
    ncu --section SpeedOfLight --section WarpStateStats -k regex:epilab -c 4 \\
        python3 benchmarks/quantize_step_cost.py --profile bf16,quantized --configs 0

Llama-3-8B's gate projection at prefill (block-scaled e4m3, M 2048) quantizes its output per
token and 128 channels for the down projection (``quantize=128``). That kernel ran 23% longer
than the same GEMM storing bf16 (RESULTS.md, 2026-11-28 late). This probe takes the quantize
step apart, one epilogue a row, all on the same Gluon configs:

- ``bf16``: the accumulator stored in bf16 (the main loop and a plain store);
- ``silu``: silu, then bf16;
- ``silu e4m3``: silu cast to e4m3 (an fp8 tile store, no groups);
- ``silu + scales``: silu in bf16 and each group's scale (the group max; no division);
- ``quantized``: ``ir.quantize.quantized_groups`` of silu (q and the scales), as a model's;
- ``quantized, exact forms``: the same with silu's exact fp32 form (``EPILAB_EXACT_MATH``);
- ``quantized by reciprocal``: q as ``y * (448 / max)``: one division per group, not per
  element (not torch's rounding: the cost of the division, not a candidate).

``--unsplit`` times each (epilogue, config) with a partial last wave left whole too
(``matmul_sm90.tail_split`` held at 1; 2048 x 14336 x 4096 in 192 x 128 tiles is 9 waves and 44
tiles, split 3 ways as bound): what the split gains beside a quantize step.

Method: every (epilogue, config) is compiled in a process pool, checked against float64 once
(``verify.checked_launch``), then timed in ``--rounds`` interleaved rounds by CUDA events with
L2 flushed (``rounds.interleaved``): median of the rounds' medians and their min..max.
``--profile`` launches the named epilogues twice each, unchecked and untimed, for a profiler.
"""

from __future__ import annotations

import argparse

import torch
from epilogue_cost import precompile
from rounds import device_header, interleaved, save
from template_ab import last_wave_whole

from epilab import config as epilab_config
from epilab.ir.epilogue import GROUP_REDUCE, Epilogue, acc, group_max, ops
from epilab.ir.problem import Config
from epilab.ir.quantize import FP8_MAX, SCALE_FLOOR, quantized_groups
from epilab.templates.block_scaled import make_block_problem
from epilab.templates.gemm_spec import Spec
from epilab.templates.kinds import bind
from epilab.templates.verify import checked_launch, random_inputs

GROUP = 128
CONFIGS = [
    Config(192, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(192, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative"),
    Config(128, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative", TMA_STORE=1),
]


def epilogues() -> dict[str, Epilogue]:
    y = ops.cast(ops.silu(acc()), dtype="bfloat16")
    amax = ops.maximum(group_max(abs(y), GROUP), SCALE_FLOOR)
    scale = amax / FP8_MAX["float8_e4m3fn"]
    silu = Epilogue.build([(ops.silu(acc()), "bfloat16")])
    return {
        "bf16": Epilogue.identity("bfloat16"),
        "silu": silu,
        "silu e4m3": Epilogue.build([(ops.silu(acc()), "float8_e4m3fn")]),
        "silu + scales": Epilogue.build([(y, "bfloat16"), (scale, "float32", GROUP_REDUCE, GROUP)]),
        "quantized": quantized_groups(silu, GROUP),
        "quantized by reciprocal": Epilogue.build(
            [
                (y * (FP8_MAX["float8_e4m3fn"] / amax), "float8_e4m3fn"),
                (scale, "float32", GROUP_REDUCE, GROUP),
            ]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2048x14336x4096", help="MxNxK")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default=",".join(str(i) for i in range(len(CONFIGS))))
    parser.add_argument("--epilogues", help="comma-separated epilogue names (default: all)")
    parser.add_argument("--unsplit", action="store_true", help="each also with a partial last wave whole")
    parser.add_argument("--profile", help="comma-separated epilogue names: launch each twice, no timing")
    parser.add_argument("--json")
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    base = Spec(m, n, k, dtype="float8_e4m3fn", scales="block").problem()
    a, b, scales = random_inputs(base, "cuda", 0)
    problems = {name: make_block_problem(a, b, ep, scales) for name, ep in epilogues().items()}
    configs = [CONFIGS[int(i)] for i in args.configs.split(",")]
    if args.profile:
        for name in args.profile.split(","):
            for config in configs:
                bound = bind(problems[name], config, a, b, scales)
                for _ in range(2):
                    bound.run()
        torch.cuda.synchronize()
        return
    variants = [(name, p, False) for name, p in problems.items()]
    variants.insert(5, ("quantized, exact forms", problems["quantized"], True))
    if args.epilogues:
        unknown = set(args.epilogues.split(",")) - {name for name, _, _ in variants}
        if unknown:
            parser.error(f"--epilogues: no epilogue {sorted(unknown)}; known: {[n for n, _, _ in variants]}")
        variants = [v for v in variants if v[0] in args.epilogues.split(",")]
    precompile([(p, c, exact) for _, p, exact in variants for c in configs])
    runs = {}
    for name, problem, exact in variants:
        for config in configs:
            try:
                with epilab_config.patch(exact_math=exact):
                    checked_launch(problem, config, a, b, scales)
                    runs[(name, config.short())] = bind(problem, config, a, b, scales).run
                if args.unsplit:
                    with epilab_config.patch(exact_math=exact), last_wave_whole():
                        checked_launch(problem, config, a, b, scales)
                        whole = bind(problem, config, a, b, scales)
                    runs[(f"{name}, last wave whole", config.short())] = whole.run
            except Exception as e:
                print(f"# {name} {config.short()}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    times = interleaved({f"{name} | {c}": fn for (name, c), fn in runs.items()}, args.rounds)
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    results = []
    for (name, c), _ in runs.items():
        t = times[f"{name} | {c}"]
        plain = times.get(f"bf16 | {c}")
        results.append(
            {
                "epilogue": name,
                "config": c,
                **t,
                "tflops": 2 * m * n * k / t["ms"] / 1e9,
                "vs_bf16": t["ms"] / plain["ms"] if plain else None,
            }
        )
    save(args.json, header, results)
    print(header)
    print(f"block-scaled e4m3 {m}x{n}x{k}; ms: median of {args.rounds} rounds [min, max]")
    print(f"{'epilogue':26} {'config':44} {'ms':>8} {'spread':>17} {'TFLOP/s':>8} {'x bf16':>7}")
    for r in results:
        lo, hi = r["spread"]
        ratio = f"{r['vs_bf16']:.3f}" if r["vs_bf16"] else "-"
        print(
            f"{r['epilogue']:26} {r['config']:44} {r['ms']:8.4f} [{lo:.4f}, {hi:.4f}] "
            f"{r['tflops']:8.0f} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
