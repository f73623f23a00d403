"""Where a LayerNorm in the depthwise epilogue spends its time: the plain kernel (bias),
the norm with a two-pass variance (the compiler's form: mean, then the centred squares), a
one-pass variance (sum and sum of squares) and the mean alone, over the warps a program's
channels span (one to four channels a lane) and the strip's width.

    python3 benchmarks/norm_in_epilogue.py [--layers 0,1] [--json out.json]

Method: each variant is a depthwise problem of its own (the epilogue written as text, every
channel of a pixel in one program for the row totals), checked against the float64 reference
once, then timed three times as ``depthwise.py`` times a layer (CUDA graphs over rotating input
sets three times the L2); its time is the median, its spread the min-max. bf16, NHWC, 7x7.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
from depthwise import L2_BYTES, graph_us, rel_error
from rounds import device_header, only, print_saved, save

from epilab.ir.problem import Config
from epilab.templates.conv_spec import ConvSpec
from epilab.templates.kinds import bind, kind_of, twins

X = "(acc + bias[n])"
MEAN = f"(row_total({X}) / row_total(1))"
EPILOGUES = {
    "bias": "bias",
    "two-pass norm": "bias_layer_norm",
    "one-pass norm": f"({X} - {MEAN}) * rsqrt(row_total({X} * {X}) / row_total(1) - {MEAN} * {MEAN}"
    " + 1e-6) * scale[n] + shift[n]",
    "mean only": f"({X} - {MEAN}) * scale[n]",
}
LAYERS = [(32, 96, 56), (32, 192, 28)]  # (batch, channels, size): ConvNeXt-T's first stage, the zoo's


def configs(name: str, channels: int) -> list[Config]:
    """For the row totals every channel in one block on 1 to 4 channels a lane, strips 4 and 8
    wide (16 rows); the mean alone on 2 a lane; the plain kernel on its two best configs (32
    channels on one warp) and on the mean's (the same block and warps: like with like)."""
    block = max(16, 1 << (channels - 1).bit_length())
    warps = [w for w in (block // 128, block // 64, block // 32) if w >= 1]
    if name in ("mean only", "bias"):
        warps = warps[1:2]
    held = [
        Config(w * 16, block, 16, 1, num_warps=wp, num_stages=1, TILE_H=16) for wp in warps for w in (4, 8)
    ]
    if name == "bias":
        return [Config(w * 16, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16) for w in (8, 4)] + held
    return held


def measure(n: int, c: int, hw: int, name: str) -> list[dict]:
    spec = ConvSpec(n, c, hw, hw, c, 7, 7, padding=3, groups=c, epilogue=EPILOGUES[name], layout="nhwc")
    problem = next(t for t in twins(spec.problem()) if t.template == "depthwise")
    kind = kind_of(problem)
    sets = min(16, max(2, math.ceil(3 * L2_BYTES / (4 * n * c * hw * hw))))
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [kind.inputs(problem, torch.device("cuda"), gen) for _ in range(sets)]
    ref = kind.reference(problem, *inputs[0])[0]
    rows = []
    for config in configs(name, c):
        t0 = time.perf_counter()
        try:
            bounds = [bind(problem, config, *s) for s in inputs]
            bounds[0].compile()
            compile_s = time.perf_counter() - t0
            bounds[0].run()
            err = rel_error(bounds[0].outs[0], ref)
            us = [graph_us([b.run for b in bounds]) for _ in range(3)]
        except Exception as e:  # a benchmark: report the config and go on
            print(f"  {name} {config.short()}: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
            continue
        rows.append(
            {
                "layer": f"{n}x{c}x{hw}x{hw}",
                "epilogue": name,
                "config": config.short(),
                "us": statistics.median(us),
                "spread": [min(us), max(us)],
                "err": err,
                "compile_s": round(compile_s, 1),
            }
        )
    return rows


def table(results: list[dict]) -> str:
    lines = ["| layer (7x7, NHWC) | epilogue | config | us (spread) | rel err |", "|---|---|---|---:|---:|"]
    for r in results:
        lo, hi = r["spread"]
        lines.append(
            f"| {r['layer']} | {r['epilogue']} | {r['config']} | {r['us']:.1f} ({lo:.1f}-{hi:.1f}) "
            f"| {r['err']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", help="layer indices, e.g. 0,1")
    parser.add_argument("--json")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    print(header)
    results: list[dict] = []
    for i in only(args.layers, len(LAYERS)):
        for name in EPILOGUES:
            results += measure(*LAYERS[i], name)
            save(args.json, header, results)
    print(table(results))


if __name__ == "__main__":
    main()
