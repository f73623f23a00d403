"""A template change measured: kernels rendered from an earlier version of a template file
against the current ones and cuBLASLt, interleaved in one process.

    git show REV:templates/gemm/matmul_sm90.py.jinja > /tmp/old.jinja
    python3 benchmarks/template_ab.py [--old /tmp/old.jinja ...] [--ptxas PATH ...] [--unsplit] [--m-major]
        [--no-check] [--only 0-5] [--rounds 5] [--json out.json]

The cases are ``untuned_fp8.py``'s (the ``fp8-block`` suite's DeepSeek-V3 projections at
M = 4096, two of Llama-3-8B's at M = 128, rowwise exact accumulation at 8192^3 and M = 2048),
each on the config an untuned call takes on this GPU (``registry.default_config`` with its
capability). Each ``--old`` file stands in for the template file ``--name`` (default: its own
name where that is a template's, else ``matmul_sm90.py.jinja``) while its kernels are rendered
and built; the current files render the ``current`` ones. With ``--no-check`` the ``--old``
kernels are timed unchecked: diagnostics, versions with a piece taken out to see what it costs.
``--m-major`` times the current kernels of block-scaled cases on A's scales in cuBLASLt's
M-major layout too (the random inputs' are row-major; cuBLASLt gets its layouts, made once).
``--unsplit`` times the current cooperative kernels with a partial last wave left whole too
(``matmul_sm90.tail_split`` held at 1): what the split of the last wave gains.
``--ptxas PATH`` times the current kernels assembled by another ptxas too (Triton's own is
``triton/backends/nvidia/bin/ptxas``; e.g. ``nvidia-cuda-nvcc-cu12``'s): the same PTX, the
SASS scheduled by another version (RESULTS.md, 2026-11-29 fourth: ptxas 12.9 interleaves the
yield bits of the block-scaled loop's FFMAs, 12.8 does not; fifth: no faster for it).

Method: the kernels of a case are checked against float64 (``verify.checked_launch``), then
they and ``torch._scaled_mm`` with the same scales and accumulation are timed in ``--rounds``
interleaved rounds (CUDA events, L2 flushed; calls under 50 us also by CUDA-graph replay):
the median of the rounds' medians and their min..max. ``x current`` < 1 is faster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jinja2
import torch
from epilogue_cost import precompile
from fp8 import scaled_mm_alone
from rounds import device_header, interleaved, like_with_like, only, save, spread_text
from untuned_fp8 import cases

from epilab.templates.gemm import matmul_sm90
from epilab.templates.gemm.block_scaled import A_SCALES, cublaslt_layouts
from epilab.templates.registry import bind, default_config
from epilab.templates.runtime import binding, render
from epilab.templates.verify import checked_launch, random_inputs

PTXAS_ENV = "TRITON_PTXAS_PATH"  # read by Triton at each compile


@contextlib.contextmanager
def template_replaced(name: str, text: str) -> Iterator[None]:
    """Render ``text`` for template file ``name`` (and build anew: the kernel cache is keyed by
    problem and config, not by source) until the block ends."""
    env = render._ENV
    loader = env.loader
    env.loader = jinja2.ChoiceLoader([jinja2.DictLoader({name: text}), loader])
    env.cache.clear()
    binding._kernels.clear()
    try:
        yield
    finally:
        env.loader = loader
        env.cache.clear()
        binding._kernels.clear()


@contextlib.contextmanager
def ptxas_replaced(path: str) -> Iterator[str]:
    """Assemble with the ptxas at ``path`` until the block ends (kernels built anew; Triton's
    cache key holds the ptxas version, cached per process: cleared on the way in and out).
    Yields its version's line ("Cuda compilation tools, release 12.9, V12.9.86")."""
    from triton.backends.nvidia import compiler

    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    before = os.environ.get(PTXAS_ENV)
    os.environ[PTXAS_ENV] = path
    compiler.get_ptxas_version.cache_clear()
    binding._kernels.clear()
    try:
        yield next((line for line in version.splitlines() if "release" in line), version.strip())
    finally:
        if before is None:
            os.environ.pop(PTXAS_ENV, None)
        else:
            os.environ[PTXAS_ENV] = before
        compiler.get_ptxas_version.cache_clear()
        binding._kernels.clear()


@contextlib.contextmanager
def last_wave_whole() -> Iterator[None]:
    """Bind cooperative kernels without splitting a partial last wave along K until the block
    ends (a kernel of its own: TAIL_SPLIT is a constexpr)."""
    split = matmul_sm90.tail_split
    matmul_sm90.tail_split = lambda tiles, sms, k_steps: 1
    try:
        yield
    finally:
        matmul_sm90.tail_split = split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", action="append", default=[], help="a version of the file (repeatable)")
    parser.add_argument("--name", help="the template file they stand in for")
    parser.add_argument("--no-check", action="store_true", help="leave the --old kernels unchecked")
    parser.add_argument("--m-major", action="store_true", help="the current kernels on M-major A scales too")
    parser.add_argument("--unsplit", action="store_true", help="the current kernels, last wave whole, too")
    parser.add_argument("--ptxas", action="append", default=[], help="the current kernels by this ptxas too")
    parser.add_argument("--only", help="1-based case numbers, e.g. 1-6,9")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not args.old and not args.ptxas and not args.unsplit:
        parser.error(
            "give --old FILE or --ptxas PATH (each repeatable) or --unsplit: what to time beside the "
            "current kernels"
        )
    olds = {Path(o).stem: Path(o).read_text() for o in args.old}
    first = Path(args.old[0]).name if args.old else "matmul_sm90.py.jinja"
    known = {p.name for d in render.TEMPLATE_DIRS for p in d.glob("*.py.jinja")}
    name = args.name or (first if first in known else "matmul_sm90.py.jinja")
    if name not in known:
        parser.error(f"--name {name!r} is not a template file; known: {', '.join(sorted(known))}")
    props = torch.cuda.get_device_properties(0)
    facts = {"sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}
    every = cases()
    header = device_header(facts["sm_count"])
    chosen = only(args.only, len(every))
    problems = {i: every[i].problem() for i in chosen}
    configs = {i: default_config(p, **facts) for i, p in problems.items()}
    precompile([(problems[i], configs[i], False) for i in chosen])  # the current kernels, in a pool
    results = []
    for index in chosen:
        spec, problem, config = every[index], problems[index], configs[index]
        a, b, scales = random_inputs(problem, "cuda", index)
        variants = {}
        for version, text in olds.items():
            with template_replaced(name, text):
                if not args.no_check:
                    checked_launch(problem, config, a, b, scales)
                variants[version] = bind(problem, config, a, b, scales).run
        checked_launch(problem, config, a, b, scales)
        variants["current"] = bind(problem, config, a, b, scales).run
        if args.m_major and A_SCALES in scales:
            laid = cublaslt_layouts(scales)
            checked_launch(problem, config, a, b, laid)
            variants["current, A's scales M-major"] = bind(problem, config, a, b, laid).run
        if args.unsplit and config.variant == matmul_sm90.COOPERATIVE:
            with last_wave_whole():
                checked_launch(problem, config, a, b, scales)
                variants["current, last wave whole"] = bind(problem, config, a, b, scales).run
        for path in args.ptxas:
            with ptxas_replaced(path) as version:
                checked_launch(problem, config, a, b, scales)
                label = f"current, ptxas {version.split(',')[-1].strip()}"
                variants[label] = bind(problem, config, a, b, scales).run
        variants["_scaled_mm"] = scaled_mm_alone(problem, a, b, scales)
        times = interleaved(variants, args.rounds)
        graph, _ = like_with_like(times)
        results.append(
            {
                "problem": f"{spec.scales} {spec.m}x{spec.n}x{spec.k}",
                "template": name,
                "olds": args.old,
                "checked": not args.no_check,
                "flops": 2 * spec.m * spec.n * spec.k,
                "config": config.short(),
                "times": times,
                "graph": graph,
            }
        )
        save(args.json, header, results)
    print(header)
    against = [*args.old, *(f"ptxas {p}" for p in args.ptxas)] + ["the last wave whole"] * args.unsplit
    print(f"{name}: {', '.join(against)} against the current kernels; e4m3 -> bf16, exact accumulation")
    print(f"ms: median of {args.rounds} interleaved rounds [min-max] (* CUDA-graph replay)")
    print("| case | config | kernel | ms [min-max] | x current | TFLOP/s | cuBLASLt / this |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in results:
        t = r["times"]
        graph, ms = like_with_like(t)
        star = "*" if graph else ""
        for v, x in t.items():
            print(
                f"| {r['problem']} | {r['config']} | {v} | {ms[v]:.4f}{star}{spread_text(x, graph)} | "
                f"{ms[v] / ms['current']:.3f} | {r['flops'] / ms[v] / 1e9:.0f} | "
                f"{ms['_scaled_mm'] / ms[v]:.2f}x |"
            )


if __name__ == "__main__":
    main()
