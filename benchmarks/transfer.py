"""Config transfer: how well the nearest record's config serves a problem it was not tuned for.

    python benchmarks/transfer.py --db transfer.db [--suites llm,quick] [--trials 16] [--json out.json]

Every problem of the suites (their own template; no twins) is tuned with the budget
(`Tuner.tune_problem`, resumable). The problems, sorted by (dtype, M, N, K, epilogue), are
split into halves by alternation: the even ones are the *source* half, the odd ones the
*held-out* half. For each held-out problem, the nearest source problem by
`policy.nearest.distance` whose best config is feasible for it gives the transferred
config; the held-out problem's own best config and the transferred one are then timed
again, side by side, with the tuner's evaluation (compile, check against float64, CUDA
events with L2 flushed; CUDA-graph replay for kernels under 50 us, compared like with
like). ratio = exact / transferred time (1.0: the transfer lost nothing). The summary
gives, per distance bound, how many held-out problems fall within it and the median and
worst ratio: `policy.nearest.MAX_DISTANCE` and `MIN_SPEEDUP` come from that table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rounds import run_meta

from epilab.db import TuningDB
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.nearest import distance, why_not
from epilab.policy.suites import problem_label, suite
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

BOUNDS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)


def _ms(result: dict, other: dict) -> float:
    """Like with like: CUDA-graph times when both have one, else the events medians."""
    if result.get("graph_ms") is not None and other.get("graph_ms") is not None:
        return result["graph_ms"]
    return result["median_ms"]


def _transferred(
    db: TuningDB, tuner: Tuner, p: Problem, near: list[tuple[float, Problem]]
) -> tuple[float, Problem, Config] | None:
    """The nearest source problem whose best config is feasible for ``p``."""
    for d, q in near:
        best = db.best(q.key, tuner.device, tuner.versions)
        if best is not None:
            moved = Config.from_dict(best.record.config or {})
            if why_not(p, moved, tuner.device) is None:
                return d, q, moved
    return None


def _sort_key(p: Problem) -> tuple:
    return (p.dtype, p.shape.m, p.shape.n, p.shape.k, p.epilogue.text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--suites", default="llm,quick")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--patience", type=int, default=8)
    parser.add_argument(
        "--interpret", action="store_true", help="dry run in Triton's interpreter (not GPU times)"
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    problems = sorted(
        {s.problem().key: s.problem() for name in args.suites.split(",") for s in suite(name)}.values(),
        key=_sort_key,
    )
    source, held = problems[0::2], problems[1::2]
    options = TuneOptions(
        budget=Budget(trials=args.trials, seconds=args.seconds, patience=args.patience),
        baselines=("cublas",),
        interpret=args.interpret,
        jobs=0 if args.interpret else 8,
    )
    rows = []
    started = time.monotonic()
    with TuningDB.open(args.db) as db, Tuner(db, options) as tuner:
        for i, p in enumerate(problems, 1):
            r = tuner.tune_problem(p, problem_label(p))
            print(f"[{i}/{len(problems)}] tuned {r.label}: {r.best_ms} ms in {r.seconds:.0f} s", flush=True)
        tune_s = time.monotonic() - started
        for p in held:
            exact = db.best(p.key, tuner.device, tuner.versions)
            if exact is None:
                continue
            near = sorted(((d, q) for q in source if (d := distance(p, q)) is not None), key=lambda dq: dq[0])
            found = _transferred(db, tuner, p, near)
            if found is None:
                continue
            d, q, moved = found
            own = Config.from_dict(exact.record.config or {})
            results: list[dict] = []
            configs = [own] if moved == own else [own, moved]
            tuner.evaluate(
                p, configs, study="transfer-check", on_result=lambda _c, res, out=results: out.append(res)
            )
            got = {"own": results[0], "moved": results[-1]}
            if any(g.get("status") != "ok" for g in got.values()):
                print(f"skipped {problem_label(p)}: {[g.get('status') for g in got.values()]}")
                continue
            t_own, t_moved = _ms(got["own"], got["moved"]), _ms(got["moved"], got["own"])
            row = {
                "problem": problem_label(p),
                "source": problem_label(q),
                "distance": round(d, 3),
                "same_config": moved == own,
                "exact_ms": t_own,
                "transferred_ms": t_moved,
                "ratio": t_own / t_moved,
                "timed_as": "graph"
                if got["own"].get("graph_ms") and got["moved"].get("graph_ms")
                else "events",
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = []
    for bound in BOUNDS:
        within = [r["ratio"] for r in rows if r["distance"] <= bound]
        if within:
            summary.append(
                {
                    "distance_at_most": bound,
                    "problems": len(within),
                    "median_ratio": statistics.median(within),
                    "worst_ratio": min(within),
                }
            )
    result = {
        **run_meta(args.interpret),
        "budget": {"trials": args.trials, "seconds": args.seconds, "patience": args.patience},
        "suites": args.suites,
        "tune_s": round(tune_s, 1),
        "rows": rows,
        "summary": summary,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print("| held-out problem | nearest source | distance | exact ms | transferred ms | exact/transferred |")
    print("|---|---|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: r["distance"]):
        print(
            f"| {r['problem']} | {r['source']} | {r['distance']:.2f} | {r['exact_ms']:.4f} | "
            f"{r['transferred_ms']:.4f} | {r['ratio']:.3f} |"
        )
    print("\n| distance <= | held-out problems | median exact/transferred | worst |")
    print("|---:|---:|---:|---:|")
    for s in summary:
        bound, count, median, worst = (
            s["distance_at_most"],
            s["problems"],
            s["median_ratio"],
            s["worst_ratio"],
        )
        print(f"| {bound} | {count} | {median:.3f} | {worst:.3f} |")


if __name__ == "__main__":
    main()
