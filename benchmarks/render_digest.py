"""Digests of rendered kernel sources: a check that a refactor left every kernel as it was.

Renders every problem of every built-in suite with a spread of its feasible configs
(about 12 per problem, from ``space.configs(problem, HOPPER)``) for both targets, and
writes the sha256 of each source and the template hashes to a JSON file; with
``--compare OLD.json`` it lists what differs. CPU only (no GPU, no interpreter run);
enumerating the matmul space makes it take minutes.

    python benchmarks/render_digest.py after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from epilab.templates.kinds import current_hashes, source
from epilab.tuner import space, suites


def digest() -> dict[str, object]:
    sources: dict[str, str] = {}
    seen: set[str] = set()
    for name in sorted(suites.SUITES):
        for spec in suites.SUITES[name]:
            problem = spec.problem()
            if problem.key in seen:
                continue
            seen.add(problem.key)
            found = space.configs(problem, space.HOPPER)
            for config in found[:: max(1, len(found) // 12)]:
                for target in ("cuda", "interpreter"):
                    text = source(problem, config, target=target)
                    key = f"{problem.key}|{config.short()}|{target}"
                    sources[key] = hashlib.sha256(text.encode()).hexdigest()
    return {"hashes": current_hashes(), "sources": sources}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--compare", help="an earlier digest to compare with")
    args = parser.parse_args()
    now = digest()
    with open(args.out, "w") as f:
        json.dump(now, f, indent=0, sort_keys=True)
    print(f"{len(now['sources'])} sources; template hashes {now['hashes']}")
    if args.compare is None:
        return 0
    with open(args.compare) as f:
        old = json.load(f)
    differ = sorted(k for k in old["sources"] if old["sources"][k] != now["sources"].get(k))
    added = sorted(set(now["sources"]) - set(old["sources"]))
    print(f"template hashes {'unchanged' if old['hashes'] == now['hashes'] else 'CHANGED'}")
    print(f"{len(differ)} of {len(old['sources'])} sources differ or are gone; {len(added)} new")
    for key in differ[:20]:
        print("  differs:", key)
    return 1 if differ or old["hashes"] != now["hashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
