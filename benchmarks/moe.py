"""The grouped GEMM kinds on the `moe` suite: every expert's projection in one grouped kernel
with its epilogue fused, against torch._grouped_mm (CUTLASS on Hopper) + the eager epilogue,
Inductor (which keeps torch._grouped_mm and fuses the epilogue), Inductor max-autotune (its own
grouped-mm Triton template) and an eager loop over the experts, in one process.

    python3 benchmarks/moe.py [--only 0-9] [--rounds 3] [--routing router|skewed] \
        [--max-autotune-from 8192] [--json out.json]

Method. The rows are tokens x topk, routed as a model's router routes them (``router``: the
top-k of random logits per token, the rows sorted by expert; ``skewed``: the tuner's draw,
``grouped_matmul.draw_offsets``). FLOPs = 2 T N K per product (two for the dual); bytes = A +
every expert's B (B2) + the output (the floor a fused kernel must move). For each problem a
fixed sweep (the kind's default config and its seeds, the feasible ones) is checked against
the float64 reference and timed once (CUDA events, L2 flushed); the best config and every
baseline are then timed in ``--rounds`` interleaved rounds (events with L2 flushed before each
repetition; calls under 50 us, and every call of a problem whose kernel is under 50 us, by
CUDA-graph replay as well: like with like). Reported: the median of the rounds' medians and
their min..max. Inductor's baselines compile the same eager code (``tuner/evaluate``:
torch._grouped_mm, then the epilogue with each per-expert operand gathered at its rows);
max-autotune (without its CUDA graphs) only from ``--max-autotune-from`` rows. The eager loop
slices each expert's rows with offsets read on the host once, before timing.

Routed problems (``--suite moe-routed``: A's rows gathered from the tokens in the kernel, or
the output rows added back to their tokens) are timed against the same baselines on the
unfused routing (a gathered copy ``x[token]``, ``index_add_``: what the problem's
``grouped_mm`` baseline and Inductor's compile of it run) and against epilab's own unrouted
kernel with torch's gather or ``index_add_`` around it ("epilab unrouted"); no eager loop
and no GEMM-alone rows for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable

import torch
from rounds import (
    comparable_ms,
    device_header,
    geomean,
    interleaved,
    only,
    print_saved,
    save,
    spread_text,
    timed,
)

from epilab.ir import dtypes
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.space import DeviceLimits, infeasible
from epilab.policy.suites import suite
from epilab.templates.grouped.grouped_geometry import GATHER, SCATTER, experts_of, geometry_of
from epilab.templates.grouped.grouped_matmul import OFFS
from epilab.templates.grouped.grouped_reference import draw_offsets, grouped_reference, row_ranges
from epilab.templates.grouped.grouped_spec import GroupedSpec
from epilab.templates.registry import bind, default_config, kind_of
from epilab.tuner.evaluate import baseline_fn

EXTRA = (  # beyond the kinds' seeds: deeper K steps and wider tiles
    Config(128, 256, 64, 8, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent"),
    Config(64, 256, 64, 8, num_warps=8, num_stages=4, variant="tma_persistent"),
    Config(64, 64, 128, 8, num_warps=4, num_stages=4, variant="tma"),
)


def routed_offsets(tokens: int, topk: int, experts: int, how: str, gen: torch.Generator) -> torch.Tensor:
    return routed(tokens, topk, experts, how, gen)[0]


def routed(
    tokens: int, topk: int, experts: int, how: str, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The offsets, and each row's token (the rows sorted by expert; None for ``skewed``)."""
    if how == "skewed":
        return draw_offsets(tokens * topk, experts, torch.device("cuda"), gen), None
    logits = torch.randn(tokens, experts, generator=gen, device="cuda")
    chosen = logits.topk(topk, dim=1).indices.flatten()
    token = (torch.argsort(chosen, stable=True) // topk).to(torch.int32)
    return torch.cumsum(torch.bincount(chosen, minlength=experts), 0).to(torch.int32), token


def inputs(problem: Problem, spec: GroupedSpec, how: str, seed: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    s, e, g = problem.shape, experts_of(problem), geometry_of(problem)
    t, n, k = int(s.m), int(s.n), int(s.k)
    dt = dtypes.torch_dtype(problem.dtype)
    a = torch.randn(spec.tokens if g.gather else t, k, generator=gen, device="cuda").to(dt)

    def weight() -> torch.Tensor:  # [E, N, K] as nn.Linear stores it, seen as [E, K, N]
        return (torch.randn(e, n, k, generator=gen, device="cuda") / math.sqrt(k)).to(dt).transpose(-1, -2)

    offs, token = routed(spec.tokens, spec.topk, e, "router" if g.routed else how, gen)
    call = {OFFS: offs}
    call.update({name: token for name in g.routing_inputs()})  # "add" and gather: each row's token
    if problem.op == "dual_grouped_mm":
        call["b2"] = weight()
    for name, broadcast in problem.epilogue.operands:
        call[name] = torch.rand((t, 1) if broadcast == "col" else (e, 1, n), generator=gen, device="cuda").to(
            dt
        )
    return a, weight(), call


def candidates(problem: Problem, limits: DeviceLimits) -> list[Config]:
    kind, seen = kind_of(problem), []
    for c in (default_config(problem, sm_count=limits.sm_count), *kind.seeds, *EXTRA):
        if c not in seen and infeasible(problem, c, limits) is None:
            seen.append(c)
    return seen


def best_alone(
    plain: Problem,
    dual: Problem,
    call: dict,
    a: torch.Tensor,
    b: torch.Tensor,
    sweep: list[dict],
    limits: DeviceLimits,
) -> Config:
    """The fastest of the grouped kind's default config and the dual sweep's 3 best, each timed
    once (events, L2 flushed) on the GEMM alone."""
    ranked = sorted(sweep, key=lambda r: r["graph_ms"] or r["ms"])[:3]
    tried = [default_config(plain, sm_count=limits.sm_count)]
    for r in ranked:
        c = next(c for c in candidates(dual, limits) if c.short() == r["config"])
        if c not in tried and infeasible(plain, c, limits) is None:
            tried.append(c)
    times = {c: timed(bind(plain, c, a, b, {OFFS: call[OFFS]}).run)[0] for c in tried}
    return min(times, key=times.get)


def eager_loop(problem: Problem, a: torch.Tensor, b: torch.Tensor, call: dict) -> Callable[[], object]:
    """The per-expert loop a user writes: torch.mm on each expert's rows, the epilogue on them."""
    ranges = row_ranges(call[OFFS], a.shape[0])
    ep = problem.epilogue
    per_expert = {name: call[name] for name, _ in ep.operands}
    out = torch.empty((a.shape[0], b.shape[2]), dtype=a.dtype, device=a.device)

    def run() -> torch.Tensor:
        for e, (lo, hi) in enumerate(ranges):
            if hi > lo:
                x = a[lo:hi]
                ops = {name: t[e] if t.dim() == 3 else t[lo:hi] for name, t in per_expert.items()}
                acc2 = x @ call["b2"][e] if "b2" in call else None
                out[lo:hi] = ep.evaluate(x @ b[e], ops, acc2=acc2)[0]
        return out

    return run


def run_spec(index: int, spec: GroupedSpec, args: argparse.Namespace, limits: DeviceLimits) -> dict:
    problem = spec.problem()
    s = problem.shape
    t, n, k = int(s.m), int(s.n), int(s.k)
    dual = problem.op == "dual_grouped_mm"
    a, b, call = inputs(problem, spec, args.routing, index)
    refs = grouped_reference(problem, a, b, call)
    sweep = []
    for c in candidates(problem, limits):
        try:
            bound = bind(problem, c, a, b, call)
            bound.run()
            torch.cuda.synchronize()
        except Exception as exc:  # a config the compiler refuses: noted, not fatal
            sweep.append({"config": c.short(), "error": str(exc)[:200]})
            continue
        err = rel_error(bound.outs[0], refs[0])
        if not err <= 1e-2:
            sweep.append({"config": c.short(), "error": f"rel error {err:.3e}"})
            continue
        events, graph = timed(bound.run)
        sweep.append({"config": c.short(), "ms": events, "graph_ms": graph, "error_vs_fp64": err})
        print(f"  {c.short()}: {events:.4f} ms" + (f" (graph {graph:.4f})" if graph else ""), file=sys.stderr)
    ok = [r for r in sweep if "ms" in r]
    if not ok:
        return {"problem": spec.label(), "error": "no config passed", "sweep": sweep}
    best = min(ok, key=lambda r: r["graph_ms"] or r["ms"])
    config = next(c for c in candidates(problem, limits) if c.short() == best["config"])
    ours = bind(problem, config, a, b, call)
    eager = baseline_fn(problem, "grouped_mm")
    base_err = rel_error(eager(a, b, call)[0].to(a.dtype), refs[0])
    del refs
    variants: dict[str, Callable[[], object]] = {"epilab": ours.run}
    variants["grouped_mm + eager"] = lambda: eager(a, b, call)
    inductor = baseline_fn(problem, "inductor")
    inductor(a, b, call)
    variants["inductor"] = lambda: inductor(a, b, call)
    if t >= args.max_autotune_from:
        tuned = baseline_fn(problem, "inductor-max-autotune")
        tuned(a, b, call)
        variants["max-autotune"] = lambda: tuned(a, b, call)
    if geometry_of(problem).routed:
        variants["epilab unrouted"] = unrouted(spec, problem, config, a, b, call, limits)
        return result(index, spec, problem, config, config, call, a, base_err, sweep, variants, args, best)
    variants["eager loop"] = eager_loop(problem, a, b, call)
    # the GEMM alone (no epilogue) against torch._grouped_mm: a down projection's on its best
    # config, a gate's on the best of the grouped kind's default and the dual's 3 best configs
    plain = GroupedSpec(spec.experts, spec.tokens, n, k, spec.topk, spec.dtype, spec.layout).problem()
    alone_config = config if not dual else best_alone(plain, problem, call, a, b, ok, limits)
    alone = bind(plain, alone_config, a, b, {OFFS: call[OFFS]})
    variants["epilab alone"] = alone.run
    variants["grouped_mm alone"] = lambda: torch._grouped_mm(a, b, offs=call[OFFS])
    return result(index, spec, problem, config, alone_config, call, a, base_err, sweep, variants, args, best)


def unrouted(
    spec: GroupedSpec,
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    call: dict,
    limits: DeviceLimits,
) -> Callable[[], object]:
    """epilab's kernel of the same problem without its routing, with torch's gather
    (``x[token]``) before it or ``index_add_`` after it: the faster of its default config
    and the routed problem's best, each timed once."""
    g = geometry_of(problem)
    plain = dataclasses.replace(spec, gather=False, scatter="").problem()
    token = call.get(GATHER, call.get(SCATTER))
    rest = {name: x for name, x in call.items() if name not in (GATHER, SCATTER)}
    rows = a[token] if g.gather else a
    tried = [default_config(plain, sm_count=limits.sm_count)]
    if config not in tried and infeasible(plain, config, limits) is None:
        tried.append(config)
    times = {c: timed(bind(plain, c, rows, b, rest).run)[0] for c in tried}
    chosen = min(times, key=times.get)

    def run() -> object:
        x = a[token] if g.gather else a
        (y,) = _launch(plain, chosen, x, b, rest)
        if g.scatter == "add":
            return torch.zeros((spec.tokens, y.shape[1]), dtype=y.dtype, device=y.device).index_add_(
                0, token, y
            )
        return y

    return run


def _launch(problem: Problem, config: Config, a: torch.Tensor, b: torch.Tensor, call: dict) -> tuple:
    bound = bind(problem, config, a, b, call)
    bound.run()
    return bound.outs


def result(
    index: int,
    spec: GroupedSpec,
    problem: Problem,
    config: Config,
    alone_config: Config,
    call: dict,
    a: torch.Tensor,
    base_err: float,
    sweep: list,
    variants: dict,
    args: argparse.Namespace,
    best: dict,
) -> dict:
    s = problem.shape
    t, n, k, e = int(s.m), int(s.n), int(s.k), experts_of(problem)
    dual = problem.op == "dual_grouped_mm"
    times = interleaved(variants, args.rounds, graph=best["graph_ms"] is not None)
    counts = torch.diff(call[OFFS], prepend=call[OFFS].new_zeros(1)).tolist()
    esize = a.element_size()
    return {
        "index": index,
        "problem": spec.label(),
        "rows": t,
        "tokens": spec.tokens,
        "dual": dual,
        "experts": e,
        "rows_per_expert": [min(counts), max(counts)],
        "flops": (4 if dual else 2) * t * n * k,
        "bytes": (t * k + (2 if dual else 1) * e * k * n + t * n) * esize,
        "config": config.short(),
        "alone_config": alone_config.short(),
        "grouped_mm_error_vs_fp64": base_err,
        "sweep": sweep,
        "times": times,
    }


NAMES = ["grouped_mm + eager", "inductor", "max-autotune", "eager loop", "epilab unrouted"]


def alone_ratio(r: dict) -> float | None:
    """torch._grouped_mm over epilab, both without an epilogue."""
    t = r["times"]
    return (
        comparable_ms(t["grouped_mm alone"]) / comparable_ms(t["epilab alone"])
        if "epilab alone" in t
        else None
    )


def table(results: list[dict]) -> str:
    lines = [
        "| problem | rows/expert | epilab ms (TFLOP/s) | config | "
        + " | ".join(f"{x} ms" for x in NAMES)
        + " | "
        + " | ".join(f"vs {x}" for x in NAMES)
        + " | GEMM alone: epilab ms | vs grouped_mm |",
        "|---|---|---:|---|" + "---:|" * (2 * len(NAMES) + 2),
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['problem']} | {r['error']} |")
            continue
        t = r["times"]
        ours = comparable_ms(t["epilab"])
        replayed = t["epilab"]["graph_ms"] is not None
        star = "*" if replayed else ""
        cells = [f"{comparable_ms(t[x]):.4f}" if t.get(x) else "-" for x in NAMES]
        ratios = [f"{comparable_ms(t[x]) / ours:.2f}x" if t.get(x) else "-" for x in NAMES]
        lines.append(
            f"| {r['problem']} | {r['rows_per_expert'][0]}-{r['rows_per_expert'][1]} | {ours:.4f}{star}"
            f"{spread_text(t['epilab'], replayed)} ({r['flops'] / (ours * 1e-3) / 1e12:.0f}) "
            f"| {r['config']} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(ratios)
            + (
                f" | {comparable_ms(t['epilab alone']):.4f} | {alone_ratio(r):.2f}x |"
                if "epilab alone" in t
                else " | - | - |"
            )
        )
    lines.append("")
    lines.append("`*`: CUDA-graph replay (calls under 50 us); [min-max] of the rounds' event medians.")
    ratios = [x for r in results if "error" not in r and (x := alone_ratio(r)) is not None]
    if ratios:
        lines.append(
            f"- the GEMM alone vs torch._grouped_mm: geomean {geomean(ratios):.3f}x "
            f"(min {min(ratios):.3f}x, n={len(ratios)})"
        )
    for label, pick in (
        ("grouped GEMM (down projection), all tokens", lambda r: not r["dual"]),
        ("dual grouped + SiLU*mul, 4096 tokens and above", lambda r: r["dual"] and r["tokens"] >= 4096),
        ("dual grouped + SiLU*mul, all tokens", lambda r: r["dual"]),
    ):
        chosen = [r for r in results if "error" not in r and pick(r)]
        parts = []
        for x in NAMES:
            xs = [
                comparable_ms(r["times"][x]) / comparable_ms(r["times"]["epilab"])
                for r in chosen
                if r["times"].get(x)
            ]
            if xs:
                parts.append(f"vs {x} {geomean(xs):.3f}x (min {min(xs):.3f}x, n={len(xs)})")
        if parts:
            lines.append(f"- {label}: " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="moe")
    parser.add_argument("--only", help="1-based spec numbers, e.g. 4-5,9")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--routing", choices=("router", "skewed"), default="router")
    parser.add_argument(
        "--max-autotune-from", type=int, default=8192, help="fewest rows timed with max-autotune"
    )
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    limits = DeviceLimits.of(torch.device("cuda"))
    header = device_header(limits.sm_count)
    specs = suite(args.suite)
    results = []
    for i in only(args.only, len(specs)):
        print(f"[{i}] {specs[i].label()}", file=sys.stderr)
        results.append(run_spec(i, specs[i], args, limits))
        save(args.json, header, results)
        torch.cuda.empty_cache()
    print(header)
    print(table(results))


if __name__ == "__main__":
    main()
