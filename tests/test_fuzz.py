"""Seeded fuzzing of the two parsers that read files from outside: the import validator
(``epilab db import``) and the shapes parser (``epilab tune --shapes``).

Each case spoils a valid input a few times over (a value replaced by one of another type
or range, a key dropped, added or renamed, an element repeated, deep nesting; then, for
some cases, the text cut short or a byte changed) and checks the contract: the parser
either accepts, and what it kept is valid (stored configs read back through
``Config.from_dict``, specs make problems), or it raises a ValueError. Anything else is a
bug. The generator is our own and seeded, so a failure names its seed and case and
reproduces exactly; the whole module runs in well under a minute.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from records import record

from epilab.db import TuningDB
from epilab.db.keys import canonical, problem_key
from epilab.db.transfer import export_json, import_json
from epilab.ir.config import Config
from epilab.policy.imported import parse_problem, validate_config
from epilab.policy.suites import load_shapes
from epilab.templates.gemm.gemm_spec import Spec

SEEDS = range(8)
IMPORT_CASES = 300  # per seed
SHAPES_CASES = 300  # per seed

ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    16.0,
    64,
    2**31,
    10**30,
    -(10**30),
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x" * 5000,
    "\x1b[2J\x1b]0;t\x07",
    "\u202egnp.exe",
    "<script>alert(1)</script>",
    "1e999",
    "2026-13-45T99:99:99",
    "9999-12-31T23:59:59-01:00",
    [],
    {},
    [1, 2, 3],
    {"a": {"b": {"c": []}}},
]


def odd_value(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return json.loads("[" * 400 + "]" * 400)  # deep, within what json itself writes
    return copy.deepcopy(rng.choice(ODD_VALUES))


def containers(node: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every dict and list in ``node``."""
    out = []
    if isinstance(node, (dict, list)):
        out.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out += containers(v, (*path, k))
    return out


def at(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def spoil(doc: Any, rng: random.Random) -> None:
    """One random change somewhere in ``doc`` (in place)."""
    node = at(doc, rng.choice(containers(doc)))
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    action = rng.choice(["replace", "replace", "replace", "drop", "add", "rename", "repeat"])
    if not keys or action == "add":
        if isinstance(node, dict):
            node[rng.choice(["x", "owner", "BLOCK_M", "config", "status", ""])] = odd_value(rng)
        else:
            node.append(odd_value(rng))
        return
    key = rng.choice(keys)
    if action == "replace":
        node[key] = odd_value(rng)
    elif action == "drop":
        del node[key]
    elif action == "rename" and isinstance(node, dict):
        node[key + "_"] = node.pop(key)
    else:
        node[key] = copy.deepcopy(node[key]) if isinstance(node, dict) else node[key]
        if isinstance(node, list):
            node.append(copy.deepcopy(node[key]))


def spoil_a_problem(doc: dict, rng: random.Random) -> None:
    """Spoil the JSON of one problem inside an export, keeping its key and its rows' links
    consistent, so that the problem parser itself (epilogue, shape, symbolic dims) is hit."""
    problems = doc.get("problems")
    if not isinstance(problems, list) or not problems or not isinstance(problems[0], dict):
        return
    item = rng.choice([p for p in problems if isinstance(p, dict) and isinstance(p.get("json"), str)] or [{}])
    if "json" not in item:
        return
    inner = json.loads(item["json"])
    for _ in range(rng.randint(1, 2)):
        spoil(inner, rng)
    old = item.get("key")
    item["json"] = canonical_or_loose(inner)
    item["key"] = problem_key(item["json"])
    for row in [*doc.get("trials", []), *doc.get("baselines", [])]:
        if isinstance(row, dict) and row.get("problem") == old:
            row["problem"] = item["key"]


def canonical_or_loose(obj: Any) -> str:
    try:
        return canonical(obj)
    except ValueError:  # NaN: written anyway, as a careless tool would
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def as_text(doc: Any, rng: random.Random) -> bytes:
    """``doc`` as a file's bytes: JSON (with NaN and Infinity allowed, as a careless writer
    would), sometimes cut short or with one byte changed."""
    data = json.dumps(doc, allow_nan=True).encode()
    roll = rng.random()
    if roll < 0.1 and data:
        data = data[: rng.randrange(len(data))]
    elif roll < 0.2 and data:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]
    return data


@pytest.fixture(scope="module")
def valid_export(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("fuzz")
    for m in (1, 17, 64):
        record(str(d / "src.db"), Spec(m, 32, 32, dtype="float32").problem(), cfg(m), 0.5, 0.6)
    with TuningDB.open(d / "src.db") as db:
        export_json(db, d / "valid.json")
    return json.loads((d / "valid.json").read_text())


def cfg(m: int) -> dict:
    return Config(16, 16, 16, 1, num_warps=4, num_stages=1 + m % 3).to_dict()


@pytest.mark.parametrize("seed", SEEDS)
def test_import_accepts_valid_rows_or_refuses_with_a_value_error(seed, valid_export, tmp_path):
    rng = random.Random(seed)
    path = tmp_path / "case.json"
    with TuningDB.open(tmp_path / "target.db") as db:
        for case in range(IMPORT_CASES):
            doc = copy.deepcopy(valid_export)
            if rng.random() < 0.5:
                spoil_a_problem(doc, rng)
            else:
                for _ in range(rng.randint(1, 3)):
                    spoil(doc, rng)
            path.write_bytes(as_text(doc, rng))
            try:
                import_json(db, path, parse_problem=parse_problem, validate_config=validate_config)
            except ValueError:
                continue
            except Exception as e:  # a bug: say which case
                raise AssertionError(f"seed {seed} case {case}: {e!r}\n{path.read_text()[:2000]}") from e
        for _, r in db.list_records(limit=100_000):
            Config.from_dict(r.config)  # what was stored is usable
            assert r.median_ms is None or r.median_ms >= 0


VALID_SHAPES = [
    {"m": 128, "n": 4096, "k": 4096},
    {"m": 16, "n": 32, "k": 48, "batch": 2, "dtype": "float16", "layout": "NN", "epilogue": "residual"},
    {"m": 1, "n": 4096, "k": 4096, "template": "gemv", "epilogue": "bias"},
]


@pytest.mark.parametrize("seed", SEEDS)
def test_shapes_parser_accepts_valid_problems_or_refuses_with_a_value_error(seed, tmp_path):
    rng = random.Random(1000 + seed)
    path = tmp_path / "shapes.json"
    for case in range(SHAPES_CASES):
        doc = copy.deepcopy(VALID_SHAPES)
        for _ in range(rng.randint(1, 2)):
            spoil(doc, rng)
        if rng.random() < 0.5:  # the same as JSON Lines
            text = b"\n".join(json.dumps(o, allow_nan=True).encode() for o in doc)
        else:
            text = as_text(doc, rng)
        path.write_bytes(text)
        try:
            specs = load_shapes(path)
        except ValueError:
            continue
        except Exception as e:
            raise AssertionError(f"seed {seed} case {case}: {e!r}\n{text[:2000]!r}") from e
        for spec in specs:
            spec.problem()  # what was accepted can be tuned


def test_the_fuzzer_reaches_both_outcomes(valid_export, tmp_path):
    """A fuzzer whose every case is refused tests nothing: some spoiled files still import
    (a value replaced by a valid one, a repeated row), most do not."""
    rng = random.Random(7)
    accepted = refused = 0
    path = tmp_path / "case.json"
    with TuningDB.open(tmp_path / "t.db") as db:
        for _ in range(40):
            doc = copy.deepcopy(valid_export)
            spoil(doc, rng)
            path.write_bytes(as_text(doc, rng))
            try:
                import_json(db, path, parse_problem=parse_problem, validate_config=validate_config)
                accepted += 1
            except ValueError:
                refused += 1
    assert accepted >= 3 and refused >= 20, (accepted, refused)


def test_a_valid_export_round_trips(valid_export, tmp_path):
    path = tmp_path / "valid.json"
    path.write_text(json.dumps(valid_export))
    with TuningDB.open(tmp_path / "t.db") as db:
        report = import_json(db, path, parse_problem=parse_problem, validate_config=validate_config)
    assert (report.problems, report.trials, report.baselines) == (3, 3, 3)
