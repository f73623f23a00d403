"""What ``epilab db import`` checks of what it reads, before it writes a row: a problem's JSON
(``parse_problem``) and a config against the problem it must run (``validate_config``)."""

from __future__ import annotations

import dataclasses
from importlib import import_module
from typing import Any

from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.space import run_error


def parse_problem(text: str) -> tuple[str, str]:
    """What `db import` checks of a problem's JSON: (its JSON as this epilab writes it,
    canonical epilogue text); an older epilab's form is read as what it means, and a problem
    exported before revision 0008 gets its kernel hash of today where it was current then,
    as the migration gives a stored one (else every record of an older export was stale)."""
    problem = Problem.from_json(text)
    then = import_module("epilab.db.migrations.versions.0008_kernel_hashes")
    hashed = then.hash_now(problem.template, problem.to_json())
    if hashed is not None:
        problem = dataclasses.replace(problem, template_hash=hashed)
    return problem.to_json(), problem.epilogue.text()


def validate_config(d: Any, problem_json: str | None = None) -> dict[str, Any]:
    """What `db import` checks of a config: ``Config.from_dict``, the one validation; and,
    given the JSON of the problem it must run, that its template runs it (the kind's own
    rules and the device-independent ones: ``policy.space.run_error``)."""
    config = Config.from_dict(d)
    if problem_json is not None:
        problem = Problem.from_json(problem_json)
        why = run_error(problem, config)
        if why is not None:
            raise ValueError(f"config {config.short()} cannot run its problem on {problem.template}: {why}")
    return config.to_dict()
