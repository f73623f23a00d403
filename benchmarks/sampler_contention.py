"""Does the search's own CPU work (optuna's TPE asks and tells, the feasibility checks) slow
the fleet's workers when they are threads of one process (issue 45)?

    python3 benchmarks/sampler_contention.py [--workers 2] [--problems 3] [--trials 32] \
        [--gpu-ms 20] [--json out.json]

On two H200s, the per-problem cost of tuning rose 10% (12 trials) and 19% (32 trials) with
the second GPU's worker, a thread of the same process; the search's CPU work grows with the
trials TPE models. This separates the two causes that fit: the interpreter lock (threads take
turns) and the host's cores (any two workers share them).

Method. Each worker runs ``--problems`` searches (the ``llm`` suite's problems at M = 2048, the
matmul space cut as for an H100: ``space_for(problem, HOPPER)``) of ``--trials`` trials, in
batches of 8 as the tuner asks them, each study in memory. Evaluating a batch sleeps
``--gpu-ms`` per config (the GPU's time: a sleep releases the interpreter lock as the worker's
wait on its GPU process does) and returns a cost model's time, so TPE models a landscape. Three
runs, one after another: one worker alone; ``--workers`` workers as threads of one process
(the fleet today); as many processes. A worker's search time is its wall time less its sleeps,
per problem; the table gives the median over workers and problems, and its ratio to one
worker's. Threads slower than processes: the interpreter lock; both slower alike: the cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time

from epilab.ir.problem import Config, Problem
from epilab.policy.space import HOPPER, infeasible, space_for
from epilab.policy.suites import suite
from epilab.tuner.search import Budget, Outcome, make_study, search


def problems(count: int) -> list[Problem]:
    chosen = [s.problem() for s in suite("llm") if s.m == 2048]
    return (chosen * count)[:count]


def cost_ms(problem: Problem, c: Config) -> float:
    """A landscape with structure: wide tiles and deep pipelines up to a point, waves of tiles."""
    s = problem.shape
    m, n, k = int(s.m), int(s.n), int(s.k)
    tiles = -(-m // c.BLOCK_M) * -(-n // c.BLOCK_N)
    waves = -(-tiles // 132)
    tile_ms = c.BLOCK_M * c.BLOCK_N * k / 4e9 * (1 + abs(c.num_stages - 4) / 8) * (8 / c.num_warps) ** 0.3
    return waves * tile_ms * (1 + 0.1 * abs(c.BLOCK_K - 64) / 64)


def run_worker(index: int, count: int, trials: int, gpu_ms: float) -> dict:
    """One worker's searches: wall and sleep seconds per problem."""
    rows = []
    for i, problem in enumerate(problems(count)):
        slept = 0.0

        def evaluate(batch: list[Config], problem: Problem = problem) -> list[Outcome]:
            nonlocal slept
            time.sleep(gpu_ms * len(batch) / 1000)
            slept += gpu_ms * len(batch) / 1000
            return [Outcome("ok", cost_ms(problem, c)) for c in batch]

        study = make_study(f"w{index}-p{i}", None, restart=False, seed=index * 1000 + i)
        start = time.perf_counter()
        search(
            study,
            space_for(problem, HOPPER),
            evaluate=evaluate,
            infeasible=lambda c, problem=problem: infeasible(problem, c, HOPPER),
            budget=Budget(trials=trials, seconds=3600, patience=10**6, batch=8),
            applies=problem_applies(problem),
        )
        wall = time.perf_counter() - start
        rows.append({"wall_s": wall, "sleep_s": slept, "search_s": wall - slept})
    return {"worker": index, "problems": rows}


def problem_applies(problem: Problem):
    from epilab.templates.kinds import kind_of

    return kind_of(problem).applies


def _in_threads(workers: int, count: int, trials: int, gpu_ms: float) -> list[dict]:
    results: list[dict] = [{}] * workers

    def one(i: int) -> None:
        results[i] = run_worker(i, count, trials, gpu_ms)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _in_processes(workers: int, count: int, trials: int, gpu_ms: float) -> list[dict]:
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.starmap(run_worker, [(i, count, trials, gpu_ms) for i in range(workers)])


def summary(mode: str, results: list[dict], wall: float) -> dict:
    search_s = [p["search_s"] for r in results for p in r["problems"]]
    return {
        "mode": mode,
        "workers": len(results),
        "wall_s": wall,
        "search_s_median": statistics.median(search_s),
        "search_s_range": [min(search_s), max(search_s)],
        "results": results,
    }


def table(rows: list[dict]) -> str:
    base = rows[0]["search_s_median"]
    lines = [
        "| workers as | workers | wall s | search s a problem (median, min..max) | vs one worker |",
        "|---|---:|---:|---|---:|",
    ]
    for r in rows:
        lo, hi = r["search_s_range"]
        lines.append(
            f"| {r['mode']} | {r['workers']} | {r['wall_s']:.1f} | {r['search_s_median']:.2f} "
            f"({lo:.2f}..{hi:.2f}) | {r['search_s_median'] / base:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--problems", type=int, default=3, help="searches per worker")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--gpu-ms", type=float, default=20.0, help="sleep per evaluated config")
    parser.add_argument("--json", help="write the rows and every worker's times here")
    args = parser.parse_args()
    shape = (args.problems, args.trials, args.gpu_ms)
    rows = []
    for mode, workers, run in (
        ("one", 1, _in_threads),
        ("threads", args.workers, _in_threads),
        ("processes", args.workers, _in_processes),
    ):
        print(f"{mode}: {workers} worker(s)", file=sys.stderr)
        start = time.perf_counter()
        results = run(workers, *shape)
        rows.append(summary(mode, results, time.perf_counter() - start))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print(f"{args.problems} problems x {args.trials} trials a worker, {args.gpu_ms} ms a config asleep")
    print(table(rows))


if __name__ == "__main__":
    main()
