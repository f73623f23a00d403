"""What statistics cost in a template's epilogue: atomics against ordered partials (issue 22).

    python3 benchmarks/row_stats.py [--rounds 5] [--json out.json]

For each case, bf16 ``C = A @ B + residual`` (matmul, gemv) or ``C = conv2d(x, w) + residual``
(conv2d) stored in bf16 and timed with the kind's default (untuned) config: no statistics;
``row_sum`` of ``C^2`` (an RMSNorm's statistic; a conv's per pixel); ``row_sum`` of ``C`` and of
``C^2`` (a LayerNorm's); ``col_sum`` of ``C`` (per column; a conv's global pool per channel);
each in both summation modes: fp32 atomics into one vector (default) and per-tile partials
summed in order after the kernel (``EPILAB_DETERMINISTIC``, bitwise reproducible).
Interleaved rounds of CUDA events with L2 flushed (and CUDA-graph replay for calls under
50 us), medians; every variant is checked against float64 first. The cost of a statistic is
its time over the plain kernel's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from rounds import comparable_ms, device_header, interleaved, save

from epilab import config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import Problem
from epilab.templates import kinds
from epilab.templates.conv2d import make_conv_problem
from epilab.templates.matmul import make_problem
from epilab.templates.verify import checked_launch

GEMMS = [(8192, 2048, 2048), (8192, 768, 3072), (4096, 4096, 4096), (1024, 2048, 2048)]
GEMVS = [(8, 4096, 4096), (1, 11008, 4096)]
# (n, c, h, w, k, r, padding): ResNet-50 stages at batch 32
CONVS = [(32, 64, 56, 56, 64, 3, 1), (32, 512, 7, 7, 2048, 1, 0), (32, 256, 14, 14, 256, 3, 1)]

Case = tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, Callable[[Epilogue], Problem]]


def epilogues() -> dict[str, Epilogue]:
    c = ops.cast(acc() + operand("res", "tile"), dtype="bfloat16")
    return {
        "none": Epilogue.build([(c, "bfloat16")]),
        "sumsq": Epilogue.build([(c, "bfloat16"), (c * c, "float32", "row_sum")]),
        "sum+sumsq": Epilogue.build(
            [(c, "bfloat16"), (c, "float32", "row_sum"), (c * c, "float32", "row_sum")]
        ),
        "colsum": Epilogue.build([(c, "bfloat16"), (c, "float32", "col_sum")]),
    }


def cases() -> list[Case]:
    """(label, A, B, residual, problem of an epilogue) of every shape: matmul, gemv, conv2d."""
    bf16 = torch.bfloat16
    made: list[Case] = []
    for template, shapes in (("matmul", GEMMS), ("gemv", GEMVS)):
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda").to(bf16)
            b = torch.randn(n, k, device="cuda").to(bf16).t()
            res = torch.randn(m, n, device="cuda").to(bf16)

            def mm(ep: Epilogue, a=a, b=b, res=res, template=template) -> Problem:
                return kinds.for_template(make_problem(a, b, ep, {"res": res}), template)

            made.append((f"{template} {m}x{n}x{k}", a, b, res, mm))
    for n, c, h, w, k, r, pad in CONVS:
        x = torch.randn(n, c, h, w, device="cuda").to(bf16).contiguous(memory_format=torch.channels_last)
        wt = (torch.randn(k, c, r, r, device="cuda") / (c * r * r) ** 0.5).to(bf16)
        wt = wt.contiguous(memory_format=torch.channels_last)
        res = torch.randn(n, k, h, w, device="cuda").to(bf16).contiguous(memory_format=torch.channels_last)

        def conv(ep: Epilogue, x=x, wt=wt, res=res, pad=pad) -> Problem:
            return make_conv_problem(x, wt, ep, {"res": res}, padding=pad)

        made.append((f"conv2d {n}x{c}x{h}x{w}->{k} {r}x{r}", x, wt, res, conv))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    rows = []
    for label, a, b, res, problem_of in cases():
        variants = {}
        for name, ep in epilogues().items():
            problem = problem_of(ep)
            cfg = kinds.default_config(problem)
            for ordered in (False, True) if ep.reductions else (False,):
                with config.patch(deterministic=ordered):
                    checked_launch(problem, cfg, a, b, {"res": res})
                    bound = kinds.bind(problem, cfg, a, b, {"res": res})
                mode = f" {'ordered' if ordered else 'atomic'}" if ep.reductions else ""
                variants[name + mode] = bound.run
        times = interleaved(variants, args.rounds)
        base = comparable_ms(times["none"])
        row = {"case": label, "config": cfg.short(), "times": times}
        row["cost"] = {name: comparable_ms(t) / base for name, t in times.items()}  # type: ignore[operator]
        rows.append(row)
        save(args.json, header, rows)
    print(f"\nGEMM / GEMV / conv + residual (bf16) with statistics, untuned default config; {header}")
    names = list(rows[0]["times"])
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        cells = [f"{comparable_ms(r['times'][n]) * 1e3:.1f} us ({r['cost'][n]:.3f}x)" for n in names]
        print(f"| {r['case']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
