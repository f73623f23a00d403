"""What row statistics cost in a GEMM's epilogue: atomics against ordered partials (issue 22).

    python3 benchmarks/row_stats.py [--rounds 5] [--json out.json]

For each shape, bf16 ``C = A @ B + residual`` stored in bf16 and timed four ways with the
matmul kind's default (untuned) config: no statistics; with ``row_sum`` of ``C^2`` (an RMSNorm's
statistic); with ``row_sum`` of ``C`` and of ``C^2`` (a LayerNorm's); each in both summation
modes: fp32 atomics into one [M] vector (default) and per-tile partials summed in order after the
kernel (``EPILAB_DETERMINISTIC``, bitwise reproducible). Interleaved rounds of CUDA events with L2
flushed (and CUDA-graph replay for calls under 50 us), medians; every variant is checked against
float64 first. The cost of a statistic is its time over the plain GEMM's.
"""

from __future__ import annotations

import argparse

import torch
from rounds import comparable_ms, device_header, interleaved, save

from epilab import config
from epilab.templates import kinds
from epilab.templates.epilogue import Epilogue, acc, operand, ops
from epilab.templates.matmul import make_problem
from epilab.templates.verify import checked_launch

SHAPES = [(8192, 2048, 2048), (8192, 768, 3072), (4096, 4096, 4096), (1024, 2048, 2048)]


def epilogues() -> dict[str, Epilogue]:
    c = ops.cast(acc() + operand("res", "tile"), dtype="bfloat16")
    return {
        "none": Epilogue.build([(c, "bfloat16")]),
        "sumsq": Epilogue.build([(c, "bfloat16"), (c * c, "float32", "row_sum")]),
        "sum+sumsq": Epilogue.build(
            [(c, "bfloat16"), (c, "float32", "row_sum"), (c * c, "float32", "row_sum")]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda").to(torch.bfloat16).t()
        res = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        variants = {}
        for name, ep in epilogues().items():
            problem = make_problem(a, b, ep, {"res": res})
            cfg = kinds.default_config(problem)
            for ordered in (False, True) if ep.reductions else (False,):
                with config.patch(deterministic=ordered):
                    checked_launch(problem, cfg, a, b, {"res": res})
                    bound = kinds.bind(problem, cfg, a, b, {"res": res})
                label = f"{name} {'ordered' if ordered else 'atomic'}" if ep.reductions else name
                variants[label] = bound.run
        times = interleaved(variants, args.rounds)
        base = comparable_ms(times["none"])
        row = {"shape": [m, n, k], "config": cfg.short(), "times": times}
        row["cost"] = {name: comparable_ms(t) / base for name, t in times.items()}  # type: ignore[operator]
        rows.append(row)
        save(args.json, header, rows)
    print(f"\nGEMM + residual (bf16) with row statistics, untuned default config; {header}")
    names = list(rows[0]["times"])
    print("| M x N x K | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        cells = [f"{comparable_ms(r['times'][n]) * 1e3:.1f} us ({r['cost'][n]:.3f}x)" for n in names]
        print(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
