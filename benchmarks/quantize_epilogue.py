"""The quantize-activation step fused into the GEMM that produces the activation (issue 44),
against the same GEMM storing bf16 followed by a separate quantize kernel, in one process.

    python3 benchmarks/quantize_epilogue.py [--rounds 5] [--only 0-3] [--json out.json]

Cases: the gated gate/up GEMM of a dense MLP (SwiGLU: silu(x @ gate.T) * (x @ up.T)) whose
output the down projection reads block-scaled, so it is quantized per token and 128 channels
(DeepSeek-V3 / transformers' ``FineGrainedFP8Config``): DeepSeek-V3's dense MLP (d 7168, f
18432) and Llama-3-8B's (d 4096, f 14336), bf16, M 2048 and 8192.

Sides, each timed alike:
- ``fused``: epilab's dual GEMM with the quantization in its epilogue (``gated_matmul(...,
  quantize=128)``): writes q (e4m3) and its scales, never h;
- ``epilab + quantize``: the same dual GEMM storing h in bf16, then the quantize step
  compiled by Inductor (one kernel: reads h, writes q and the scales);
- ``quantize alone``: that Inductor kernel by itself (what the fusion can save at most);
- ``inductor``: torch.compile of the whole unfused step (cuBLAS for both GEMMs, one fused
  kernel for silu * up and the quantization).

Method. Each epilab side takes the best of a fixed sweep (the dual kind's default config and
its seeds that hold whole groups, each checked against the float64 reference once); then every
side is timed in ``--rounds`` interleaved rounds (CUDA events, L2 flushed before each
repetition): median of the rounds' medians, spread min..max. Bytes: the fused kernel writes
M x f x (1 + 4/128); unfused, h is written and read again in bf16 (4 bytes an element more).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from rounds import device_header, only, print_saved, save

from epilab.ir.epilogue import Epilogue, acc, acc2, ops
from epilab.ir.quantize import quantized_groups
from epilab.policy.space import DeviceLimits, infeasible
from epilab.templates.gemm.dual_matmul import make_dual_problem
from epilab.templates.registry import bind, default_config, kind_of
from epilab.tuner.timing import time_cuda

GROUP = 128
CASES = [  # (label, M, d, f)
    ("DeepSeek-V3 dense MLP", 2048, 7168, 18432),
    ("DeepSeek-V3 dense MLP", 8192, 7168, 18432),
    ("Llama-3-8B MLP", 2048, 4096, 14336),
    ("Llama-3-8B MLP", 8192, 4096, 14336),
]


def quantize(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the unfused graph runs after the GEMM (tests/zoo/quantized.py's Fp8BlockLinear)."""
    groups = h.unflatten(-1, (-1, GROUP)).float()
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448
    return (groups / scale).to(torch.float8_e4m3fn).flatten(-2), scale.squeeze(-1)


def unfused(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize(torch.nn.functional.silu(x @ gate.t()) * (x @ up.t()))


def best_config(problem, x, gate, up, limits) -> tuple[dict, list[dict]]:
    """The fastest of the default config and the kind's seeds (checked once each)."""
    kind = kind_of(problem)
    configs = [default_config(problem, sm_count=limits.sm_count)]
    configs += [
        c
        for c in kind.seeds
        if c not in configs
        and kind.config_error(problem, c) is None
        and infeasible(problem, c, limits) is None
    ]
    refs = kind.reference(problem, x, gate.t(), {"b2": up.t()})
    rows = []
    for c in configs:
        bound = bind(problem, c, x, gate.t(), {"b2": up.t()})
        bound.run()
        errors = [
            (o.double() - r.to(o.device)).norm().item() / max(r.norm().item(), 1e-30)
            for o, r in zip(bound.outs, refs, strict=True)
        ]
        if max(errors) > 6e-2:
            rows.append({"config": c.short(), "error": f"relative error {max(errors):.2e}"})
            continue
        rows.append({"config": c.short(), "ms": time_cuda(bound.run, rep_ms=40).median_ms, "obj": c})
        print(f"  {c.short()}: {rows[-1]['ms']:.4f} ms", file=sys.stderr)
    ok = [r for r in rows if "ms" in r]
    return min(ok, key=lambda r: r["ms"]), [{k: v for k, v in r.items() if k != "obj"} for r in rows]


def run_case(label: str, m: int, d: int, f: int, rounds: int, limits: DeviceLimits) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(m + d)
    x = torch.randn(m, d, device="cuda", generator=gen).to(torch.bfloat16)
    gate, up = (
        torch.randn(f, d, device="cuda", generator=gen).div(d**0.5).to(torch.bfloat16) for _ in range(2)
    )
    swiglu = Epilogue.build([(ops.silu(acc()) * acc2(), "bfloat16")])
    plain = make_dual_problem(x, gate.t(), up.t(), swiglu, {})
    fused = make_dual_problem(x, gate.t(), up.t(), quantized_groups(swiglu, GROUP), {})
    best_fused, swept_fused = best_config(fused, x, gate, up, limits)
    best_plain, swept_plain = best_config(plain, x, gate, up, limits)
    run_fused = bind(fused, best_fused["obj"], x, gate.t(), {"b2": up.t()}).run
    run_plain = bind(plain, best_plain["obj"], x, gate.t(), {"b2": up.t()})
    h = run_plain.outs[0]
    torch._dynamo.reset()  # each case compiled for its own static shapes
    compiled_quantize = torch.compile(quantize, dynamic=False)
    compiled_unfused = torch.compile(unfused, dynamic=False)
    sides = {
        "fused": run_fused,
        "epilab + quantize": lambda: (run_plain.run(), compiled_quantize(h)),
        "quantize alone": lambda: compiled_quantize(h),
        "inductor": lambda: compiled_unfused(x, gate, up),
    }
    for fn in sides.values():  # compile and warm up
        fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            times[name].append(time_cuda(fn, rep_ms=60).median_ms)
    flops = 2 * 2 * m * d * f
    return {
        "case": label,
        "m": m,
        "d": d,
        "f": f,
        "flops": flops,
        "bytes_saved": 4 * m * f,
        "fused_config": best_fused["config"],
        "plain_config": best_plain["config"],
        "sweep": {"fused": swept_fused, "plain": swept_plain},
        "times": {n: {"ms": statistics.median(t), "spread": [min(t), max(t)]} for n, t in times.items()},
    }


def table(results: list[dict]) -> str:
    lines = [
        "| case | M x d x f | fused ms [spread] (TFLOP/s) | epilab + quantize ms | quantize alone ms "
        "| inductor ms | saved ms (of the quantize kernel's) | fused vs epilab + quantize "
        "| fused vs inductor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = {n: v["ms"] for n, v in r["times"].items()}
        lo, hi = r["times"]["fused"]["spread"]
        saved = t["epilab + quantize"] - t["fused"]
        lines.append(
            f"| {r['case']} | {r['m']}x{r['d']}x{r['f']} | {t['fused']:.4f} [{lo:.4f}-{hi:.4f}] "
            f"({r['flops'] / t['fused'] / 1e9:.0f}) | {t['epilab + quantize']:.4f} "
            f"| {t['quantize alone']:.4f} | "
            f"{t['inductor']:.4f} | {saved:.4f} ({saved / t['quantize alone']:.0%}) | "
            f"{t['epilab + quantize'] / t['fused']:.2f}x | {t['inductor'] / t['fused']:.2f}x |"
        )
    lines.append("")
    lines.append(
        "Configs: "
        + "; ".join(
            f"{r['m']}x{r['f']}: fused {r['fused_config']}, plain {r['plain_config']}" for r in results
        )
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", help="1-based case numbers, e.g. 1-2,4")
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    limits = DeviceLimits.of(torch.device("cuda"))
    header = device_header(limits.sm_count)
    results = []
    with torch.no_grad():
        for i in only(args.only, len(CASES)):
            print(f"[{i}] {CASES[i]}", file=sys.stderr)
            results.append(run_case(*CASES[i], args.rounds, limits))
            save(args.json, header, results)
            torch.cuda.empty_cache()
    print(header)
    print(table(results))


if __name__ == "__main__":
    main()
