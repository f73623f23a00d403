"""The matmul template's tma variant (operand tiles through host-side tensor
descriptors) against the float64 reference, in Triton's interpreter; tensors TMA
cannot read fall back to the classic loop with the same result."""

from __future__ import annotations

import pytest
import torch
from test_matmul import DTYPES, run_case

from epilab.templates.matmul import bind, make_problem, tma_descriptors
from epilab.templates.matmul_api import simple_epilogue
from epilab.templates.problem import Config
from epilab.templates.render import config_error

TMA = Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant="tma")
HOPPER_VARIANTS = ["tma", "persistent", "tma_persistent"]


@pytest.mark.parametrize("variant", HOPPER_VARIANTS)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
# dims multiples of 8 (16-byte rows in 16-bit dtypes) but ragged against the 16x32x16 tiles
@pytest.mark.parametrize("shape", [(40, 48, 72), (16, 40, 16), (8, 24, 128), (56, 8, 40)], ids=str)
def test_hopper_variants_shapes_and_layouts(variant, layout, shape):
    m, n, k = shape
    config = Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant=variant)
    run_case(None, m, n, k, layout, torch.bfloat16, "bias_gelu_tanh_residual", config=config)


@pytest.mark.parametrize("group_m", [1, 4])
def test_persistent_variant_covers_every_tile_of_every_batch(group_m):
    """4 programs in the interpreter loop over 3 x 3 x 2 tiles (batch 3): each tile once."""
    config = Config(16, 32, 16, group_m, num_warps=4, num_stages=1, variant="persistent")
    run_case(3, 40, 60, 24, "NN", torch.float16, "residual", config=config)
    run_case(None, 45, 70, 33, "TN", torch.float32, "bias_relu", config=config)  # ragged, K not aligned


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("epilogue", ["none", "bias_relu", "two_outputs", "col_vector"])
def test_tma_variant_epilogues_and_dtypes(dtype, epilogue):
    run_case(None, 33, 40, 64, "NT", DTYPES[dtype], epilogue, config=TMA)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_aligned_tensors_do_take_the_descriptors_and_match_the_classic_loop(layout):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(40, 72, generator=gen).to(torch.bfloat16)
    b = torch.randn(72, 48, generator=gen).to(torch.bfloat16)
    if layout[0] == "T":
        a = a.t().contiguous().t()
    if layout[1] == "T":
        b = b.t().contiguous().t()
    ep, ops = simple_epilogue(a, b, activation="relu")
    problem = make_problem(a, b, ep, ops)
    assert tma_descriptors(problem, TMA, a, b) is not None
    tma = bind(problem, TMA, a, b, ops)
    classic = bind(problem, Config(16, 32, 16, 1, num_warps=4, num_stages=1), a, b, ops)
    tma.run()
    classic.run()
    assert tma.kernel is None  # not replayable: its descriptors hold this call's tensors
    assert torch.equal(tma.outs[0], classic.outs[0])


def test_tensors_tma_cannot_read_fall_back_to_the_classic_loop():
    a, w = torch.randn(20, 70).half(), torch.randn(24, 70).half()  # 140-byte rows: not 16-aligned
    ep, ops = simple_epilogue(a, w.t())
    problem = make_problem(a, w.t(), ep, ops)
    assert tma_descriptors(problem, TMA, a, w.t()) is None
    bound = bind(problem, TMA, a, w.t(), ops)
    bound.run()
    assert torch.allclose(bound.outs[0].float(), (a.float() @ w.float().t()), atol=5e-2, rtol=1e-2)
    run_case(None, 20, 24, 70, "NT", torch.float16, "bias", config=TMA)


def test_tma_variant_is_refused_where_it_cannot_apply():
    a, b = torch.randn(3, 16, 32), torch.randn(3, 32, 16)
    ep, ops = simple_epilogue(a, b)
    assert "2-D problems" in config_error(make_problem(a, b, ep, ops, op="bmm"), TMA)
    a2, w2 = torch.randn(8, 32), torch.randn(32, 16)
    ep2, ops2 = simple_epilogue(a2, w2)
    gemv = make_problem(a2, w2, ep2, ops2, template="gemv")
    assert "no variant 'tma'" in config_error(gemv, Config(16, 32, 16, 1, variant="tma"))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (2048, 14336, 4096), (129, 200, 264)], ids=str)
@pytest.mark.parametrize("variant", HOPPER_VARIANTS)
def test_gpu_hopper_variants(variant, layout, shape):
    m, n, k = shape
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant)
    run_case(None, m, n, k, layout, torch.bfloat16, "bias_gelu_tanh_residual", device="cuda", config=config)
