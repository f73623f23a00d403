"""Tuning at compile time, for the backend's ``tune_missing``: a problem without a record is
tuned with a small budget (``TUNE_NOW``) by one tuner per database and device in this process,
and stored. The backend finds ``tune_now`` through the entry point ``epilab.compile_tuners``
(pyproject.toml), as torch finds the backend: the compiler imports nothing of the tuner."""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable

import torch

from epilab.db import TuningDB
from epilab.ir.problem import Problem
from epilab.policy.suites import problem_label
from epilab.tuner.progress import Reporter
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

log = logging.getLogger(__name__)
TUNE_NOW = {"trials": 16, "seconds": 30.0, "patience": 8}  # the small budget of tune_missing
_tuners: dict[tuple[str, str], Tuner] = {}


def tune_now(
    db: TuningDB, device: torch.device, interpret: bool, progress: bool
) -> Callable[[Problem], None]:
    """A function that tunes one problem with the small budget (one tuner per database and
    device), reporting it on stderr unless ``progress`` is off (``tuner/progress.py``)."""

    def tune(problem: Problem) -> None:
        key = (db.url, str(device))
        if key not in _tuners:
            options = TuneOptions(
                budget=Budget(**TUNE_NOW),  # type: ignore[arg-type]
                interpret=interpret,
                device_index=device.index or 0,
                jobs=0 if interpret else 4,
            )
            _tuners[key] = Tuner(db, options)
            atexit.register(_tuners[key].close)
        label = f"{problem_label(problem)} now (tune_missing)"
        tuner = _tuners[key]
        result = Reporter().tune(tuner, problem, label) if progress else tuner.tune_problem(problem, label)
        log.info("epilab: tuned %s now: %s", problem.key[:12], result.best)

    return tune
