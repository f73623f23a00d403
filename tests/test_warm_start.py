"""Warm starts and early stops of a search: a new study's first trials are the records'
configs (the same problem on other devices, then the nearest problems on this one), a seed
outside the problem's space is never run, and a search whose best already runs at the
device's roofline stops there."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import triton
from records import record
from test_transfer import CONFIG, problem
from test_tuner import Counted, _run, cost_model

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, TuningDB, Versions
from epilab.ir.config import Config
from epilab.policy.nearest import GEOMETRY_STEP, WARM_DISTANCE, distance, warm_seeds
from epilab.policy.roofline import AT_ROOFLINE, floor_ms, good_enough_ms
from epilab.tuner.search import Budget, make_study
from epilab.tuner.tune import TuneOptions, Tuner, problem_bytes

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132)
VERSIONS = Versions(torch.__version__, triton.__version__)


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "warm.db")


def cfg(bm: int, bn: int = 32, warps: int = 2) -> dict[str, object]:
    return {**CONFIG, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps}


def test_warm_seeds_are_other_devices_bests_then_the_nearest_records(db_path):
    target = problem(m=64)
    record(db_path, target, cfg(32), 0.2, device=H100)  # the same problem on another device
    record(db_path, target, cfg(16, 64), 0.3, device=H100)  # (slower there: not its best)
    record(db_path, problem(m=128), cfg(64), 0.5)  # distance 1
    record(db_path, problem(m=128), cfg(16), 0.9)  # the nearest's runner-up: right after its best
    record(db_path, problem(m=512), cfg(64, 64), 0.1)  # distance 3: faster but farther
    record(db_path, problem(m=256), cfg(32), 0.4)  # distance 2, the other device's config again
    far = 2 ** math.ceil(WARM_DISTANCE + 1)
    record(db_path, problem(m=64 * far), cfg(16, 16), 0.1)  # beyond WARM_DISTANCE
    record(db_path, problem(m=128, dtype="float16"), cfg(16, 16, 4), 0.1)  # another dtype
    with TuningDB.open(db_path) as db:
        seeds = warm_seeds(db, target, INTERPRETER_DEVICE, VERSIONS)
    assert seeds == [Config.from_dict(c) for c in (cfg(32), cfg(64), cfg(16), cfg(64, 64))]


def test_the_tuner_tries_the_records_configs_before_its_own_seeds_unless_cold(db_path):
    target = problem(m=64)
    record(db_path, problem(m=128), cfg(64), 0.5)
    with TuningDB.open(db_path) as db:
        with Tuner(db, TuneOptions(interpret=True, jobs=0, baselines=())) as warm:
            seeds = warm.seeds(target)
        with Tuner(db, TuneOptions(interpret=True, jobs=0, baselines=(), warm=False)) as cold:
            own = cold.seeds(target)
    assert seeds[0] == Config.from_dict(cfg(64)) and Config.from_dict(cfg(64)) not in own
    assert seeds[1:] == [c for c in own if c != seeds[0]]  # then the default and the list, each once


def test_a_seed_outside_the_problems_space_is_never_run():
    outside = Config(512, 64, 64, num_stages=4)  # no 512-row block in the space
    inside = Config(64, 64, 64, num_stages=4)
    evaluate = Counted()
    result = _run(
        make_study("outside", None, restart=False),
        evaluate,
        Budget(trials=4, batch=4),
        seeds=[outside, inside],
    )
    assert outside not in evaluate.asked and evaluate.asked[0] == inside and result.evaluated == 4


@pytest.mark.parametrize("reached", [True, False])
def test_a_search_stops_once_its_best_runs_at_the_roofline(reached):
    seed = Config(128, 128, 64, num_warps=4, num_stages=4)
    floor = cost_model(seed) * (1.0 if reached else 0.5)
    evaluate = Counted()
    result = _run(
        make_study(f"roofline-{reached}", None, restart=False),
        evaluate,
        Budget(trials=16, seconds=1e9, patience=16, batch=4),
        seeds=[seed],
        good_enough_ms=floor,
    )
    if reached:  # the seeds' batch reached it: nothing more is measured
        assert result.stopped_by == "roofline" and result.evaluated == 4
    else:
        assert result.stopped_by != "roofline" and result.evaluated == 16


def test_the_roofline_is_what_the_device_reaches():
    n = 8192
    compute = floor_ms(2 * n**3, 3 * n * n * 2, "bfloat16", H100.name)
    assert compute == pytest.approx(2 * n**3 / 760e9)  # compute-bound: 1.45 ms at 760 TFLOP/s
    gemv = floor_ms(2 * 4096 * 4096, 4096 * 4096 * 2, "bfloat16", "NVIDIA H200")
    assert gemv == pytest.approx(4096 * 4096 * 2 / 4200e6)  # memory-bound: the weight at 4.2 TB/s
    assert floor_ms(2 * n**3, 0, "float8_e4m3fn", H100.name) == pytest.approx(compute / 2)
    assert floor_ms(2 * n**3, 0, "float32", H100.name) is None  # no figure: never stops early
    assert floor_ms(2 * n**3, 0, "bfloat16", "NVIDIA A100-SXM4-80GB") is None
    assert good_enough_ms(2 * n**3, 0, "bfloat16", H100.name) == pytest.approx(compute / AT_ROOFLINE)


def test_a_problems_floor_counts_its_bytes():
    p = problem(m=1, n=4096, k=4096)
    assert floor_ms(p.shape.flops(), problem_bytes(p), p.dtype, H100.name) == pytest.approx(
        problem_bytes(p) / 3000e6
    )


def test_recorded_baselines_are_not_timed_again_unless_asked(db_path, monkeypatch):
    """A baseline this device recorded with these versions is like with like already; the
    tuner times only the missing ones (all of them with ``remeasure_baselines``)."""
    p = problem(m=64)
    record(db_path, p, cfg(32), 0.2, baseline_ms=0.3)  # cuBLAS, recorded
    asked: list[str] = []

    def run(task, timeout_s=None):
        asked.append(task["library"])
        return {"status": "ok", "median_ms": 0.5, "p20_ms": 0.5, "p80_ms": 0.5, "method": "events"}

    with TuningDB.open(db_path) as db, Tuner(db, TuneOptions(interpret=True, jobs=0, baselines=())) as tuner:
        monkeypatch.setattr(tuner.worker, "run", run)
        args = (p, p.to_json(), p.shape.flops(), problem_bytes(p))
        tuner.options = dataclasses.replace(tuner.options, interpret=False, baselines=("cublas", "inductor"))
        assert tuner._baselines(*args) == {"cublas": 0.3, "inductor": 0.5} and asked == ["inductor"]
        asked.clear()
        tuner.options = dataclasses.replace(tuner.options, remeasure_baselines=True)
        assert tuner._baselines(*args) == {"cublas": 0.5, "inductor": 0.5} and asked == ["cublas", "inductor"]
        assert {r.library: r.median_ms for r in db.baselines(p.key, INTERPRETER_DEVICE)}["cublas"] == 0.5


def test_a_warm_starts_distance_also_crosses_op_kinds_at_a_price():
    """Seeds are measured before anything is kept, so a batched problem's config may seed a
    2-D one (a transfer never carries it: ``distance`` is None)."""
    assert distance(problem(), problem(batch=4)) is None
    assert distance(problem(), problem(batch=4), loose=True) == 2 + GEOMETRY_STEP
    assert distance(problem(), problem(dtype="float16"), loose=True) is None  # never another dtype
