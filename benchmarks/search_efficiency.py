"""Search efficiency: how close the tuner gets in 16 / 32 / 64 trials to the best of
a random sample of the feasible space.

    python benchmarks/search_efficiency.py --db eff.db [--sample 300] [--json out.json]

For each problem: time a random sample of feasible configs (the same evaluation
the tuner uses: compile in parallel, check against float64, time with L2 flushed
before each repetition), then run a fresh in-memory optuna search as `epilab tune`
does (seeded, multivariate TPE, no early stop) for 64 trials, and report the best
after 16, 32 and 64 trials as a % gap to the sample's best (negative: the search
found something faster than the whole sample). Everything timed is recorded in
the database given.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from epilab.db import TuningDB
from epilab.policy.space import applies, configs, infeasible, space_for
from epilab.templates.gemm.gemm_spec import Spec
from epilab.tuner.search import Budget, make_study, search
from epilab.tuner.tune import TuneOptions, Tuner

PROBLEMS = [
    Spec(4096, 4096, 4096, epilogue="bias_gelu_tanh_residual"),
    Spec(2048, 4096, 4096, epilogue="bias_residual"),
    Spec(128, 4096, 4096, epilogue="bias_gelu_tanh_residual"),
]
CHECKPOINTS = (16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--json")
    parser.add_argument("--only", type=int, nargs="*", help="1-based indices of PROBLEMS to run")
    args = parser.parse_args()
    rows = []
    with TuningDB.open(args.db) as db, Tuner(db, TuneOptions(baselines=())) as tuner:
        for spec in [PROBLEMS[i - 1] for i in args.only] if args.only else PROBLEMS:
            problem = spec.problem()
            db.put_problem(problem)
            feasible = configs(problem, tuner.limits)
            sample = random.Random(0).sample(feasible, min(args.sample, len(feasible)))
            start = time.monotonic()
            outcomes = []
            for i in range(0, len(sample), 16):
                outcomes += tuner.evaluate(problem, sample[i : i + 16], study="random-sample")
            sample_s = time.monotonic() - start
            ok = [(o.ms, c) for o, c in zip(outcomes, sample, strict=True) if o.ms is not None]
            sample_best, sample_cfg = min(ok, key=lambda t: t[0])
            best_at: dict[int, float] = {}
            count = 0

            def on_trial(config, outcome, best, best_ms, best_at=best_at) -> None:
                nonlocal count
                count += 1
                if count in CHECKPOINTS and best_ms is not None:
                    best_at[count] = best_ms

            start = time.monotonic()
            study = make_study(f"efficiency-{problem.key[:16]}", None, restart=False)
            result = search(
                study,
                space_for(problem),
                evaluate=lambda cs, p=problem: tuner.evaluate(p, cs, study="efficiency-search"),
                infeasible=lambda c, p=problem: infeasible(p, c, tuner.limits),
                budget=Budget(trials=max(CHECKPOINTS), seconds=1e9, patience=10**6),
                seeds=tuner.seeds(problem),
                on_trial=on_trial,
                applies=applies(problem),
            )
            search_s = time.monotonic() - start
            rows.append(
                {
                    "problem": spec.label(),
                    "feasible": len(feasible),
                    "sampled": len(sample),
                    "sample_ok": len(ok),
                    "sample_best_ms": sample_best,
                    "sample_best_config": sample_cfg.short(),
                    "sample_seconds": sample_s,
                    "search_best_ms": result.best_ms,
                    "search_best_config": result.best.short() if result.best else None,
                    "best_at": best_at,
                    "search_seconds": search_s,
                    "gap_pct": {n: 100 * (ms / sample_best - 1) for n, ms in best_at.items()},
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(
        f"\n{'problem':42} | {'feasible':>8} | {'sample best ms':>14} | "
        + " | ".join(f"gap@{n:<3}" for n in CHECKPOINTS)
        + " | search s"
    )
    for r in rows:
        gaps = " | ".join(f"{r['gap_pct'].get(n, float('nan')):+6.1f}%" for n in CHECKPOINTS)
        print(
            f"{r['problem']:42} | {r['feasible']:>8} | {r['sample_best_ms']:14.4f} | {gaps} | "
            f"{r['search_seconds']:.0f}"
        )


if __name__ == "__main__":
    main()
