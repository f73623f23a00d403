"""Tuning throughput with 1 and with N GPUs of one host, and whether the best configs agree.

    python3 benchmarks/fleet_scaling.py run --gpus 1 --out DIR     # one GPU
    python3 benchmarks/fleet_scaling.py run --gpus 2 --out DIR     # two GPUs (--devices 0,1)
    python3 benchmarks/fleet_scaling.py compare DIR                # the table

``run`` tunes the suites (default ``quick`` then ``llm``) with ``epilab tune --devices``
into a new database ``DIR/fleet-N.db``, from cold kernel caches (its own
``EPILAB_CACHE_DIR`` and ``TRITON_CACHE_DIR``: a run that found the other run's
compiled kernels would be faster for that alone), and writes each suite's ``--json``
results and wall time. The compile pool has ``--jobs`` processes per GPU. ``compare``
reads two runs: problems per hour (problems over the wall time of the commands,
start-up included) and, per problem, the best time of the N-GPU run over the 1-GPU
run's (each tuned with the same trial budget and sampler seed; the ratio is timing
noise plus the searches' different paths once noise changes what TPE sees).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epilab.ir.problem import config_text


def run(
    gpus: int, out: Path, suites: list[str], trials: int, jobs: int, limits: list[float], interpret: bool
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(f"/tmp/fleet-scaling-cache-{gpus}")
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "EPILAB_CACHE_DIR": str(cache / "epilab"), "TRITON_CACHE_DIR": str(cache / "triton")}
    devices = ",".join(str(i) for i in range(gpus))
    walls = {}
    for suite, limit in zip(suites, limits, strict=True):
        cmd = [sys.executable, "-m", "epilab.cli", "tune", "--suite", suite, "--devices", devices]
        cmd += ["--jobs", str(jobs), "--trials", str(trials), "--time-budget", "600", "--patience", "1000"]
        cmd += ["--db", str(out / f"fleet-{gpus}.db"), "--json"]
        cmd += ["--interpret"] if interpret else []
        start = time.monotonic()
        with (out / f"{suite}-{gpus}.json").open("w") as so, (out / f"{suite}-{gpus}.err").open("w") as se:
            proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:  # the command and its GPU workers
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 124
        walls[suite] = {"seconds": time.monotonic() - start, "rc": rc, "command": " ".join(cmd[1:])}
        print(f"{suite} on {gpus} GPU(s): rc {rc}, {walls[suite]['seconds']:.1f} s", flush=True)
    (out / f"walls-{gpus}.json").write_text(json.dumps(walls, indent=1))


def _results(out: Path, gpus: int) -> tuple[dict[str, dict], float, int]:
    walls = json.loads((out / f"walls-{gpus}.json").read_text())
    results: dict[str, dict] = {}
    for suite, wall in walls.items():
        if wall["rc"] != 0:
            print(f"note: {suite} on {gpus} GPU(s) ended with status {wall['rc']}")
        text = (out / f"{suite}-{gpus}.json").read_text()
        for r in json.loads(text) if text.strip() else []:
            results[r["key"]] = r
    return results, sum(w["seconds"] for w in walls.values()), len(walls)


def compare(out: Path, gpus: int) -> None:
    one, one_s, _ = _results(out, 1)
    many, many_s, _ = _results(out, gpus)
    rate_one, rate_many = len(one) / one_s * 3600, len(many) / many_s * 3600
    print("| GPUs | problems | wall s | problems/hour | vs 1 GPU |\n|---|---:|---:|---:|---:|")
    print(f"| 1 | {len(one)} | {one_s:.0f} | {rate_one:.0f} | 1.00x |")
    print(f"| {gpus} | {len(many)} | {many_s:.0f} | {rate_many:.0f} | {rate_many / rate_one:.2f}x |")
    ratios = {}
    for key, r in one.items():
        other = many.get(key)
        if other and r["best_ms"] and other["best_ms"]:
            ratios[key] = other["best_ms"] / r["best_ms"]
    if not ratios:
        print("no problem was tuned by both runs")
        return
    values = sorted(ratios.values())
    within = sum(abs(v - 1) <= 0.02 for v in values)
    print(
        f"\nbest time, {gpus} GPUs over 1 GPU, {len(values)} problems: "
        f"median {statistics.median(values):.3f}, min {values[0]:.3f}, max {values[-1]:.3f}; "
        f"within 2%: {within}/{len(values)}"
    )
    print(
        "\n| problem | 1 GPU best ms | config | N GPUs best ms | config | ratio |"
        "\n|---|---:|---|---:|---|---:|"
    )
    for key, ratio in sorted(ratios.items(), key=lambda kv: -abs(kv[1] - 1)):
        a, b = one[key], many[key]
        config_a, config_b = config_text(a["best"]) or "-", config_text(b["best"]) or "-"
        print(
            f"| {a['label']} | {a['best_ms']:.4f} | {config_a} | {b['best_ms']:.4f} | {config_b} "
            f"| {ratio:.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="tune the suites on GPUs 0..N-1")
    r.add_argument("--gpus", type=int, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--suites", default="quick,llm")
    r.add_argument("--trials", type=int, default=12)
    r.add_argument("--jobs", type=int, default=8, help="compile processes per GPU")
    r.add_argument("--limits", default="200,360", help="seconds each suite may take (then it is stopped)")
    r.add_argument("--interpret", action="store_true", help="a CPU dry run of this script (not timings)")
    c = sub.add_parser("compare", help="the table of two runs")
    c.add_argument("out", type=Path)
    c.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    if args.what == "run":
        suites = args.suites.split(",")
        limits = [float(x) for x in args.limits.split(",")]
        run(args.gpus, args.out, suites, args.trials, args.jobs, limits, args.interpret)
    else:
        compare(args.out, args.gpus)


if __name__ == "__main__":
    main()
