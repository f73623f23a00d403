"""``epilab tune --total-time``: a run's time spread over its problems by their floors, each
share capping the problem's search seconds."""

from __future__ import annotations

import time

import pytest
from test_tuner import runner

from epilab.cli import app
from epilab.db import TuningDB
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.registry import is_current
from epilab.tuner.search import Budget
from epilab.tuner.total_time import model_tuning_s, parse_duration, spread, weight
from epilab.tuner.tune import TuneOptions, Tuner

SMALL, BIG = Spec(4096, 4096, 4096).problem(), Spec(8192, 4096, 4096).problem()


@pytest.mark.parametrize(
    ("text", "seconds"), [("600", 600), ("90s", 90), ("10m", 600), ("10 min", 600), ("1.5h", 5400)]
)
def test_durations_are_read_in_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "-5m", "0", "10d"])
def test_a_bad_duration_says_what_is_accepted(text):
    with pytest.raises(ValueError, match=r"10m, 1\.5h"):
        parse_duration(text)


def test_the_time_left_is_shared_by_the_problems_floors():
    """Compute-bound twins: twice the FLOPs, twice the time; two GPUs, twice the time to share."""
    assert weight(BIG, "NVIDIA H100 80GB HBM3") == pytest.approx(2 * weight(SMALL, "NVIDIA H100 80GB HBM3"))
    deadline = time.monotonic() + 300
    shares = spread(deadline, [SMALL, BIG], "NVIDIA H100 80GB HBM3")
    assert shares[BIG.key] == pytest.approx(2 * shares[SMALL.key], rel=1e-6)
    assert sum(shares.values()) == pytest.approx(300, abs=1)
    assert sum(spread(deadline, [SMALL, BIG], "NVIDIA H100 80GB HBM3", gpus=2).values()) == pytest.approx(
        600, abs=2
    )
    assert spread(time.monotonic() - 1, [SMALL, BIG], "interpreter") == {SMALL.key: 0.0, BIG.key: 0.0}
    assert weight(SMALL, "interpreter") == weight(SMALL, "NVIDIA H100")  # no figure: the H100's stand in


def test_a_models_sites_and_floors_weigh_in_and_its_default_grows_with_it():
    h100 = "NVIDIA H100 80GB HBM3"
    deadline = time.monotonic() + 300
    # SMALL at three sites of the model outweighs BIG at one
    shares = spread(deadline, [SMALL, BIG], h100, counts={SMALL.key: 3})
    assert shares[SMALL.key] == pytest.approx(1.5 * shares[BIG.key], rel=1e-6)
    # each problem gets the floor first, the rest by weight; a floor the time cannot cover is dropped
    floored = spread(deadline, [SMALL, BIG], h100, floor_s=50)
    assert floored[SMALL.key] - 50 == pytest.approx((floored[BIG.key] - 50) / 2, rel=1e-4)
    assert spread(time.monotonic() + 10, [SMALL, BIG], h100, floor_s=50)[SMALL.key] < 5
    assert [model_tuning_s(n) for n in (1, 9, 21, 60, 500)] == [45.0, 47.0, 83.0, 200.0, 240.0]


def test_a_share_caps_the_search_seconds_and_never_raises_them(tmp_path):
    options = TuneOptions(
        budget=Budget(seconds=90),
        interpret=True,
        jobs=0,
        baselines=(),
        seconds_for={SMALL.key: 12.0, BIG.key: 500.0},
    )
    with TuningDB.open(tmp_path / "t.db") as db, Tuner(db, options) as tuner:
        assert tuner.budget_for(SMALL).seconds == 12.0
        assert tuner.budget_for(BIG).seconds == 90  # --time-budget stays the most
        assert tuner.budget_for(Spec(64, 64, 64).problem()) == options.budget  # no share: as given


def test_a_spent_total_time_leaves_the_searches_no_time(tmp_path):
    def run(total: str, name: str):
        db_path = str(tmp_path / name)
        args = ["tune", "--suite", "smoke", "--interpret", "--trials", "2", "--db", db_path]
        result = runner.invoke(app, [*args, "--total-time", total])
        if result.exit_code != 0:
            return result, None
        with TuningDB.open(db_path) as db:
            return result, db.stats(is_current).trials_by_status

    assert run("0.000001s", "spent.db")[1] == {}  # the deadline passed before the first search
    assert run("1h", "given.db")[1] == {"ok": 6}  # an hour is plenty: each problem ran its 2 trials
    bad, _ = run("soon", "bad.db")
    assert bad.exit_code == 2 and "is not a duration" in bad.output
