"""The next problem's seeds compile while this one is searched: the compile pool takes them in
the background (``CompilePool.warm``), once the current search's first trial is done."""

from __future__ import annotations

import time

from test_transfer import problem

from epilab.db import TuningDB
from epilab.ir.config import Config
from epilab.policy.space import infeasible
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

STAND_IN = """
import os


def compile_task(task):
    open(task["config"]["touch"], "w").close()
    return {"status": "compiled"}
"""


def test_the_pool_compiles_warmed_configs_in_the_background(tmp_path, monkeypatch):
    from epilab.tuner.worker import CompilePool

    (tmp_path / "stand_in_warm.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned processes get the parent's sys.path
    from stand_in_warm import compile_task

    pool = CompilePool(2, -1, task=compile_task)
    try:
        pool.start()
        marks = [tmp_path / f"m{i}" for i in range(3)]
        pool.warm("{}", [{"touch": str(m)} for m in marks])  # returns at once: nothing is awaited
        end = time.monotonic() + 120
        while not all(m.exists() for m in marks) and time.monotonic() < end:
            time.sleep(0.05)
        assert all(m.exists() for m in marks)
    finally:
        pool.close()


class RecordingPool:
    """A compile pool that compiles nothing and says what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []  # (what, problem JSON, configs)
        self.warmed: list[dict] = []

    def compiled(self, problem_json, configs):
        self.calls.append(("compiled", problem_json, len(configs)))
        return iter([{"status": "compiled"}] * len(configs))

    def warm(self, problem_json, configs):
        self.calls.append(("warm", problem_json, len(configs)))
        self.warmed = configs

    def close(self) -> None:
        pass

    def cancel(self) -> None:
        pass


def test_the_next_problems_first_seeds_are_warmed_after_the_first_trial(tmp_path):
    options = TuneOptions(budget=Budget(trials=3, batch=2), interpret=True, jobs=0, baselines=())
    here, upcoming = problem(m=32, n=32, k=32), problem(m=48, n=32, k=32, residual=True)
    with TuningDB.open(tmp_path / "p.db") as db, Tuner(db, options) as tuner:
        tuner.pool = pool = RecordingPool()
        tuner.tune_problem(here, "here", upcoming=[upcoming])
        seeds = tuner.seeds(upcoming)
    assert [c[0] for c in pool.calls] == ["compiled", "warm", "compiled"]  # once, after the first batch began
    assert pool.calls[1][1] == upcoming.to_json() and 1 <= pool.calls[1][2] <= 2  # its first batch at most
    warmed = [Config.from_dict(c) for c in pool.warmed]
    assert all(infeasible(upcoming, c, tuner.limits) is None for c in warmed)
    assert warmed == [c for c in seeds if infeasible(upcoming, c, tuner.limits) is None][:2]


def test_a_prefetch_that_fails_never_fails_the_search(tmp_path, monkeypatch):
    options = TuneOptions(budget=Budget(trials=2, batch=2), interpret=True, jobs=0, baselines=())
    here, upcoming = problem(m=32, n=32, k=32), problem(m=48, n=32, k=32, residual=True)
    with TuningDB.open(tmp_path / "p.db") as db, Tuner(db, options) as tuner:
        tuner.pool = pool = RecordingPool()
        own = tuner.seeds

        def seeds(p):
            if p == upcoming:
                raise ValueError("a problem whose seeds cannot be made")
            return own(p)

        monkeypatch.setattr(tuner, "seeds", seeds)
        result = tuner.tune_problem(here, "here", upcoming=[upcoming])
    assert result.evaluated == 2 and [c[0] for c in pool.calls] == ["compiled"]
