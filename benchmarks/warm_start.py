"""Warm starts: how close a search seeded by the nearest records gets in 8 / 16 / 32 trials to
a cold search of 64 trials.

    python benchmarks/warm_start.py --db warm.db [--suites llm,midm,conv] [--json out.json]

The problems of the suites (their own template, one of each key), sorted by (template,
dtype, M, N, K, epilogue), are split by alternation into a *source* half and a *held-out*
half, as ``benchmarks/transfer.py`` splits them. The source half is tuned cold with
``--source-trials`` (``Tuner.tune_problem``, resumable). Each held-out problem's warm seeds
(``policy.nearest.warm_seeds``: the best configs of its nearest source records) are read once,
before any held-out problem is measured. Then, per held-out problem, two fresh in-memory
searches as ``epilab tune`` runs them (the same sampler seed, no early stop): *cold*, from the
template's own seeds, for ``--cold-trials``; *warm*, from the warm seeds and then the
template's, for ``--warm-trials``. The best config after 8, 16, 32 (and 64) trials of each
is then timed again side by side (``--rounds`` interleaved rounds of the tuner's evaluation:
compile, check against float64, CUDA events with L2 flushed, CUDA-graph replay compared like
with like), so a verdict does not hang on one noisy measurement. The table gives each best
as a fraction of the cold 64-trial best's speed (1.00: as fast); the summary counts the
held-out problems where that fraction is >= 0.97, the issue's bar. ``roofline at`` is the
trial at which the warm search's best reached ``policy/roofline.py``'s stop (where it did).

A run stopped part way resumes from ``--state`` (default: beside the database): the source
studies are stored, and the held-out problems already measured are not measured again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

from rounds import run_meta

from epilab.db import TuningDB
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.nearest import warm_seeds
from epilab.policy.space import applies, infeasible, space_for
from epilab.policy.suites import problem_label, suite
from epilab.tuner.search import Budget, make_study, search
from epilab.tuner.tune import TuneOptions, Tuner

CHECKPOINTS = (8, 16, 32, 64)
BAR = 0.97  # the issue's: a warm best within 3% of the cold 64-trial best


def _sort_key(p: Problem) -> tuple:
    s = p.shape
    return (p.template, p.dtype, int(s.m), int(s.n), int(s.k), p.epilogue.text())


def _searched(
    tuner: Tuner, p: Problem, seeds: list[Config], trials: int, name: str, good_enough: float | None
) -> dict:
    """A fresh in-memory search of ``trials`` from ``seeds``: the best config at each checkpoint,
    the trial at which the best reached ``good_enough`` (or None), and its seconds."""
    at: dict[int, Config] = {}
    count = 0
    reached: int | None = None

    def on_trial(config, outcome, best, best_ms) -> None:
        nonlocal count, reached
        count += 1
        if best is not None and count in CHECKPOINTS:
            at[count] = best
        if reached is None and good_enough is not None and best_ms is not None and best_ms <= good_enough:
            reached = count

    started = time.monotonic()
    result = search(
        make_study(name, None, restart=False, seed=0),
        space_for(p, tuner.limits),
        evaluate=lambda cs: tuner.iter_evaluate(p, cs, study=name),
        infeasible=lambda c: infeasible(p, c, tuner.limits),
        budget=Budget(trials=trials, seconds=1e9, patience=trials),
        seeds=seeds,
        on_trial=on_trial,
        applies=applies(p),
    )
    if result.best is not None:  # a search that ran out of configs early: its best holds on
        for k in CHECKPOINTS:
            if k <= trials and k not in at and k > count:
                at[k] = result.best
    return {"at": at, "roofline_at": reached, "seconds": time.monotonic() - started, "trials": count}


def _retimed(tuner: Tuner, p: Problem, configs: list[Config], rounds: int) -> dict[Config, float]:
    """Each config's median time over ``rounds`` interleaved rounds (the order rotates);
    CUDA-graph times where every config has one, else the events medians."""
    times: dict[Config, list[dict]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        tuner.evaluate(p, order, study="warm-start-retime", on_result=lambda c, res: times[c].append(res))
    ok = {c: [x for x in got if x.get("status") == "ok"] for c, got in times.items()}
    graph = all(x.get("graph_ms") for got in ok.values() for x in got)
    key = "graph_ms" if graph else "median_ms"
    return {c: statistics.median(x[key] for x in got) for c, got in ok.items() if got}


def _row(
    tuner: Tuner, p: Problem, seeds: list[Config], args: argparse.Namespace, reference: dict | None
) -> dict:
    own = tuner.seeds(p)  # the template's (this tuner runs cold)
    good = tuner.roofline_ms(p)
    if reference is None:
        cold = _searched(tuner, p, own, args.cold_trials, f"cold-{p.key[:16]}", good)
    else:  # an earlier run's cold best, timed again beside this run's warm bests
        best = Config.from_dict(reference["configs"][f"cold@{args.cold_trials}"])
        cold = {"at": {args.cold_trials: best}, "roofline_at": None, "seconds": 0.0}
    warm = _searched(tuner, p, tuner.warm_start(p, seeds), args.warm_trials, f"warm-{p.key[:16]}", good)
    picks = {f"cold@{k}": c for k, c in cold["at"].items()} | {f"warm@{k}": c for k, c in warm["at"].items()}
    distinct = list(dict.fromkeys(picks.values()))
    ms = _retimed(tuner, p, distinct, args.rounds)
    ref = ms.get(picks.get(f"cold@{args.cold_trials}"))  # type: ignore[arg-type]
    return {
        "problem": problem_label(p),
        "warm_seeds": len(seeds),
        "ms": {name: ms.get(c) for name, c in picks.items()},
        "speed": {name: (ref / ms[c] if ref and ms.get(c) else None) for name, c in picks.items()},
        "configs": {name: c.to_dict() for name, c in picks.items()},
        "roofline_at": {"cold": cold["roofline_at"], "warm": warm["roofline_at"]},
        "seconds": {"cold": round(cold["seconds"], 1), "warm": round(warm["seconds"], 1)},
    }


def _summary(rows: list[dict], args: argparse.Namespace) -> list[str]:
    lines = []
    for side, most in (("warm", args.warm_trials), ("cold", args.cold_trials)):
        for k in (c for c in CHECKPOINTS if c <= most and (side, c) != ("cold", args.cold_trials)):
            got = [r["speed"].get(f"{side}@{k}") for r in rows]
            got = [g for g in got if g]
            if got:
                hit = sum(g >= BAR for g in got)
                geo = math.exp(statistics.fmean(math.log(g) for g in got))
                lines.append(
                    f"- {side} {k} trials: >= {BAR:.2f} of the cold {args.cold_trials}-trial best on {hit} "
                    f"of {len(got)} held-out problems ({100 * hit / len(got):.0f}%); geomean {geo:.3f}, "
                    f"worst {min(got):.3f}"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--suites", default="llm,midm,conv")
    parser.add_argument("--source-trials", type=int, default=32)
    parser.add_argument("--cold-trials", type=int, default=64)
    parser.add_argument("--warm-trials", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--state", help="JSON of the held-out rows so far (default: the db's path + .json)")
    parser.add_argument(
        "--reference",
        help="JSON of an earlier run (--json): its cold best of each problem is timed again beside "
        "this run's warm bests instead of a new cold search",
    )
    parser.add_argument("--interpret", action="store_true", help="dry run in Triton's interpreter")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.interpret:  # before the workers start: they read it
        os.environ["EPILAB_INTERPRET"] = os.environ["TRITON_INTERPRET"] = "1"
    problems = sorted(
        {s.problem().key: s.problem() for name in args.suites.split(",") for s in suite(name)}.values(),
        key=_sort_key,
    )
    source, held = problems[0::2], problems[1::2]
    state_path = args.state or f"{args.db}.json"
    done: dict[str, dict] = {}
    if os.path.exists(state_path):
        with open(state_path) as f:
            done = {r["key"]: r for r in json.load(f)}
    options = TuneOptions(
        budget=Budget(trials=args.source_trials, seconds=1e9, patience=args.source_trials),
        baselines=(),
        interpret=args.interpret,
        jobs=0 if args.interpret else 8,
        warm=False,
    )
    references: dict[str, dict] = {}
    if args.reference:
        with open(args.reference) as f:
            references = {r["key"]: r for r in json.load(f)["rows"]}
    started = time.monotonic()
    with TuningDB.open(args.db) as db, Tuner(db, options) as tuner:
        for i, p in enumerate(source, 1):
            r = tuner.tune_problem(p, problem_label(p))
            print(f"[source {i}/{len(source)}] {r.label}: {r.best_ms} ms, {r.seconds:.0f} s", flush=True)
        seeds = {p.key: warm_seeds(db, p, tuner.device, tuner.versions) for p in held}
        for i, p in enumerate(held, 1):
            if p.key in done or (args.reference and p.key not in references):
                continue
            db.put_problem(p)
            row = {"key": p.key, **_row(tuner, p, seeds[p.key], args, references.get(p.key))}
            done[p.key] = row
            with open(state_path, "w") as f:
                json.dump(list(done.values()), f, indent=1)
            speed = {k: round(v, 3) for k, v in row["speed"].items() if v}
            print(f"[held-out {i}/{len(held)}] {row['problem']}: {speed}", flush=True)
    rows = [done[p.key] for p in held if p.key in done]
    result = {
        **run_meta(args.interpret),
        "suites": args.suites,
        "trials": {"source": args.source_trials, "cold": args.cold_trials, "warm": args.warm_trials},
        "rounds": args.rounds,
        "reference": args.reference,
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
        "summary": _summary(rows, args),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    names = [f"warm@{k}" for k in CHECKPOINTS if k <= args.warm_trials]
    names += [f"cold@{k}" for k in CHECKPOINTS if k < args.cold_trials]
    print(f"\n| held-out problem | warm seeds | {' | '.join(names)} | roofline at (warm) | cold s | warm s |")
    print("|---|---:|" + "---:|" * len(names) + "---:|---:|---:|")
    for r in rows:
        cells = " | ".join(f"{r['speed'][n]:.3f}" if r["speed"].get(n) else "-" for n in names)
        print(
            f"| {r['problem']} | {r['warm_seeds']} | {cells} | {r['roofline_at']['warm'] or '-'} | "
            f"{r['seconds']['cold']:.0f} | {r['seconds']['warm']:.0f} |"
        )
    print(f"\nspeed: the cold {args.cold_trials}-trial best's time / this best's time, both timed again")
    print("\n".join(_summary(rows, args)))


if __name__ == "__main__":
    main()
