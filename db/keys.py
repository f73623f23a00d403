"""Keys computed from a problem's canonical JSON (the db never imports Problem)."""

from __future__ import annotations

import hashlib
import json


def canonical(obj: object) -> str:
    """The canonical JSON text of ``obj`` (sorted keys, no spaces, strict numbers)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def problem_key(problem_json: str) -> str:
    return hashlib.sha256(problem_json.encode()).hexdigest()


def family_key(problem_json: str) -> str:
    """sha256 of the problem with its M dimension removed: problems that differ
    only in M share a family (same op, template and hash, dtypes, layouts,
    epilogue, batch, N and K)."""
    d = json.loads(problem_json)
    shape = dict(d["shape"])
    shape.pop("m", None)
    return hashlib.sha256(canonical({**d, "shape": shape}).encode()).hexdigest()
