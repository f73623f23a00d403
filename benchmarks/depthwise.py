"""The depthwise template against cuDNN alone, cuDNN + the eager epilogue, Inductor (and, with
``--max-autotune``, Inductor max-autotune), with the copy bandwidth of the bytes moved.

    python3 benchmarks/depthwise.py [--suite issue|convnext|depthwise] [--only 0-5] [--layout both] \
        [--rounds 5] [--configs 12] [--max-autotune] [--json out.json]

Method. The floor is the input plus the output at the copy bandwidth measured in the same
run (a ``copy_`` of 256 MB buffers, read + write, CUDA-graph replayed). FLOPs (2 R S per
output element) are reported for the 7x7 layers' CUDA-core bound. For each layer a fixed
list of depthwise configs (the kind's default and seeds, then larger tiles; ``--configs``)
is compiled (seconds per config are reported), checked against the float64 reference and
timed once; the best is then timed with every baseline in ``--rounds`` interleaved rounds.
Every variant is timed alike: a CUDA graph of calls over rotating input sets whose bytes
outgrow the 60 MB L2 three times (no reuse between calls), per-call median of 10 replays;
a layer's time is the median of its rounds, its spread the rounds' min..max. "cuDNN" is
``F.conv2d`` alone (no epilogue), "cuDNN + eager" runs the epilogue in eager torch after
it, Inductor compiles that same eager code (``torch.compile``, default mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rounds import device_header, only, print_saved, save

from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.suites import suite as builtin_suite
from epilab.templates.conv.conv_geometry import conv_of
from epilab.templates.conv.conv_spec import ConvSpec
from epilab.templates.registry import bind, kind_of, twins
from epilab.tuner.timing import time_graph

L2_BYTES = 60 << 20
# the layers of issue 41's table (bf16, batch 32 unless said), each with a folded batch norm's bias
ISSUE_TABLE = [
    ConvSpec(32, 384, 14, 14, 384, 7, 7, padding=3, groups=384, epilogue="bias"),
    ConvSpec(32, 96, 56, 56, 96, 7, 7, padding=3, groups=96, epilogue="bias"),
    ConvSpec(32, 240, 28, 28, 240, 5, 5, padding=2, groups=240, epilogue="bias"),
    ConvSpec(32, 672, 14, 14, 672, 5, 5, padding=2, groups=672, epilogue="bias"),
    ConvSpec(32, 144, 56, 56, 144, 3, 3, padding=1, groups=144, epilogue="bias"),
    ConvSpec(128, 32, 112, 112, 32, 3, 3, padding=1, groups=32, epilogue="bias"),
    ConvSpec(32, 240, 28, 28, 240, 5, 5, padding=2, groups=240, epilogue="bn_silu"),
    ConvSpec(32, 96, 56, 56, 96, 7, 7, padding=3, groups=96, epilogue="bn_hardswish"),
    ConvSpec(32, 144, 56, 56, 144, 3, 3, stride=2, padding=1, groups=144, epilogue="bn_relu6"),
    ConvSpec(32, 672, 14, 14, 1344, 5, 5, padding=2, groups=672, epilogue="bias"),
]
# ConvNeXt's depthwise layers (7x7, batch 32: ConvNeXt-T's stages of 96 to 384 channels, and
# the zoo's stage at batch 8) with the LayerNorm over the channels that follows each, in the
# epilogue (``bias_layer_norm``: a program holds a pixel's channels), and with the bias alone
CONVNEXT = [
    ConvSpec(n, c, hw, hw, c, 7, 7, padding=3, groups=c, epilogue=epilogue)
    for n, c, hw in ((32, 96, 56), (32, 192, 28), (32, 384, 14), (8, 192, 56))
    for epilogue in ("bias_layer_norm", "bias")
]
SUITES = {"issue": ISSUE_TABLE, "convnext": CONVNEXT}
EXTRA = (  # other strip widths, heights and channels per lane than the seeds
    Config(64, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16),  # 4 wide
    Config(128, 128, 16, 1, num_warps=4, num_stages=1, TILE_H=16),
    Config(256, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16),  # 16 wide
    Config(128, 64, 16, 1, num_warps=1, num_stages=1, TILE_H=16),
    Config(32, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=4),
    Config(256, 64, 16, 1, num_warps=2, num_stages=1, TILE_H=32),
    Config(128, 128, 16, 1, num_warps=2, num_stages=1, TILE_H=16),
    # w_vector (NCHW): 32 to 128 pixels a row, 16 to 64 rows
    Config(1024, 16, 16, 1, num_warps=2, num_stages=1, TILE_H=16, variant="w_vector"),
    Config(512, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=16, variant="w_vector"),
    Config(1024, 16, 16, 1, num_warps=4, num_stages=1, TILE_H=32, variant="w_vector"),
    Config(512, 16, 16, 1, num_warps=4, num_stages=1, TILE_H=4, variant="w_vector"),
    Config(1024, 16, 16, 1, num_warps=2, num_stages=1, TILE_H=64, variant="w_vector"),
    Config(256, 64, 16, 1, num_warps=4, num_stages=1, TILE_H=16, variant="w_vector"),  # 16 wide
    Config(128, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=8, variant="w_vector"),
)


def copy_gbs() -> float:
    """The device's copy bandwidth: read + write of 256 MB buffers, rotating."""
    big = [torch.empty(64 << 20, dtype=torch.float32, device="cuda") for _ in range(4)]
    fns = [lambda i=i: big[(i + 1) % 4].copy_(big[i]) for i in range(4)]
    ms = time_graph(fns, calls=2, replays=10).median_ms
    return 2 * big[0].numel() * 4 / ms / 1e6


def candidates(problem: Problem, count: int) -> list[Config]:
    """The default, then the seeds and EXTRA of the default's variant first; with row totals
    (a LayerNorm in the epilogue), strips 2 to 8 wide and 4 to 16 tall holding every channel."""
    kind = kind_of(problem)
    default = kind.default_config(problem, "cuda")
    listed = sorted([*kind.seeds, *EXTRA], key=lambda c: c.variant != default.variant)
    if problem.epilogue.row_totals:
        channels = default.BLOCK_N
        listed = [
            Config(width * rows, channels, 16, 1, num_warps=warps, num_stages=1, TILE_H=rows)
            for width in (8, 4, 2)
            for rows in (16, 8, 4)
            if width * rows >= 16
            for warps in dict.fromkeys((max(1, channels // 32), max(1, channels // 64)))
        ]
    unique = list(dict.fromkeys([default, *listed]))
    ok = [
        c for c in unique if kind.config_error(problem, c) is None and kind.search_error(problem, c) is None
    ]
    return ok[:count]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def graph_us(fns: list[Callable[[], object]]) -> float:
    calls = max(1, 24 // len(fns))
    return time_graph(fns, calls=calls, replays=10).median_ms * 1000


def measure(spec: ConvSpec, args: argparse.Namespace, gbs: float) -> dict:
    problem = spec.problem()
    dw = next(t for t in twins(problem) if t.template == "depthwise")
    kind, g = kind_of(dw), conv_of(dw)
    n, k = int(dw.shape.batch), int(dw.shape.n)
    item = torch.tensor([], dtype=getattr(torch, dw.dtype)).element_size()
    moved = (n * g.c * g.h * g.w + n * k * g.p * g.q) * item
    sets = min(16, max(2, math.ceil(3 * L2_BYTES / moved)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [kind.inputs(dw, torch.device("cuda"), gen) for _ in range(sets)]
    x0, w0, ops0 = inputs[0]
    ref = kind.reference(dw, x0, w0, ops0)[0]
    eager_err = rel_error(kind.baseline(dw, x0, w0, ops0)[0].to(x0.dtype), ref)

    swept = []
    for config in candidates(dw, args.configs):
        t0 = time.perf_counter()
        try:
            bounds = [bind(dw, config, x, w, ops) for x, w, ops in inputs]
            bounds[0].compile()
            compile_s = time.perf_counter() - t0
            bounds[0].run()
            err = rel_error(bounds[0].outs[0], ref)
            if not err <= 4 * max(eager_err, 1e-3):
                raise AssertionError(f"relative error {err:.3g} (eager {eager_err:.3g})")
            us = graph_us([b.run for b in bounds])
        except Exception as e:  # a benchmark: report the config and go on
            print(f"  {config.short()}: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
            continue
        swept.append({"config": config, "us": us, "err": err, "compile_s": compile_s, "bounds": bounds})
    best = min(swept, key=lambda r: r["us"])

    def cudnn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, None, g.stride, g.padding, g.dilation, g.groups)

    torch._dynamo.reset()  # each layer compiles afresh (no recompile limit, no stale guards)
    compiled = torch.compile(lambda x, w, ops: kind.baseline(dw, x, w, ops))
    variants: dict[str, list[Callable[[], object]]] = {
        "ours": [b.run for b in best["bounds"]],
        "cudnn": [lambda x=x, w=w: cudnn(x, w) for x, w, _ in inputs],
        "cudnn_eager": [lambda s=s: kind.baseline(dw, *s) for s in inputs],
        "inductor": [lambda s=s: compiled(*s) for s in inputs],
    }
    if args.max_autotune:
        tuned = torch.compile(
            lambda x, w, ops: kind.baseline(dw, x, w, ops), mode="max-autotune-no-cudagraphs"
        )
        variants["max_autotune"] = [lambda s=s: tuned(*s) for s in inputs]
    for fns in variants.values():
        fns[0]()  # compile and warm up outside the graphs
    torch.cuda.synchronize()
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fns in variants.items():
            rounds[name].append(graph_us(fns))
    floor_us = moved / gbs / 1e3
    row = {
        "layer": spec.label(),
        "floor_us": floor_us,
        "mflop": 2 * g.r * g.s * n * k * g.p * g.q / 1e6,
        "config": best["config"].short(),
        "err": best["err"],
        "eager_err": eager_err,
        "compile_s": {c["config"].short(): round(c["compile_s"], 2) for c in swept},
        "sweep_us": {c["config"].short(): round(c["us"], 2) for c in swept},
    }
    for name, times in rounds.items():
        row[name] = {"us": statistics.median(times), "spread": [min(times), max(times)]}
    return row


def table(results: list[dict]) -> str:
    lines = [
        "| layer | ours us (spread) | cuDNN us | x cuDNN | cuDNN+eager us | x eager | Inductor us | x Ind. "
        "| % copy bw ours / cuDNN | config | rel err ours / eager |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        o, c, e, i = (r[k]["us"] for k in ("ours", "cudnn", "cudnn_eager", "inductor"))
        lo, hi = r["ours"]["spread"]
        lines.append(
            f"| {r['layer']} | {o:.1f} ({lo:.1f}-{hi:.1f}) | {c:.1f} | {c / o:.2f} | {e:.1f} | {e / o:.2f} "
            f"| {i:.1f} | {i / o:.2f} | {100 * r['floor_us'] / o:.0f}% / {100 * r['floor_us'] / c:.0f}% "
            f"| {r['config']} | {r['err']:.1e} / {r['eager_err']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        default="issue",
        help="issue (issue 41's layers), convnext (7x7 layers with their LayerNorm) or a built-in suite",
    )
    parser.add_argument("--only", help="1-based layer numbers, e.g. 1-5,9")
    parser.add_argument("--layout", choices=("nhwc", "nchw", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", type=int, default=12, help="depthwise configs swept per layer")
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    specs = SUITES[args.suite] if args.suite in SUITES else builtin_suite(args.suite)
    specs = [specs[i] for i in only(args.only, len(specs))]
    layouts = ("nhwc", "nchw") if args.layout == "both" else (args.layout,)
    specs = [dataclasses.replace(s, layout=layout) for layout in layouts for s in specs]
    gbs = copy_gbs()
    header = (
        f"{device_header(torch.cuda.get_device_properties(0).multi_processor_count)}; copy {gbs:.0f} GB/s"
    )
    print(header)
    results = []
    for spec in specs:
        results.append(measure(spec, args, gbs))
        print(json.dumps({k: v for k, v in results[-1].items() if k not in ("compile_s", "sweep_us")}))
        save(args.json, header, results)
        torch.cuda.empty_cache()
    print(table(results))


if __name__ == "__main__":
    main()
