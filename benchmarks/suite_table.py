"""A markdown table of a tuned suite from a tuning database: best tuned time against
each recorded baseline, compared like with like (``db.comparable_ms``).

    epilab tune --suite conv --db conv.db --baselines cudnn,inductor-max-autotune
    python benchmarks/suite_table.py --db conv.db --suite conv [--json out.json]

Columns: the problem, the best config, tuned ms, TFLOP/s, then per baseline its ms and
the speedup (baseline / tuned), and the geomean speedups. Uses the same data as
``epilab report`` (``reports.data.collect``).
"""

from __future__ import annotations

import argparse
import json

from epilab.db import TuningDB
from epilab.policy.suites import SUITES
from epilab.reports.data import collect
from epilab.reports.html import config_text
from epilab.templates.registry import is_current as _is_current
from epilab.templates.registry import twins


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--suite", required=True, choices=sorted(SUITES))
    parser.add_argument("--device", help="device name (default: the one with most trials)")
    parser.add_argument("--json")
    args = parser.parse_args()
    specs = SUITES[args.suite]
    keys = [p.key for spec in specs for p in twins(spec.problem())]
    with TuningDB.open(args.db) as db:
        data = collect(db.snapshot(), db_url=db.url, is_current=_is_current, device=args.device, keys=keys)
    by_key = {p.key: p for p in data.problems}
    libs = data.libraries()
    print(f"GPU: {data.device.name if data.device else '-'}; {'; '.join(data.versions)}")
    print(
        "| problem | best config | ms | TFLOP/s | "
        + " | ".join(f"{lib} ms | vs {lib}" for lib in libs)
        + " |"
    )
    print("|---|---|---:|---:|" + "---:|---:|" * len(libs))
    rows = []
    for spec in specs:
        for i, problem in enumerate(twins(spec.problem())):  # the twins' rows follow the problem's
            p = by_key.get(problem.key)
            if p is None or p.best is None:
                continue
            label = spec.label() + ("" if i == 0 else f" [{problem.template} twin]")
            cells = [label, config_text(p.best.config), f"{p.ms:.4f}", f"{p.tflops(p.ms):.0f}"]
            for lib in libs:
                ms, sp = p.baselines.get(lib), p.speedups.get(lib)
                cells += ["-" if ms is None else f"{ms:.4f}", "-" if sp is None else f"{sp:.2f}x"]
            print("| " + " | ".join(cells) + " |")
            rows.append(
                {
                    "label": label,
                    "ms": p.ms,
                    "config": p.best.config,
                    "baselines": p.baselines,
                    "speedups": p.speedups,
                }
            )
    for lib in libs:
        g = data.geomean(lib)
        if g:
            print(f"\ngeomean speedup over {lib}: {g[0]:.2f}x over {g[1]} problems")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"gpu": data.device.name if data.device else None, "versions": data.versions, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
