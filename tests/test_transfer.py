"""Config transfer: a problem without records takes the nearest record's config (a documented
distance), checked for feasibility, under ``auto`` only within the distance and margin where
transfer held; ``explain()`` says where it came from."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from records import record

import epilab
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.policy.nearest import MAX_DISTANCE, MIN_SPEEDUP, distance, epilogue_bytes, why_not
from epilab.templates.registry import template_hash

CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1}


def problem(m=64, n=64, k=64, *, residual=False, dtype="bfloat16", layout_b="col", batch=1) -> Problem:
    value = acc() + operand("bias", "row")
    operands = [OperandSpec("bias", dtype, "vector")]
    if residual:
        value = value + operand("residual", "tile")
        operands.append(OperandSpec("residual", dtype, "row"))
    epilogue = Epilogue.build([(ops.gelu_tanh(value), dtype)])
    return Problem(
        op="addmm" if batch == 1 else "baddbmm",
        template="matmul",
        template_hash=template_hash("matmul", epilogue),
        dtype=dtype,
        layout_a="row",
        layout_b=layout_b,
        operands=tuple(operands),
        epilogue=epilogue,
        shape=Shape(batch, m, n, k),
    )


def test_distance_counts_doublings_layouts_and_epilogue_bytes():
    p = problem()
    assert distance(p, p) == 0
    assert distance(p, problem(m=128)) == distance(problem(m=128), p) == 1
    assert distance(p, problem(m=32, n=256)) == 3
    assert distance(p, problem(layout_b="row")) == 1
    assert epilogue_bytes(p) == 2 and epilogue_bytes(problem(residual=True)) == 4
    assert math.isclose(distance(p, problem(residual=True)), 1.0)
    assert distance(p, problem(dtype="float16")) is None  # another dtype: no transfer
    assert distance(p, problem(batch=4)) is None  # batched and 2-D problems do not mix
    other_version = dataclasses.replace(problem(m=128), template_hash="0" * 64)
    assert distance(p, other_version) is None


def test_a_transferred_config_is_checked_for_feasibility_on_the_new_problem():
    big = Config.from_dict({**CONFIG, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4})
    assert why_not(problem(m=256, n=256), big, INTERPRETER_DEVICE) is None
    assert "larger than the padded" in why_not(problem(m=16, n=256), big, INTERPRETER_DEVICE)


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "t.db")


def _run(db_path, n=24, policy="auto"):
    torch.manual_seed(0)
    lin = nn.Linear(16, n)
    x = torch.randn(40, 16)
    with torch.no_grad():
        out = torch.compile(
            lambda t: F.relu(lin(t)), backend="epilab", options={"db": db_path, "policy": policy}
        )(x)
        ref = F.relu(lin.double()(x.double()))
    assert torch.allclose(out.double(), ref, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
    (d,) = epilab.explain(clear=True)
    return d


def _recorded(db_path, d) -> Problem:
    with TuningDB.open(db_path) as db:
        return Problem.from_json(db.problem_json(d.problem_key)[1])


def _with_n(p: Problem, n: int) -> Problem:
    return dataclasses.replace(p, shape=dataclasses.replace(p.shape, n=n))


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize(
    "source_n,baseline_ms,policy,want",
    [
        (32, 2.0, "auto", "matmul"),  # log2(32/24) = 0.42 away, the source wins by 2x
        (32, 1.03, "auto", None),  # the source wins by less than a transfer needs
        (32, None, "auto", None),  # the source's gain is unknown
        (192, 2.0, "auto", None),  # three doublings away: beyond where transfer held
        (192, 2.0, "always", "matmul"),  # always: the nearest record beats the heuristic
    ],
    ids=["near-and-winning", "small-margin", "no-baseline", "too-far", "always-too-far"],
)
def test_the_nearest_record_serves_a_problem_without_records(db_path, source_n, baseline_ms, policy, want):
    d = _run(db_path)
    assert d.template is None and "nothing recorded" in d.reason
    source = _with_n(_recorded(db_path, d), source_n)
    assert (distance(_recorded(db_path, d), source) <= MAX_DISTANCE) == (source_n == 32)
    record(db_path, source, CONFIG, 1.0, baseline_ms)
    d = _run(db_path, policy=policy)  # checks the output against float64 too
    assert d.template == want, d.reason
    if source_n == 192 and policy == "auto":
        assert d.source is None and "nothing recorded" in d.reason  # not a candidate at all
        return
    assert d.source.startswith("transferred from addmm 40x") and "distance" in d.source, d.source
    if want is None and baseline_ms is not None and source_n == 32:
        assert f"{MIN_SPEEDUP:.2f}x a transferred config needs" in d.reason


@pytest.mark.usefixtures("fresh_compiler")
def test_an_exact_record_wins_over_a_transfer(db_path):
    d = _run(db_path)
    p = _recorded(db_path, d)
    record(db_path, _with_n(p, 32), CONFIG, 1.0, 2.0)
    record(db_path, p, {**CONFIG, "BLOCK_N": 16}, 1.0, 2.0)
    d = _run(db_path)
    assert d.template == "matmul" and d.source == "exact record" and d.config["BLOCK_N"] == 16
