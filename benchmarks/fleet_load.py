"""Where a tuning worker's time goes as workers are added, without GPUs: N simulated workers
tune one list through the real lease loop, sampler and database, each candidate's GPU work a
sleep (issue 92: on 4 GPUs each problem cost a third more than on one).

    python3 benchmarks/fleet_load.py --workers 1,2,4,8 --trials 12          # SQLite (WAL)
    python3 benchmarks/fleet_load.py --workers 1,4 --db postgresql+psycopg://...  # PostgreSQL
    python3 benchmarks/fleet_load.py --workers 1,4 --as threads             # one process, N threads
    python3 benchmarks/fleet_load.py --workers 1,4 --as commands            # N epilab processes

Each run is a fresh database and the same list (default: the ``quick`` and ``llm`` suites).
The workers are what ``epilab tune --devices`` runs (``tuner/fleet.run_fleet``: a process a
device, ``--as processes``, the default; leases, heartbeats, the optuna study stored beside the
records), except that a candidate is not compiled, checked or timed: it sleeps ``--gpu-ms`` (the
GIL released, as a worker waiting on its GPU process is) and is recorded with a time from a fixed
landscape, as a real one is. No baselines are timed. ``--as threads`` runs the workers as threads
of one process (``FleetOptions.processes`` off: how ``--devices`` ran before), ``--as commands``
as separate processes of one worker each on the shared database (the two-host layout of
``fleet_scaling.py hosts``).

Per run: problems, wall, and per problem the mean seconds of each phase the tuner reports
(``tuner/phases.py``): ``database`` (the study opened, each trial recorded, leases aside),
``feasibility``, ``timing`` (the simulated GPU) and ``search`` (the rest: the sampler and the
trials it writes to the stored study), and the cost of a problem against one worker's. The
fixed sleep makes the GPU's share equal in every run: whatever grows with N is the host's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rounds import run_meta

from epilab.db import TuningDB
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.tuner import fleet
from epilab.tuner.fleet_worker import Event, FleetOptions
from epilab.tuner.search import Budget, Outcome, TakenOver
from epilab.tuner.tune import TuneOptions, Tuner, _timing, problem_bytes, problem_flops

SHOWN = ("database", "search", "feasibility", "timing")
GPU_MS_VAR = "EPILAB_FLEET_LOAD_GPU_MS"  # a candidate's simulated GPU time, in every process


class SimulatedTuner(Tuner):
    """A tuner whose candidates sleep instead of running: everything else is the real one
    (``FleetOptions.tuner`` names it, so that each device's process makes one)."""

    gpu_s = float(os.environ.get(GPU_MS_VAR, "50")) / 1e3

    def iter_evaluate(  # type: ignore[override]
        self,
        problem: Problem,
        configs: list[Config],
        *,
        study: str,
        on_result: Callable[[Config, dict], None] | None = None,
        holds: Callable[[], bool] = lambda: True,
        phases: Any = None,
        **_: Any,
    ) -> Iterator[Outcome]:
        flops, nbytes = problem_flops(problem), problem_bytes(problem)
        for config in configs:
            slept = time.monotonic()
            time.sleep(self.gpu_s)
            if phases is not None:
                phases["timing"] += time.monotonic() - slept
            if not holds():
                raise TakenOver("the lease was lost while a trial ran")
            ms = landscape_ms(problem, config)
            result = {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "method": "simulated", "graph_ms": ms}
            recording = time.monotonic()
            self.db.record_trial(
                problem,
                self.device,
                config=config.to_dict(),
                status="ok",
                timing=_timing(result, flops, nbytes),
                max_rel_error=0.0,
                versions=self.versions,
                study=study,
                trial_number=None,
                detail=None,
            )
            if phases is not None:
                phases["database"] += time.monotonic() - recording
            self.evaluated += 1
            if on_result is not None:
                on_result(config, result)
            yield Outcome("ok", ms)


def landscape_ms(problem: Problem, config: Config) -> float:
    """A fixed time for each (problem, config): a smooth part by tile size, and a spread of
    +-30% from a hash, so that the sampler has something to find."""
    tile = config.BLOCK_M * config.BLOCK_N
    h = int(hashlib.sha256(f"{problem.key}{config!r}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return 0.05 * (1 + abs(tile - 128 * 128) / (128 * 128)) * (0.7 + 0.6 * h)


def work_list(suites: str) -> list[tuple[str, Problem]]:
    from epilab.policy.suites import SUITES

    out = {}
    for name in suites.split(","):
        for spec in SUITES[name]:
            problem = spec.problem()
            out.setdefault(problem.key, (spec.label(), problem))
    return list(out.values())


def run_fleet(url: str, workers: int, trials: int, suites: str, processes: bool) -> tuple[list[dict], float]:
    """One ``run_fleet`` of ``workers`` simulated devices (a process or a thread each): its results,
    and the seconds until the last worker took its first problem (the start-up)."""
    options = TuneOptions(budget=Budget(trials=trials, seconds=1e9, patience=trials), interpret=True, jobs=0)
    simulated = (str(Path(__file__).resolve()), "SimulatedTuner")
    devices = tuple(range(workers))
    first: dict[str, float] = {}
    started = time.monotonic()

    def listen(event: Event) -> None:
        if event.what == "start":
            first.setdefault(event.worker, time.monotonic() - started)

    with TuningDB.open(url) as db:
        report = fleet.run_fleet(
            db,
            work_list(suites),
            dataclasses.replace(options, baselines=()),
            FleetOptions(devices=devices, poll_s=0.2, processes=processes, tuner=simulated),
            trials=trials,
            listener=listen,
        )
    for w in report.workers:
        if w.error is not None:
            raise w.error
    results = [{"worker": w.name, **r.to_dict()} for w in report.workers for r in w.results]
    return results, max(first.values(), default=0.0)


def run(url: str, workers: int, trials: int, suites: str, gpu_ms: float, mode: str) -> dict:
    os.environ[GPU_MS_VAR] = str(gpu_ms)
    SimulatedTuner.gpu_s = gpu_ms / 1e3
    started = time.monotonic()
    if mode != "commands":
        results, start_s = run_fleet(url, workers, trials, suites, processes=mode == "processes")
    else:
        args = [sys.executable, __file__, "--one", url, "--trials", str(trials), "--suites", suites]
        children = [
            subprocess.Popen([*args, "--gpu-ms", str(gpu_ms)], stdout=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        results, start_s = [r for c in children for r in json.loads(c.communicate()[0])], math.nan
    wall = time.monotonic() - started
    per_problem = {phase: statistics.mean(r["phases"].get(phase, 0.0) for r in results) for phase in SHOWN}
    return {
        "workers": workers,
        "as": mode,
        "problems": len(results),
        "wall_s": wall,
        "start_s": start_s,
        "problem_s": statistics.mean(r["seconds"] for r in results),
        "phases": per_problem,
        "trials": sum(r["trials"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--suites", default="quick,llm")
    parser.add_argument("--gpu-ms", type=float, default=50.0, help="a candidate's simulated GPU time")
    parser.add_argument("--db", help="a PostgreSQL URL (each run empties it); default a new SQLite file")
    parser.add_argument(
        "--as",
        dest="mode",
        choices=("processes", "threads", "commands"),
        default="processes",
        help="the workers as run_fleet's processes (epilab tune --devices), its threads, or commands",
    )
    parser.add_argument("--json", help="write the runs here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a --processes child: tune into this URL
    args = parser.parse_args()
    if args.one:
        os.environ[GPU_MS_VAR] = str(args.gpu_ms)
        SimulatedTuner.gpu_s = args.gpu_ms / 1e3
        print(json.dumps(run_fleet(args.one, 1, args.trials, args.suites, processes=False)[0]))
        return
    runs = []
    for n in (int(x) for x in args.workers.split(",")):
        url = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='fleet-load-')}/t.db"
        if args.db:
            _empty(args.db)
        runs.append(run(url, n, args.trials, args.suites, args.gpu_ms, args.mode))
        print(
            f"{n} worker(s): {runs[-1]['problems']} problems in {runs[-1]['wall_s']:.1f} s", file=sys.stderr
        )
    if args.json:
        meta = run_meta(interpret=True) | {"gpu": "none: each candidate a sleep of --gpu-ms", **vars(args)}
        Path(args.json).write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    one = runs[0]["problem_s"]
    print(
        f"| workers | as | problems | wall s | start-up s | s a problem | "
        f"vs {runs[0]['workers']} | " + " | ".join(f"{p} s" for p in SHOWN) + " |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(SHOWN))
    for r in runs:
        print(
            f"| {r['workers']} | {r['as']} | {r['problems']} | {r['wall_s']:.1f} | {r['start_s']:.1f} | "
            f"{r['problem_s']:.2f} | {r['problem_s'] / one:.2f}x | "
            + " | ".join(f"{r['phases'][p]:.3f}" for p in SHOWN)
            + " |"
        )


def _empty(url: str) -> None:
    """Drop every table of the PostgreSQL database at ``url`` (ours and optuna's)."""
    from sqlalchemy import MetaData, create_engine

    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    meta.drop_all(engine)
    engine.dispose()


if __name__ == "__main__":
    main()
