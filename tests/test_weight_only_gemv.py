"""The weight-only GEMVs (templates/gemv/weight_only_gemv.py): decode-time weight-only problems
(M <= 16, a 16-bit A, an fp8 weight) on the gemv kernel, each fp8 slab converted after its
load; checked against float64 on the interpreter and, with ``-m gpu``, on the GPU."""

from __future__ import annotations

import pytest
import torch

from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand
from epilab.ir.problem import Problem
from epilab.policy.space import HOPPER, infeasible
from epilab.templates.gemm.dual_weight_only import make_dual_weight_only_problem
from epilab.templates.gemm.weight_only import make_weight_only_problem
from epilab.templates.gemv import weight_only_gemv
from epilab.templates.registry import kind_of, twins, untuned_choice
from epilab.templates.verify import checked_launch
from tests.test_weight_only import (
    FP8,
    WIDE,
    every_fp8_code,
    scaled_gelu,
    swiglu_of_scaled,
    tensors,
    weight,
)

VARIANTS = {  # each split-K reduction, with slabs and splits that leave partial blocks
    "default": Config(16, 32, 32, 1, 1, num_warps=4, num_stages=2),
    "two_pass": Config(16, 32, 16, 1, 4, num_warps=4, num_stages=2, variant="two_pass"),
    "atomic": Config(16, 16, 32, 1, 2, num_warps=2, num_stages=2, variant="atomic"),
}


def _gemv_twin(problem: Problem) -> Problem:
    found = twins(problem)
    assert [t.template for t in found] == [problem.template, kind_of(found[1].template).name]
    return found[1]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
def test_each_reduction_dtype_and_weight_matches_float64(variant, wide, fp8, device="cpu"):
    """M 5, N 72 and K 96: partial column slabs and K blocks; the weight's scale, a bias, GELU."""
    torch.manual_seed(13)
    a, b, scale, bias = tensors(5, 72, 96, WIDE[wide], FP8[fp8], device=device)
    ops_ = {"scale": scale, "bias": bias}
    problem = make_weight_only_problem(a, b, scaled_gelu(str(WIDE[wide]).split(".")[1]), ops_)
    twin = _gemv_twin(problem)
    assert (twin.template, twin.op, twin.geometry) == ("weight_only_gemv", problem.op, problem.geometry)
    checked_launch(twin, VARIANTS[variant], a, b, ops_)


@pytest.mark.parametrize("m", [1, 16])
def test_one_row_and_a_full_tile_of_rows_with_a_row_major_weight(m, device="cpu"):
    torch.manual_seed(m)
    a, b, scale, bias = tensors(m, 40, 64, torch.bfloat16, FP8["e4m3"], layout_b="row", device=device)
    ops_ = {"scale": scale, "bias": bias}
    twin = _gemv_twin(make_weight_only_problem(a, b, scaled_gelu("float32"), ops_))
    for config in VARIANTS.values():
        checked_launch(twin, config, a, b, ops_)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_gated_mlps_two_fp8_weights_in_one_gemv(variant, device="cpu"):
    torch.manual_seed(17)
    m, n, k = 3, 48, 80
    a = torch.randn(m, k, device=device).to(torch.bfloat16)
    w1, w3 = weight(n, k, FP8["e4m3"], device), weight(n, k, FP8["e4m3"], device)
    ops_ = {
        "weight_scale": torch.rand(n, device=device) / 8 + 0.01,
        "weight_scale2": torch.rand(n, device=device) / 8 + 0.01,
    }
    problem = make_dual_weight_only_problem(a, w1.t(), w3.t(), swiglu_of_scaled(), ops_)
    twin = _gemv_twin(problem)
    assert twin.template == "dual_weight_only_gemv"
    checked_launch(twin, VARIANTS[variant], a, w1.t(), {"b2": w3.t(), **ops_})


@pytest.mark.parametrize("fp8", list(FP8))
def test_every_fp8_code_is_read_exactly(fp8, device="cpu"):
    """A 16x16 identity times B holding each of the 256 codes (as in test_weight_only's test
    of the same name): the fp32 output is B's values."""
    b = every_fp8_code(fp8, device)
    a = torch.eye(16, device=device).to(torch.bfloat16)
    ops_ = {"scale": torch.ones(16, device=device)}
    ep = Epilogue.build([(acc() * operand("scale", "row"), "float32")])
    twin = _gemv_twin(make_weight_only_problem(a, b, ep, ops_))
    (out,) = checked_launch(twin, VARIANTS["default"], a, b, ops_).outs
    assert torch.equal(out, b.float())


def test_which_problems_it_takes_and_its_rules():
    a, b, scale, bias = tensors(16, 48, 64, torch.bfloat16, FP8["e4m3"])
    ops_ = {"scale": scale, "bias": bias}
    problem = make_weight_only_problem(a, b, scaled_gelu("bfloat16"), ops_)
    twin = _gemv_twin(problem)
    assert Problem.from_json(twin.to_json()) == twin and twin.key != problem.key
    assert untuned_choice(problem) == twin  # untuned: the GEMV's heuristic (it won on the GPU)
    kind = weight_only_gemv.KIND
    assert kind.config_error(twin, Config(16, 32, 64, 1)) is None
    assert "BLOCK_M=16" in kind.config_error(twin, Config(32, 32, 64, 1))
    assert infeasible(twin, Config(16, 32, 16, 1, 4, variant="two_pass"), HOPPER) is None
    assert "exceeds the 1 K blocks" in infeasible(twin, Config(16, 32, 64, 1, 4, variant="two_pass"), HOPPER)
    a17, b17, scale, bias = tensors(17, 48, 64, torch.bfloat16, FP8["e4m3"])
    tall = make_weight_only_problem(a17, b17, scaled_gelu("bfloat16"), {"scale": scale, "bias": bias})
    assert twins(tall) == [tall]  # M 17: no GEMV
    at, bt, scale, bias = tensors(64, 8, 32, torch.bfloat16, FP8["e4m3"])  # a small N, a large M
    narrow = make_weight_only_problem(at, bt, scaled_gelu("bfloat16"), {"scale": scale, "bias": bias})
    assert twins(narrow) == [narrow]  # the gemv's transpose would make the 16-bit A its weight
    assert "static M <= 16" in kind.config_error(narrow, Config(16, 16, 32, 1))


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
def test_each_reduction_dtype_and_weight_on_gpu(variant, wide, fp8):
    test_each_reduction_dtype_and_weight_matches_float64(variant, wide, fp8, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_gated_mlps_two_fp8_weights_on_gpu(variant):
    test_a_gated_mlps_two_fp8_weights_in_one_gemv(variant, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", list(FP8))
def test_every_fp8_code_is_read_exactly_on_gpu(fp8):
    test_every_fp8_code_is_read_exactly(fp8, device="cuda")
