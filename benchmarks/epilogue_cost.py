"""What a fused epilogue costs, and the main loop against cuBLAS, class by class (issue 36).

    python3 benchmarks/epilogue_cost.py [--classes vit_s_fc1,bert_fc2] [--rounds 5]
        [--max-autotune] [--configs all|triton|sm90] [--json out.json] [--from-json out.json]

For each class (bf16, nn.Linear layout: A [M, K] row-major, B = W.T with W [N, K]) and each of
its epilogues, timed alike in interleaved rounds (CUDA-graph replay of calls over rotating input
sets that together outgrow L2; the median over rounds, and its min..max):

- ``cublas``: ``torch.mm`` alone, no epilogue (the main loop to beat);
- ``eager``: cuBLAS then the epilogue in eager torch;
- ``inductor``: ``torch.compile`` of that code (cuBLAS + Inductor's fused pointwise kernel);
- ``max-autotune`` (``--max-autotune``): Inductor's ``max-autotune-no-cudagraphs``;
- ``none``, ``exact``, ``fast``: epilab's fused kernel with one config (the best of a fixed
  sweep for the fused, fast epilogue): with no epilogue (the accumulator stored in bf16), with
  the epilogue's exact fp32 forms (``EPILAB_EXACT_MATH``), and with its fast forms;
- ``best_none``: the sweep's best config for no epilogue (the main loop at its best);
- the floors: the output written at the measured copy bandwidth, and 2MNK at the measured
  cuBLAS rate of 8192^3.

Every epilab config is checked against float64 (outputs NaN-poisoned) before it is timed.
The sweep (``CONFIGS``) is compiled in a process pool first. Prints a table; ``--json`` keeps
every number.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from rounds import device_header, geomean

from epilab import config as epilab_config
from epilab.ir.catalog import epilogue
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import bind
from epilab.templates.verify import checked_launch
from epilab.tuner.evaluate import baseline_fn
from epilab.tuner.timing import time_graph

# name: (M, N, K, epilogues). First projections of an MLP (N = 4K), second ones (K = 4N),
# 1024-class squares, long K at mid size, and the 8192x4096x512.
CLASSES: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "convnext_fc1": (25088, 384, 96, ("bias_gelu", "bias_gelu_tanh", "bias_silu")),
    "vit_s_fc1": (6272, 1536, 384, ("bias_gelu", "bias_gelu_tanh", "bias_silu")),
    "vit_s_fc1_3k": (3152, 1536, 384, ("bias_gelu", "bias_gelu_tanh")),  # the zoo's ViT (16 images)
    "bert_fc1": (4096, 3072, 768, ("bias_gelu", "bias_gelu_tanh", "bias_silu")),
    "convnext_fc2": (25088, 96, 384, ("residual", "bias_residual")),
    "vit_s_fc2": (6272, 384, 1536, ("residual", "bias_residual")),
    "bert_fc2": (4096, 768, 3072, ("residual", "bias_residual")),
    "square_1024": (1024, 1024, 1024, ("bias_gelu_tanh", "bias_residual")),
    "bert_attn_out": (1024, 768, 768, ("bias_residual",)),
    "long_k": (2048, 3072, 8192, ("residual", "bias_residual")),
    "issue_8192x4096x512": (8192, 4096, 512, ("bias_gelu", "bias_gelu_tanh")),
}


CONFIGS: dict[str, list[Config]] = {
    "triton": [
        Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
        Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma", EPILOGUE_SUBTILE=2),
        Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="tma"),
        Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma_persistent", PROGRAMS_PER_SM=2),
        Config(64, 128, 64, 8, num_warps=4, num_stages=4),
        # few tiles or a short last wave: stream-K and split-K
        Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma_stream_k"),
        Config(128, 64, 64, 8, num_warps=4, num_stages=4, variant="tma_stream_k"),
        Config(128, 128, 64, 8, 2, num_warps=8, num_stages=4, variant="tma"),
    ],
    "sm90": [
        Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1),
        Config(128, 128, 64, 8, num_warps=4, num_stages=5, variant="sm90_pingpong", TMA_STORE=0),
        Config(64, 256, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1),
        Config(128, 64, 64, 8, num_warps=4, num_stages=6, variant="sm90_pingpong", TMA_STORE=1),
        Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="sm90_persistent", TMA_STORE=1),
        Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="sm90_persistent", TMA_STORE=1),
    ],
}


@dataclass
class Case:
    label: str
    m: int
    n: int
    k: int
    epilogue: str


def inputs(case: Case, sets: int) -> list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]:
    """``sets`` input sets (A, B = W.T, operands) of the case, random bf16."""
    out = []
    for _ in range(sets):
        a = torch.randn(case.m, case.k, device="cuda").to(torch.bfloat16)
        w = (torch.randn(case.n, case.k, device="cuda") / math.sqrt(case.k)).to(torch.bfloat16)
        ops = {
            "bias": torch.randn(case.n, device="cuda").to(torch.bfloat16),
            "residual": torch.randn(case.m, case.n, device="cuda").to(torch.bfloat16),
        }
        out.append((a, w.t(), ops))
    return out


def problem_of(
    case: Case, name: str, x: tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
) -> Problem:
    ep = epilogue(name, "bfloat16")
    a, b, ops = x
    return make_problem(a, b, ep, {n: ops[n] for n, _ in ep.operands}, op="addmm" if "bias" in name else "mm")


def set_count(case: Case) -> int:
    """Input sets that together hold 3x the L2 (at most 16)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    per = 2 * (case.m * case.k + case.n * case.k + 2 * case.m * case.n)
    return max(1, min(16, math.ceil(3 * l2 / per)))


def _compile_one(item: tuple[str, dict | None, bool]) -> str:
    """In a pool process: bind and compile one (problem, config), or with no config compile the
    problem's Inductor baseline (fills Triton's and Inductor's disk caches)."""
    problem_json, config, exact = item
    from epilab.templates.verify import random_inputs

    problem = Problem.from_json(problem_json)
    x = random_inputs(problem, "cuda", 0)
    with epilab_config.patch(exact_math=exact):
        try:
            if config is None:
                base = baseline_fn(problem, "inductor")
                assert base is not None
                base(*x)
            else:
                bind(problem, Config.from_dict(config), *x).compile()
        except Exception as e:  # reported, and the config is skipped when checked
            return f"{type(e).__name__}: {str(e)[:200]}"
    return "ok"


def precompile(items: list[tuple[Problem, Config | None, bool]]) -> None:
    start = time.time()
    work = [(p.to_json(), None if c is None else c.to_dict(), exact) for p, c, exact in items]
    # spawned, not forked: this process has initialised CUDA
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4), mp_context=context) as pool:
        results = list(pool.map(_compile_one, work))
    bad = [r for r in results if r != "ok"]
    print(f"# compiled {len(work)} kernels in {time.time() - start:.0f} s ({len(bad)} failed)", flush=True)
    for why in sorted(set(bad))[:5]:
        print(f"#   {why}", flush=True)


def checked(problem: Problem, config: Config, x: tuple, exact: bool = False) -> Callable[[], object] | None:
    """A launch of ``problem`` tiled by ``config`` on input set ``x`` after a float64 check, or
    None where the config fails (compile, resources, numerics)."""
    a, b, ops = x
    operands = {n: ops[n] for n, _ in problem.epilogue.operands}
    try:
        with epilab_config.patch(exact_math=exact):
            checked_launch(problem, config, a, b, operands)
            bound = bind(problem, config, a, b, operands)
    except Exception as e:
        print(f"#   {config.short()}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        return None
    return bound.run


def graph_us(fns: list[Callable[[], object]]) -> float:
    return time_graph(fns, calls=max(2, 32 // len(fns)), replays=10).median_ms * 1e3


def ceilings() -> dict[str, float]:
    """The device's copy bandwidth (a 1 GiB device-to-device copy, bytes read plus written) and
    its bf16 cuBLAS rate (8192^3 on random data), measured once (METHOD.md's two numbers)."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_graph(lambda: dst.copy_(src), calls=4, replays=10).median_ms
    a = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    mm_ms = time_graph(lambda: torch.mm(a, b), calls=4, replays=10).median_ms
    return {"copy_tb_s": 2 * src.numel() * 4 / copy_ms / 1e9, "cublas_tflops": 2 * 8192**3 / mm_ms / 1e9}


def cublas_kernels(case: Case) -> list[str]:
    """The kernels ``torch.mm`` runs for the class (torch.profiler): cuBLAS's names carry its
    tile, cluster, stages and schedule."""
    a, b, _ = inputs(case, 1)[0]
    torch.mm(a, b)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.mm(a, b)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def floors(case: Case) -> dict[str, float]:
    """The output's copy at the device's copy bandwidth, and 2MNK at its cuBLAS rate."""
    out = torch.empty(case.m, case.n, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(case.m, case.n, device="cuda").to(torch.bfloat16)
    copy_us = graph_us([lambda: out.copy_(src)])
    return {"copy_us": copy_us, "write_floor_us": copy_us / 2}


def best_of(results: dict[str, float | None], configs: list[Config]) -> Config | None:
    ok = [c for c in configs if results.get(c.short()) is not None]
    return min(ok, key=lambda c: results[c.short()]) if ok else None  # type: ignore[arg-type,return-value]


def sweep_case(
    case: Case, configs: list[Config], none_sweeps: dict
) -> tuple[Config | None, Config | None, dict]:
    """Each config checked against float64 and timed once (CUDA graph, one input set): the
    best for the fused fast epilogue, and (once per shape) the best with no epilogue."""
    x = inputs(case, 1)[0]
    fused = {}
    for c in configs:
        run = checked(problem_of(case, case.epilogue, x), c, x)
        fused[c.short()] = None if run is None else graph_us([run])
    key = (case.m, case.n, case.k)
    if key not in none_sweeps:
        none_sweeps[key] = {}
        for c in configs:
            run = checked(problem_of(case, "none", x), c, x)
            none_sweeps[key][c.short()] = None if run is None else graph_us([run])
    return best_of(fused, configs), best_of(none_sweeps[key], configs), fused


def measure_case(
    case: Case, best: Config | None, best_none: Config | None, rounds: int, max_autotune: bool, peak: dict
) -> dict:
    """Every variant of the case in ``rounds`` interleaved rounds of CUDA-graph replays."""
    sets = inputs(case, set_count(case))
    problem = problem_of(case, case.epilogue, sets[0])
    plain = problem_of(case, "none", sets[0])
    fns: dict[str, list[Callable[[], object]]] = {}
    fns["cublas"] = [lambda a=a, b=b: torch.mm(a, b) for a, b, _ in sets]
    for lib in ("cublas", "inductor", *(("inductor-max-autotune",) if max_autotune else ())):
        base = baseline_fn(problem, lib)
        assert base is not None
        name = {"cublas": "eager", "inductor-max-autotune": "max-autotune"}.get(lib, lib)
        fns[name] = [
            lambda base=base, a=a, b=b, ops=ops: base(a, b, {n: ops[n] for n, _ in problem.epilogue.operands})
            for a, b, ops in sets
        ]
    for name, prob, cfg, exact in (
        ("none", plain, best, False),
        ("exact", problem, best, True),
        ("fast", problem, best, False),
        ("best_none", plain, best_none, False),
    ):
        if cfg is None or checked(prob, cfg, sets[0], exact) is None:
            continue
        with epilab_config.patch(exact_math=exact):
            fns[name] = [
                bind(prob, cfg, x[0], x[1], {n: x[2][n] for n, _ in prob.epilogue.operands}).run for x in sets
            ]
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fs in fns.items():
            times[name].append(graph_us(fs))
    return {
        "class": case.label,
        "shape": [case.m, case.n, case.k],
        "epilogue": case.epilogue,
        "config": best.short() if best else None,
        "best_none_config": best_none.short() if best_none else None,
        "sets": len(sets),
        "us": {n: statistics.median(t) for n, t in times.items()},
        "spread": {n: [min(t), max(t)] for n, t in times.items()},
        "flop_floor_us": 2 * case.m * case.n * case.k / (peak["cublas_tflops"] * 1e12) * 1e6,
        "byte_floor_us": 2
        * (case.m * case.k + case.n * case.k + case.m * case.n)
        / (peak["copy_tb_s"] * 1e12)
        * 1e6,
        "cublas_kernels": cublas_kernels(case),
        **floors(case),
    }


def table(results: list[dict]) -> str:
    cols = ["cublas", "eager", "inductor", "max-autotune", "best_none", "none", "exact", "fast"]
    head = "| class | epilogue | config | " + " | ".join(f"{c} us" for c in cols)
    head += " | fast/none | none/cublas | inductor/fast | max-at/fast | write floor us |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        us = r["us"]
        cells = [f"{us[n]:.1f}" if n in us else "-" for n in cols]
        ratios = [
            f"{us[x] / us[y]:.2f}x" if x in us and y in us else "-"
            for x, y in (
                ("fast", "none"),
                ("best_none", "cublas"),
                ("inductor", "fast"),
                ("max-autotune", "fast"),
            )
        ]
        shape = "x".join(map(str, r["shape"]))
        lines.append(
            f"| {r['class']} {shape} | {r['epilogue']} | {r['config']} | {' | '.join(cells)} | "
            f"{' | '.join(ratios)} | {r['write_floor_us']:.1f} |"
        )
    ind = [r["us"]["inductor"] / r["us"]["fast"] for r in results if "fast" in r["us"]]
    cost = [r["us"]["fast"] / r["us"]["none"] for r in results if "fast" in r["us"] and "none" in r["us"]]
    loop = [r["us"]["best_none"] / r["us"]["cublas"] for r in results if "best_none" in r["us"]]
    lines.append("")
    for label, kernels in sorted({(r["class"], tuple(r.get("cublas_kernels", ()))) for r in results}):
        lines.append(f"- cuBLAS for {label}: {', '.join(kernels) or '?'}")
    worst_cost, worst_loop = max(cost, default=0), max(loop, default=0)
    lines.append(
        f"- epilogue cost (fast / none, same config): geomean {geomean(cost):.3f}x, max {worst_cost:.3f}x"
    )
    lines.append(
        f"- main loop (best no-epilogue / cuBLAS): geomean {geomean(loop):.3f}x, max {worst_loop:.3f}x"
    )
    lines.append(
        f"- fused vs Inductor (inductor / fast): geomean {geomean(ind):.3f}x, min {min(ind, default=0):.3f}x"
    )
    mat = [
        r["us"]["max-autotune"] / r["us"]["fast"]
        for r in results
        if "max-autotune" in r["us"] and "fast" in r["us"]
    ]
    if mat:
        lines.append(f"- fused vs max-autotune: geomean {geomean(mat):.3f}x, min {min(mat):.3f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", help=f"comma-separated, of {', '.join(CLASSES)}")
    parser.add_argument("--epilogues", help="only these epilogues (comma-separated)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--configs", choices=("all", "triton", "sm90"), default="all")
    parser.add_argument("--json")
    parser.add_argument("--from-json")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            print(table(json.load(f)["results"]))
        return
    names = args.classes.split(",") if args.classes else list(CLASSES)
    configs = [c for group, cs in CONFIGS.items() if args.configs in ("all", group) for c in cs]
    cases = [
        Case(n, *CLASSES[n][:3], ep)
        for n in names
        for ep in CLASSES[n][3]
        if not args.epilogues or ep in args.epilogues.split(",")
    ]
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    print("#", header, flush=True)
    peak = ceilings()
    print(
        f"# copy {peak['copy_tb_s']:.2f} TB/s, cuBLAS bf16 8192^3 {peak['cublas_tflops']:.0f} TFLOP/s",
        flush=True,
    )
    first: list[tuple[Problem, Config | None, bool]] = []
    for case in cases:
        x = inputs(case, 1)[0]
        first.append((problem_of(case, case.epilogue, x), None, False))  # Inductor's
        for c in configs:
            first += [(problem_of(case, case.epilogue, x), c, False), (problem_of(case, "none", x), c, False)]
    precompile(list({(p.key, c, e): (p, c, e) for p, c, e in first}.values()))  # type: ignore[misc]
    none_sweeps: dict = {}
    chosen = []
    for case in cases:
        best, best_none, fused = sweep_case(case, configs, none_sweeps)
        chosen.append((case, best, best_none, fused))
        print(f"# {case.label} {case.epilogue}: best {best.short() if best else None}", flush=True)
    x_exact = []
    for case, best, _, _ in chosen:
        if best is not None:
            x_exact.append((problem_of(case, case.epilogue, inputs(case, 1)[0]), best, True))
    precompile(x_exact)
    results: list[dict] = []
    for case, best, best_none, fused in chosen:
        start = time.time()
        result = measure_case(case, best, best_none, args.rounds, args.max_autotune, peak)
        result["sweep"] = fused
        results.append(result)
        print(f"# {case.label} {case.epilogue}: {time.time() - start:.0f} s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                sweeps = {str(k): v for k, v in none_sweeps.items()}
                json.dump(
                    {"device": header, "ceilings": peak, "results": results, "none_sweeps": sweeps},
                    f,
                    indent=1,
                )
    print(table(results))


if __name__ == "__main__":
    main()
