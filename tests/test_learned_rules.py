"""Feasibility rules learned from compile failures: a config Triton failed to build for one
problem is refused, before it is compiled, for every problem whose kernel would be the same
(same source, sizes specialized alike), and only for those."""

from __future__ import annotations

import pytest
import torch
import triton
from test_transfer import CONFIG, problem

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, TuningDB, Versions
from epilab.ir.config import Config
from epilab.tuner.learned import LearnedRules, specialization
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

VERSIONS = Versions(torch.__version__, triton.__version__)
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132)


def failed(db_path, p, config, *, status="compile_error", device=INTERPRETER_DEVICE, triton_version=None):
    versions = Versions(VERSIONS.torch, triton_version or VERSIONS.triton)
    with TuningDB.open(db_path) as db:
        db.record_trial(
            p,
            device,
            config=config,
            status=status,
            timing=None,
            max_rel_error=None,
            versions=versions,
            study="test",
            trial_number=0,
            detail="PassManager::run failed",
        )


def rules_for(db_path, p, device=INTERPRETER_DEVICE) -> LearnedRules:
    with TuningDB.open(db_path) as db:
        return LearnedRules(p, db.failed_compiles(p, device, VERSIONS.triton))


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "learned.db")


def test_a_compile_failure_refuses_the_config_where_the_kernel_is_the_same(db_path):
    bad = Config.from_dict(CONFIG)
    failed(db_path, problem(m=256, n=512, k=1024), CONFIG)
    same_kernel = rules_for(db_path, problem(m=64, n=128, k=64))  # other sizes, all multiples of 16
    why = same_kernel.why(bad)
    assert why is not None and "same kernel" in why and "compile_error" in why
    assert same_kernel.why(Config.from_dict({**CONFIG, "num_warps": 4})) is None  # another config
    assert same_kernel.refused == {bad}


@pytest.mark.parametrize(
    "other",
    [
        problem(m=72),  # M specializes otherwise (not a multiple of 16)
        problem(m=1),  # M == 1 is a constant to Triton
        problem(residual=True),  # another epilogue: another source
        problem(dtype="float16"),  # another dtype
        problem(layout_b="row"),  # another layout: another stride is 1
    ],
    ids=["m72", "m1", "epilogue", "dtype", "layout"],
)
def test_a_compile_failure_says_nothing_of_another_kernel(db_path, other):
    failed(db_path, problem(m=256), CONFIG)
    assert rules_for(db_path, other).why(Config.from_dict(CONFIG)) is None


def test_failures_count_only_on_the_same_device_and_triton(db_path):
    failed(db_path, problem(m=256), CONFIG, device=H100)
    failed(db_path, problem(m=256), CONFIG, triton_version="0.0.1")
    assert len(rules_for(db_path, problem(m=64))) == 0
    assert len(rules_for(db_path, problem(m=64), H100)) == 1


def test_out_of_resources_is_learned_and_a_wrong_answer_is_not(db_path):
    failed(db_path, problem(m=256), CONFIG, status="out_of_resources")
    other = {**CONFIG, "num_warps": 4}
    failed(db_path, problem(m=256), other, status="incorrect")  # a wrong result is no build failure
    rules = rules_for(db_path, problem(m=64))
    assert rules.why(Config.from_dict(CONFIG)) is not None
    assert rules.why(Config.from_dict(other)) is None


def test_specialization_classes():
    assert specialization(problem(m=1, n=48, k=33)) == ("row", "col", "one", "one", 0, 1)


def test_the_tuner_never_compiles_a_config_learned_to_fail(db_path):
    target = problem(m=64)
    options = TuneOptions(budget=Budget(trials=3, batch=3), interpret=True, jobs=0, baselines=(), warm=False)
    with TuningDB.open(db_path) as db, Tuner(db, options) as tuner:
        first = tuner.own_seeds(target)[0]  # the config a cold study would try first
    failed(db_path, problem(m=128, n=256), first.to_dict())
    with TuningDB.open(db_path) as db, Tuner(db, options) as tuner:
        result = tuner.tune_problem(target, "target")
        tried = [Config.from_dict(r.config) for r in db.records(target.key)]
    assert result.evaluated == 3 and first not in tried
    assert result.compiles["refused_as_learned"] == 1


def test_a_problem_every_config_of_which_failed_says_why_and_restart_tries_again(db_path, monkeypatch):
    """Where every config the search draws was learned to fail, the problem is not silently
    left with no trial: it says why, and ``--restart`` (``restart=True``) tries them again.
    (Every config is made a learned failure here by the rules' own check, once one is known.)"""
    target = problem(m=64)
    failed(db_path, problem(m=128, n=256), CONFIG)

    def every_one(self, config):
        if not self._failed:
            return None
        self.refused.add(config)
        return "learned"

    monkeypatch.setattr(LearnedRules, "why", every_one)
    options = TuneOptions(budget=Budget(trials=2, batch=2), interpret=True, jobs=0, baselines=(), warm=False)
    with TuningDB.open(db_path) as db, Tuner(db, options) as tuner:
        nothing = tuner.tune_problem(target, "target")
        assert nothing.evaluated == 0 and nothing.best is None
        assert nothing.refused is not None and "--restart" in nothing.refused
        again = tuner.tune_problem(target, "target", restart=True)
    assert again.evaluated == 2 and again.refused is None
