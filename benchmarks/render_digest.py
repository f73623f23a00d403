"""Digests of rendered kernel sources: a check that a refactor left every kernel as it was.

Renders every problem of every built-in suite with a spread of its feasible configs
(about 12 per problem, from ``space.configs(problem, HOPPER)``) for both targets, and
writes the sha256 of each source and each problem's template hash to a JSON file, keyed by
the problem without its hash (so that a change of hashing alone compares); with
``--compare OLD.json`` it lists what differs. CPU only (no GPU, no interpreter run);
enumerating the matmul space makes it take minutes.

    python benchmarks/render_digest.py after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from epilab.policy import space, suites
from epilab.templates.registry import source


def unhashed_key(problem: object) -> str:
    """The problem's key computed without its template hash, its operands' broadcast under
    today's name (an epilab before revision 0009 called it ``kind``)."""
    d = problem.to_dict()  # type: ignore[attr-defined]
    d.pop("template_hash")
    for node in d["epilogue"]["nodes"]:
        if node[0] == "operand" and "kind" in node[2]:
            node[2]["broadcast"] = node[2].pop("kind")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def digest() -> dict[str, object]:
    sources: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for name in sorted(suites.SUITES):
        for spec in suites.SUITES[name]:
            problem = spec.problem()
            key = unhashed_key(problem)
            if key in hashes:
                continue
            hashes[key] = problem.template_hash
            found = space.configs(problem, space.HOPPER)
            for config in found[:: max(1, len(found) // 12)]:
                for target in ("cuda", "interpreter"):
                    text = source(problem, config, target=target)
                    sources[f"{key}|{config.short()}|{target}"] = hashlib.sha256(text.encode()).hexdigest()
    return {"hashes": hashes, "sources": sources}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--compare", help="an earlier digest to compare with")
    args = parser.parse_args()
    now = digest()
    with open(args.out, "w") as f:
        json.dump(now, f, indent=0, sort_keys=True)
    print(f"{len(now['sources'])} sources of {len(now['hashes'])} problems")
    if args.compare is None:
        return 0
    with open(args.compare) as f:
        old = json.load(f)
    differ = sorted(k for k in old["sources"] if old["sources"][k] != now["sources"].get(k))
    added = sorted(set(now["sources"]) - set(old["sources"]))
    rehashed = sum(old["hashes"][k] != now["hashes"].get(k) for k in old["hashes"])
    print(f"{rehashed} of {len(old['hashes'])} problems' template hashes changed")
    print(f"{len(differ)} of {len(old['sources'])} sources differ or are gone; {len(added)} new")
    for key in differ[:20]:
        print("  differs:", key)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
