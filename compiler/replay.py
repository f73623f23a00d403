"""Decisions kept beside Inductor's caches, so that a graph Inductor serves warm still reports them.

Inductor's FX graph cache and AOTAutograd's cache serve a compiled graph without running the
post-grad passes, so a warm cache used to hide every decision (``epilab.explain()`` empty,
``EPILAB_LOG=1`` silent) and, worse, skipped ``tune_missing`` against a fresh database at the
same path. The backend therefore keys each Dynamo graph (its code, its inputs' metadata and
the facts the pass's ``uuid()`` covers) to an ``Entry`` stored under Inductor's cache
directory: the decisions the pass made on it, and a nonce that goes into the pass's
``uuid()``. Inductor's caches can only hit on a uuid whose nonce came from a stored entry, so
a hit always has its decisions to replay; a missing or unreadable entry draws a new nonce,
which makes Inductor compile again. An entry whose compile tuned problems now (the database
lacked their records then) is never reused: a database at that state lacks them again. The
problems a compile records for ``epilab tune --seen`` are kept in the entry too, and recorded
again when the graph is served warm: a fresh database at the path of an earlier one (the same
facts, no records either) learns them as a cold compile would have taught it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from epilab.compiler.decide import Decision

log = logging.getLogger("epilab.compiler")
FORMAT = 1


@dataclass
class Entry:
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    decisions: list[Decision] = field(default_factory=list)
    tuned: int = 0  # problems tuned now while compiling (tune_missing)
    # the problems the compile recorded in the database (JSON), recorded again where a warm
    # cache serves the graph: a fresh database at the same path learns them too
    problems: list[str] = field(default_factory=list)

    @property
    def reusable(self) -> bool:
        return self.tuned == 0


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[object], facts: str) -> str:
    """What Inductor's key holds that decisions depend on: the graph, its inputs, the facts."""
    h = hashlib.sha256(f"{FORMAT}\0{facts}\0{gm.code}".encode())
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            meta = (tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type, x.requires_grad)
            h.update(repr(meta).encode())
        else:
            h.update(type(x).__name__.encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "epilab_decisions" / f"{key}.json"


def load(key: str) -> Entry | None:
    """The stored entry of ``key``, or None (none stored, unreadable, another format)."""
    try:
        data = json.loads(_path(key).read_text())
        if data.get("format") != FORMAT:
            return None
        decisions = [
            Decision(**{**d, "candidates": tuple(d.get("candidates", ()))}) for d in data["decisions"]
        ]
        problems = [str(p) for p in data.get("problems", [])]
        return Entry(str(data["nonce"]), decisions, int(data["tuned"]), problems)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:  # a torn or foreign file: compile again
        log.warning("epilab: ignoring the stored decisions %s: %s", _path(key), e)
        return None


def save(key: str, entry: Entry) -> None:
    """Store ``entry`` atomically; a cache directory that cannot be written is logged, and the
    next compile draws a new nonce (so Inductor compiles again rather than hiding decisions)."""
    path = _path(key)
    data = {
        "format": FORMAT,
        "nonce": entry.nonce,
        "tuned": entry.tuned,
        "decisions": [dataclasses.asdict(d) for d in entry.decisions],
        "problems": entry.problems,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            json.dump(data, f)
        os.replace(f.name, path)
    except OSError as e:
        log.warning("epilab: cannot store decisions under %s: %s", path.parent, e)
