"""The depthwise channel lanes' two forms, config by config: the sliding window of input rows
(the default variant) against the output rows in flight (``in_flight``), on NHWC layers.

    python3 benchmarks/depthwise_window.py [--configs 3] [--rounds 5] [--json out.json]

Method. For each layer (issue 41's table, seven suite layers, the ConvNeXt layers with and
without their LayerNorm; NHWC, bf16) the benchmark's candidates on the channel lanes
(``depthwise.candidates``: the default, the seeds, larger tiles; ``--configs`` of them) and
each one twice as tall are rendered in both variants, checked against float64, and their
outputs compared with each other (the two forms add the taps in one order: equal bit for
bit). Every kernel is timed alike in ``--rounds`` rounds, shuffled within each: a CUDA graph
of calls over rotating input sets of over three times the 60 MB L2, per-call median of 10
replays; a config's time is the median of its rounds. The table gives each variant's best
config and the best-against-best speed-up; the JSON keeps every config's rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics

import torch
from depthwise import CONVNEXT, ISSUE_TABLE, L2_BYTES, candidates, graph_us, rel_error
from rounds import device_header, print_saved, save

from epilab.ir.problem import Config, Problem
from epilab.policy.suites import suite
from epilab.templates.conv_geometry import conv_of
from epilab.templates.conv_spec import ConvSpec
from epilab.templates.kinds import bind, kind_of, twins

SUITE_LAYERS = (22, 25, 27, 29, 33, 34, 43)  # the depthwise suite's batch-32 3x3, 5x5 and 7x7 mix


def layers() -> list[ConvSpec]:
    dw = suite("depthwise")
    base = [*ISSUE_TABLE, *(dw[i] for i in SUITE_LAYERS), *CONVNEXT]
    return list(dict.fromkeys(dataclasses.replace(s, layout="nhwc") for s in base))


def configs(problem: Problem, count: int) -> list[Config]:
    """``count`` channel-lane candidates and each one twice as tall, where the checks pass."""
    kind = kind_of(problem)
    base = [c for c in candidates(problem, 2 * count) if c.variant == "default"][:count]
    taller = [dataclasses.replace(c, BLOCK_M=2 * c.BLOCK_M, TILE_H=2 * c.TILE_H) for c in base]
    fits = [c for c in taller if kind.config_error(problem, c) is None]
    return list(dict.fromkeys(base + [c for c in fits if kind.search_error(problem, c) is None]))


def measure(spec: ConvSpec, count: int, rounds: int) -> dict:
    problem = next(t for t in twins(spec.problem()) if t.template == "depthwise")
    kind, g = kind_of(problem), conv_of(problem)
    n, k = int(problem.shape.batch), int(problem.shape.n)
    moved = (n * g.c * g.h * g.w + n * k * g.p * g.q) * 2
    sets = min(16, max(2, math.ceil(3 * L2_BYTES / moved)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [kind.inputs(problem, torch.device("cuda"), gen) for _ in range(sets)]
    reference = kind.reference(problem, *inputs[0])[0]
    runs, outs, errors = {}, {}, {}
    for config in configs(problem, count):
        for variant in ("default", "in_flight"):
            bounds = [bind(problem, dataclasses.replace(config, variant=variant), *args) for args in inputs]
            bounds[0].run()
            key = (variant, config.short())
            errors[key] = rel_error(bounds[0].outs[0], reference)
            assert errors[key] < 5e-3, (spec.label(), key, errors[key])
            outs[key], runs[key] = bounds[0].outs[0].clone(), [b.run for b in bounds]
    torch.cuda.synchronize()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key in random.sample(list(runs), len(runs)):
            times[key].append(graph_us(runs[key]))
    median = {key: statistics.median(t) for key, t in times.items()}
    shorts = list(dict.fromkeys(c for _, c in runs))
    best = {v: min(shorts, key=lambda c, v=v: median[(v, c)]) for v in ("default", "in_flight")}
    return {
        "layer": spec.label(),
        "best_window_us": median[("default", best["default"])],
        "best_window_config": best["default"],
        "best_in_flight_us": median[("in_flight", best["in_flight"])],
        "best_in_flight_config": best["in_flight"],
        "per_config": {c: median[("in_flight", c)] / median[("default", c)] for c in shorts},
        "max_abs_difference": max(
            (outs[("default", c)] - outs[("in_flight", c)]).abs().max().item() for c in shorts
        ),
        "times_us": {f"{v}|{c}": t for (v, c), t in times.items()},
        "errors": {f"{v}|{c}": e for (v, c), e in errors.items()},
    }


def spread(row: dict, variant: str) -> str:
    """The rounds' min-max of a variant's best config."""
    config = row["best_window_config" if variant == "default" else "best_in_flight_config"]
    rounds = row["times_us"][f"{variant}|{config}"]
    return f"[{min(rounds):.1f}-{max(rounds):.1f}]"


def table(rows: list[dict]) -> str:
    lines = [
        "| layer | in flight us [rounds' min-max] (config) | window us [min-max] (config) | speed-up "
        "| per config | max abs difference |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        per = ", ".join(f"{v:.2f}" for v in r["per_config"].values())
        lines.append(
            f"| {r['layer']} | {r['best_in_flight_us']:.1f} {spread(r, 'in_flight')} "
            f"({r['best_in_flight_config']}) "
            f"| {r['best_window_us']:.1f} {spread(r, 'default')} ({r['best_window_config']}) "
            f"| {r['best_in_flight_us'] / r['best_window_us']:.2f} | {per} | {r['max_abs_difference']:.1e} |"
        )
    ratios = [r["best_in_flight_us"] / r["best_window_us"] for r in rows]
    lines.append(f"geomean best against best: {math.exp(statistics.mean(map(math.log, ratios))):.3f}")
    return "\n".join(lines)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--configs", type=int, default=3, help="configs a layer (and 2x as tall)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write every config's rounds here")
    parser.add_argument("--from-json", help="print the table of an earlier run")
    args = parser.parse_args()
    if print_saved(args.from_json, table):
        return
    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    print(header)
    rows: list[dict] = []
    for spec in layers():
        rows.append(measure(spec, args.configs, args.rounds))
        save(args.json, header, rows)
    print(table(rows))


if __name__ == "__main__":
    main()
