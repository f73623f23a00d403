"""Split-K and stream-K on the matmul template, split-K on conv2d: problems with few output
tiles or a short last wave (small cubes, mid-M projections, late ResNet convolutions) against
the vendor library (cuBLAS, cuDNN) + the eager epilogue, cuDNN's convolution alone, and
Inductor, in one process.

    python3 benchmarks/split_k.py [--suite midm|square|conv] [--only 0-4] [--rounds 3] [--max-autotune] \
        [--json out.json]

Method. FLOPs = 2 x batch x MNK (a convolution's implicit GEMM); bytes = A + B as stored +
operands + outputs. For each problem a fixed sweep —
the kind's default config and its feasible seeds without split-K, then split-K configs
(the seeds with SPLIT_K > 1 and ``SPLIT_SWEEP``, those ``policy/space.infeasible`` accepts on
this device: split-K only where the output tiles underfill the SMs), then stream-K configs
(the seeds with a stream-K variant and ``STREAM_K_SWEEP``, where a last wave would idle) — is
checked against the float64 reference and timed once (CUDA events, L2 flushed before each
repetition). Then the best config of each group (no split, split-K, stream-K), cuBLAS + eager
epilogue, Inductor (and with
``--max-autotune`` Inductor max-autotune without CUDA graphs) are timed in ``--rounds``
interleaved rounds: median of the rounds' medians, spread = min..max of the rounds'
medians. Calls under 50 us are also timed by CUDA-graph replay in every later round (``*`` in
the table), which is the time compared for them; where epilab's best kernel is that short,
every side of the problem is replayed from the first round (like with like: an eager or
compiled baseline's host work must not be what its events time).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rounds import (
    comparable_ms,
    device_header,
    geomean,
    interleaved,
    only,
    print_saved,
    save,
    suite_arguments,
    timed,
)

from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.space import DeviceLimits, infeasible
from epilab.policy.suites import suite
from epilab.templates.gemm.matmul_config import STREAM_K_VARIANTS
from epilab.templates.registry import bind, default_config, kind_of
from epilab.templates.verify import failure, output_errors, random_inputs
from epilab.tuner.evaluate import baseline_fn
from epilab.tuner.tune import input_bytes

NO_SPLIT_SEEDS = 6  # the first feasible seeds without split-K (the Hopper loops come first)

SPLIT_SWEEP = tuple(
    Config(bm, bn, 64, 8, split, num_warps=w, num_stages=4, variant=v)
    for bm, bn, w, v in (
        (128, 128, 8, "tma"),
        (128, 64, 4, "default"),
        (64, 128, 4, "tma"),
        (128, 128, 8, "default"),  # the default loop's (conv2d has no other)
        (64, 128, 4, "default"),
    )
    for split in (2, 4, 8, 16)
)


STREAM_K_SWEEP = tuple(
    Config(bm, bn, 64, 8, num_warps=w, num_stages=st, variant=v)
    for bm, bn, w, st in ((128, 256, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4), (64, 128, 4, 4))
    for v in ("tma_stream_k", "stream_k")
)


def candidates(problem: Problem, limits: DeviceLimits) -> dict[str, list[Config]]:
    """Configs without split-K, with it, and stream-K ones, each feasible on this device."""
    kind = kind_of(problem)
    plain = [default_config(problem, sm_count=limits.sm_count)]
    for c in kind.seeds:
        if len(plain) > NO_SPLIT_SEEDS:
            break
        if c.SPLIT_K == 1 and c not in plain and infeasible(problem, c, limits) is None:
            plain.append(c)
    split, stream = [], []
    for c in (*kind.seeds, *SPLIT_SWEEP, *STREAM_K_SWEEP):
        group = split if c.SPLIT_K > 1 else stream if c.variant in STREAM_K_VARIANTS else None
        if group is not None and c not in group and infeasible(problem, c, limits) is None:
            group.append(c)
    return {"plain": plain, "split": split, "stream": stream}


def sweep(problem: Problem, configs: list[Config], a, b, ops, refs) -> list[dict]:
    out = []
    for c in configs:
        try:
            bound = bind(problem, c, a, b, ops)
            bound.run()
            torch.cuda.synchronize()
        except Exception as e:  # a config the compiler refuses: noted, not fatal
            out.append({"config": c.short(), "error": str(e)[:200]})
            continue
        why = failure(output_errors(problem, bound.outs, refs))
        if why is not None:
            out.append({"config": c.short(), "error": why})
            continue
        events, graph = timed(bound.run)
        out.append({"config": c.short(), "ms": events, "graph_ms": graph, "obj": c})
        print(f"  {c.short()}: {events:.4f} ms" + (f" (graph {graph:.4f})" if graph else ""), file=sys.stderr)
    return out


def run_problem(index: int, problem: Problem, label: str, args: argparse.Namespace, limits) -> dict:
    a, b, ops = random_inputs(problem, "cuda", index)
    refs = kind_of(problem).reference(problem, a, b, ops)
    groups = candidates(problem, limits)
    swept = {name: sweep(problem, configs, a, b, ops, refs) for name, configs in groups.items()}
    del refs
    variants: dict[str, Callable[[], object]] = {}
    chosen = {}
    bests = []
    for name, rows in swept.items():
        ok = [r for r in rows if "ms" in r]
        if ok:
            best = min(ok, key=comparable_ms)
            bests.append(best)
            chosen[name] = best["config"]
            variants[name] = bind(problem, best["obj"], a, b, ops).run
    eager = baseline_fn(problem, kind_of(problem).library)
    variants["vendor + eager"] = lambda: eager(a, b, ops)
    if problem.geometry is not None:  # cuDNN's convolution without the epilogue
        g = problem.geometry
        variants["cudnn alone"] = lambda: F.conv2d(a, b, None, g.stride, g.padding, g.dilation, g.groups)
    inductor = baseline_fn(problem, "inductor")
    inductor(a, b, ops)
    variants["inductor"] = lambda: inductor(a, b, ops)
    if args.max_autotune:
        tuned = baseline_fn(problem, "inductor-max-autotune")
        tuned(a, b, ops)
        variants["max-autotune"] = lambda: tuned(a, b, ops)
    # like with like: where epilab's best kernel is short, every side is replayed in CUDA graphs
    short = any(r["graph_ms"] is not None for r in bests)
    times = interleaved(variants, args.rounds, graph=short)
    s = problem.shape
    batch, m, n, k = int(s.batch), int(s.m), int(s.n), int(s.k)
    esize = a.element_size()
    result = {
        "index": index,
        "problem": label,
        "m": m,
        "n": n,
        "k": k,
        "flops": 2 * batch * m * n * k,
        "bytes": input_bytes(problem)
        + sum(t.numel() * t.element_size() for t in ops.values())
        + batch * m * n * esize,
        "chosen": chosen,
        "sweep": {
            name: [{k: v for k, v in r.items() if k != "obj"} for r in rows] for name, rows in swept.items()
        },
        "times": times,
    }
    return result


def _cell(ms: float | None, entry: dict | None, flops: int) -> str:
    """A group's best time (``*`` for CUDA-graph replay) and its TFLOP/s, or "-"."""
    if not ms or entry is None:
        return "-"
    return f"{ms:.4f}{'*' if entry['graph_ms'] else ''} ({flops / (ms * 1e-3) / 1e12:.0f})"


def table(results: list[dict]) -> str:
    names = ["vendor + eager", "cudnn alone", "inductor", "max-autotune"]
    lines = [
        "| problem | best no split ms | best split-K ms (TFLOP/s) | split-K config | best stream-K ms "
        + "(TFLOP/s) | stream-K config | "
        + " | ".join(f"{n} ms" for n in names)
        + " | best split or stream vs no split | best epilab vs vendor + eager | vs cuDNN alone"
        + " | vs Inductor | vs max-autotune |",
        "|---|---:|---:|---|---:|---|" + "---:|" * (2 * len(names) + 1),
    ]
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for r in results:
        t = r["times"]
        if "cublas + eager" in t:  # the name of the first runs' column
            t["vendor + eager"] = t.pop("cublas + eager")
        plain, split, stream = (comparable_ms(t.get(g)) for g in ("plain", "split", "stream"))
        best = min(v for v in (plain, split, stream) if v is not None)
        mark = lambda e: "*" if e and e["graph_ms"] else ""  # noqa: E731
        cells = [f"{comparable_ms(t[n]):.4f}{mark(t[n])}" if n in t else "-" for n in names]
        vs = []
        for n in names:
            if n in t:
                ratios[n].append(comparable_ms(t[n]) / best)
                vs.append(f"{comparable_ms(t[n]) / best:.2f}x")
            else:
                vs.append("-")
        other = min((v for v in (split, stream) if v is not None), default=None)
        gain = f"{plain / other:.2f}x" if other else "-"
        row = [
            r["problem"],
            f"{plain:.4f}{mark(t.get('plain'))}",
            _cell(split, t.get("split"), r["flops"]),
            r["chosen"].get("split", "-"),
            _cell(stream, t.get("stream"), r["flops"]),
            r["chosen"].get("stream", "-"),
        ]
        lines.append("| " + " | ".join([*row, *cells, gain, *vs]) + " |")
    lines.append("")
    lines.append("`*`: CUDA-graph replay (calls under 50 us); the rest CUDA events with L2 flushed.")
    parts = [f"vs {n} {geomean(xs):.3f}x (min {min(xs):.3f}x, n={len(xs)})" for n, xs in ratios.items() if xs]
    lines.append("- best epilab (no split, split-K or stream-K): " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    suite_arguments(parser, "midm")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    limits = DeviceLimits.of(torch.device("cuda"))
    specs = suite(args.suite)
    header = device_header(limits.sm_count)
    results = []
    for i in only(args.only, len(specs)):
        print(f"[{i}] {specs[i].label()}", file=sys.stderr)
        results.append(run_problem(i, specs[i].problem(), specs[i].label(), args, limits))
        torch.cuda.empty_cache()
        save(args.json, header, results)
    print(header)
    print(table(results))


if __name__ == "__main__":
    main()
