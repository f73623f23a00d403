"""Digests of rendered kernel sources: a check that a refactor left every kernel as it was.

Renders every problem of every built-in suite with a spread of its feasible configs
(about 12 per problem, from ``space.configs(problem, HOPPER)``) for both targets, and
writes the sha256 of each source and each problem's template hash to a JSON file, keyed by
the problem without its hash (so that a change of hashing alone compares); with
``--compare OLD.json`` it lists what differs. CPU only (no GPU, no interpreter run);
enumerating the matmul space makes it take tens of minutes. ``--seeds``: every suite problem
and its twins with the default config and each of its kind's seeds that fits it instead (a
minute). Run on an older tree (``PYTHONPATH`` at a checkout of it) for the ``before`` file.

    python benchmarks/render_digest.py after.json --compare before.json [--seeds]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from epilab.policy import space, suites

try:
    from epilab.templates.registry import default_config, kind_of, source, twins
except ImportError:  # a tree before templates/ was arranged by family (2026-12-07)
    from epilab.templates.kinds import default_config, kind_of, source, twins  # type: ignore[no-redef]


def unhashed_key(problem: object) -> str:
    """The problem's key computed without its template hash, its operands' broadcast under
    today's name (an epilab before revision 0009 called it ``kind``)."""
    d = problem.to_dict()  # type: ignore[attr-defined]
    d.pop("template_hash")
    for node in d["epilogue"]["nodes"]:
        if node[0] == "operand" and "kind" in node[2]:
            node[2]["broadcast"] = node[2].pop("kind")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def digest(seeds: bool = False) -> dict[str, object]:
    sources: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for name in sorted(suites.SUITES):
        for spec in suites.SUITES[name]:
            for problem in twins(spec.problem()) if seeds else [spec.problem()]:
                key = unhashed_key(problem)
                if key in hashes:
                    continue
                hashes[key] = problem.template_hash
                for target in ("cuda", "interpreter"):
                    for config in _configs(problem, target, seeds):
                        text = source(problem, config, target=target)
                        sources[f"{key}|{config.short()}|{target}"] = hashlib.sha256(
                            text.encode()
                        ).hexdigest()
    return {"hashes": hashes, "sources": sources}


def _configs(problem: object, target: str, seeds: bool) -> list[object]:
    """The configs a problem is rendered with: a spread of its space, or (``seeds``) its default
    config and the seeds of its kind that fit it."""
    if not seeds:
        found = space.configs(problem, space.HOPPER)
        return list(found[:: max(1, len(found) // 12)])
    kind = kind_of(problem)
    return [default_config(problem, target), *(c for c in kind.seeds if kind.check(problem, c) is None)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--compare", help="an earlier digest to compare with")
    parser.add_argument("--seeds", action="store_true", help="default configs and seeds (fast)")
    args = parser.parse_args()
    now = digest(args.seeds)
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
