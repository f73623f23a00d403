"""``epilab tune --profile``: where each trial's seconds went, and what its compiles were."""

from __future__ import annotations

import json

import pytest
from test_transfer import problem
from typer.testing import CliRunner

from epilab.cli import app
from epilab.db import TuningDB
from epilab.tuner.evaluate import CompileCounts
from epilab.tuner.phases import PHASES
from epilab.tuner.profile import CompileStats, median_phases
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner


class Times:
    total = 2_500_000  # microseconds, as Triton counts them


def test_compile_counts_hear_triton_and_give_its_listener_back():
    from triton import knobs

    heard = []
    knobs.compilation.listener = lambda **kw: heard.append(kw["cache_hit"])
    try:
        with CompileCounts() as counts:
            knobs.compilation.listener(cache_hit=True, times=Times())
            knobs.compilation.listener(cache_hit=False, times=Times())
        assert heard == [True, False]  # the listener set before still hears every compile
        assert counts.fields() == {"cache_hits": 1, "built": 1, "build_s": 2.5}
        assert knobs.compilation.listener is not None and knobs.compilation.listener.__name__ == "<lambda>"
    finally:
        knobs.compilation.listener = None


def test_compile_stats_add_the_pool_and_the_worker():
    stats = CompileStats()
    stats.add({"cache_hits": 0, "built": 1, "build_s": 3.0, "pool_phases": {"render": 0.01, "compile": 3.1}})
    stats.add({"cache_hits": 1, "built": 0, "build_s": 0.0})
    assert stats.to_dict() == {
        "cache_hits": 1,
        "built": 1,
        "build_s": 3.0,
        "pool_render_s": 0.01,
        "pool_compile_s": 3.1,
    }


@pytest.mark.parametrize("profile", [True, False])
def test_a_profiled_problem_keeps_a_row_of_each_trial(tmp_path, profile):
    options = TuneOptions(
        budget=Budget(trials=3, batch=3), interpret=True, jobs=0, baselines=(), profile=profile
    )
    with TuningDB.open(tmp_path / "p.db") as db, Tuner(db, options) as tuner:
        result = tuner.tune_problem(problem(m=32, n=32, k=32), "p")
    d = result.to_dict()
    assert set(d["compiles"]) >= {"cache_hits", "built", "refused_as_learned"}
    if not profile:
        assert "trials_profile" not in d and result.trials_profile == ()
        return
    rows = d["trials_profile"]
    assert [r["trial"] for r in rows] == [0, 1, 2] and all(r["status"] == "ok" and r["ms"] for r in rows)
    for row in rows:
        assert list(row["phases"]) == [p for p in PHASES if p in row["phases"]]
        assert {"render", "launch", "reference", "database"} <= set(row["phases"])
    trial_seconds = sum(sum(r["phases"].values()) for r in rows)
    assert trial_seconds <= result.seconds  # the trials' phases are part of the problem's
    medians = median_phases(rows)
    assert medians["launch"] == sorted(r["phases"]["launch"] for r in rows)[1]
    json.dumps(d)  # --json prints it


def test_tune_profile_prints_the_seconds_by_phase(tmp_path):
    runner = CliRunner()
    args = ["tune", "--suite", "smoke", "--only", "1", "--interpret", "--trials", "2"]
    result = runner.invoke(app, [*args, "--db", str(tmp_path / "t.db"), "--profile"])
    assert result.exit_code == 0, result.output
    assert "seconds by phase" in result.output and "a trial's median seconds" in result.output
    as_json = runner.invoke(app, [*args, "--db", str(tmp_path / "u.db"), "--profile", "--json"])
    assert as_json.exit_code == 0, as_json.output
    start = as_json.stdout.index("[")
    rows = json.loads(as_json.stdout[start:])[0]["trials_profile"]
    assert len(rows) == 2
