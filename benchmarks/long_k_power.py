"""Why the block-scaled cooperative kernel runs slower per K step at long K (issue 44): a K
sweep with the GPU's SM clock and power sampled while each K is timed.

    python3 benchmarks/long_k_power.py [--rounds 5] [--json out.json]

Cases: 4096 x 7168 x K (K 2048 to 16384; 1232 tiles of 192 x 128, 9 waves and 44 tiles on 132
SMs: the last wave split 3 ways where ``tail_split`` pays) and 4096 x 2112 x K (2.8 waves),
block-scaled e4m3 -> bf16, exact accumulation, on the config an untuned call takes
(``kinds.default_config``), as bound ("as bound") and with the last wave whole, against
``torch._scaled_mm``'s block scaling. ``per full wave`` is the unsplit kernel's rate scaled to
whole waves (its time over ceil(waves) waves): the K loop's rate without the wave effect.

Method: each kernel is checked against float64 (``verify.checked_launch``); the three sides
of a shape are timed in ``--rounds`` interleaved rounds (CUDA events, L2 flushed; calls under
50 us also by CUDA-graph replay, ``*``), median of the rounds' medians [min-max]; nvidia-smi
samples clocks.sm and power.draw every 20 ms while a shape's rounds run (all three sides: the
clock the GPU holds under that load), median and minimum clock, maximum power.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from fp8 import scaled_mm_alone
from rounds import device_header, interleaved, like_with_like, save, spread_text
from template_ab import last_wave_whole

from epilab.templates.gemm_spec import Spec
from epilab.templates.kinds import bind, default_config
from epilab.templates.matmul_sm90 import COOPERATIVE, tail_split
from epilab.templates.verify import checked_launch, random_inputs

SHAPES = [(7168, 2048), (7168, 4096), (7168, 8192), (7168, 16384), (2112, 16384), (2112, 2048)]  # (N, K)
M = 4096
WHOLE = "last wave whole"
SMI = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"]


def sampled(log: Path) -> tuple[list[float], list[float]]:
    """The SM clocks (MHz) and power draws (W) nvidia-smi wrote to ``log``."""
    clocks, power = [], []
    for line in log.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            clocks.append(float(parts[0]))
            power.append(float(parts[1]))
        except (IndexError, ValueError):  # a partial last line
            continue
    return clocks, power


def run_shape(n: int, k: int, facts: dict, rounds: int, tmp: Path) -> list[dict]:
    spec = Spec(M, n, k, dtype="float8_e4m3fn", scales="block")
    problem = spec.problem()
    config = default_config(problem, **facts)
    a, b, scales = random_inputs(problem, "cuda", 0)
    checked_launch(problem, config, a, b, scales)
    variants = {"as bound": bind(problem, config, a, b, scales).run}
    if config.variant == COOPERATIVE:
        with last_wave_whole():
            checked_launch(problem, config, a, b, scales)
            variants[WHOLE] = bind(problem, config, a, b, scales).run
    variants["_scaled_mm"] = scaled_mm_alone(problem, a, b, scales)
    log = tmp / f"smi-{n}x{k}.csv"
    with log.open("w") as out:
        smi = subprocess.Popen(SMI, stdout=out)
        try:
            times = interleaved(variants, rounds)
        finally:
            smi.terminate()
            smi.wait()
    clocks, power = sampled(log)
    graph, ms = like_with_like(times)
    tiles = math.ceil(M / config.BLOCK_M) * math.ceil(n / config.BLOCK_N)
    waves = tiles / facts["sm_count"]
    flops = 2 * M * n * k
    return [
        {
            "shape": f"{M}x{n}x{k}",
            "config": config.short(),
            "variant": v,
            "ms": t,
            "graph": graph,
            "spread": spread_text(times[v], graph),
            "tflops": flops / t / 1e9,
            "waves": waves,
            "split": tail_split(tiles, facts["sm_count"], math.ceil(k / config.BLOCK_K)),
            "per_full_wave_tflops": (flops / t / 1e9 * math.ceil(waves) / waves) if v == WHOLE else None,
            "sm_mhz_median": sorted(clocks)[len(clocks) // 2] if clocks else None,
            "sm_mhz_min": min(clocks) if clocks else None,
            "power_w_max": max(power) if power else None,
        }
        for v, t in ms.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    if shutil.which(SMI[0]) is None:
        parser.error("nvidia-smi is not on PATH: this benchmark samples the SM clock and power with it")
    props = torch.cuda.get_device_properties(0)
    facts = {"sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}
    header = device_header(facts["sm_count"])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, k in SHAPES:
            rows += run_shape(n, k, facts, args.rounds, Path(tmp))
            save(args.json, header, rows)
    print(header)
    print(f"block-scaled e4m3 -> bf16; ms: median of {args.rounds} interleaved rounds [min-max]")
    print(
        "| shape | kernel | ms [min-max] | TFLOP/s | waves (split) | per full wave | SM MHz med/min | W max |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        wave = f"{r['per_full_wave_tflops']:.0f}" if r["per_full_wave_tflops"] else "-"
        clock = f"{r['sm_mhz_median']:.0f}/{r['sm_mhz_min']:.0f}" if r["sm_mhz_median"] else "-"
        power = f"{r['power_w_max']:.0f}" if r["power_w_max"] else "-"
        print(
            f"| {r['shape']} | {r['variant']} | {r['ms']:.4f}{'*' if r['graph'] else ''}{r['spread']} | "
            f"{r['tflops']:.0f} | {r['waves']:.2f} ({r['split']}) | {wave} | {clock} | {power} |"
        )


if __name__ == "__main__":
    main()
