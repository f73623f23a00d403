"""Record the twins of a suite's problems in a tuning database, so that
``epilab tune --seen`` tunes them (and nothing already tuned).

    python benchmarks/register_twins.py --db conv.db --suite conv
"""

from __future__ import annotations

import argparse

from epilab.db import TuningDB
from epilab.policy.suites import SUITES
from epilab.templates.kinds import twins


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--suite", required=True, choices=sorted(SUITES))
    args = parser.parse_args()
    with TuningDB.open(args.db) as db:
        added = 0
        for spec in SUITES[args.suite]:
            for twin in twins(spec.problem())[1:]:
                db.put_problem(twin)
                added += 1
    print(f"recorded {added} twin problem(s) of the {args.suite} suite")


if __name__ == "__main__":
    main()
