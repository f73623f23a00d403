"""The gemv template (M <= 16, split-K) against a float64 reference.

Same cases and checks as the matmul template (``test_matmul.run_case``: outputs
poisoned with NaN, every output within its dtype's bound), over the three
reductions: no split, two-pass and atomic split-K.
"""

from __future__ import annotations

import pytest
import torch
from test_matmul import DTYPES, run_case

from epilab.api.matmul import simple_epilogue
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_reference import reference
from epilab.templates.registry import for_template, launch

CONFIGS = {  # BLOCK_K=16 with K up to 300: several K blocks per split, and empty splits
    "nosplit": Config(16, 32, 16, 1, 1, num_warps=4, num_stages=1, variant="default"),
    "two_pass2": Config(16, 32, 16, 1, 2, num_warps=4, num_stages=1, variant="two_pass"),
    "two_pass8": Config(16, 64, 32, 1, 8, num_warps=4, num_stages=1, variant="two_pass"),
    "atomic4": Config(16, 32, 16, 1, 4, num_warps=4, num_stages=1, variant="atomic"),
    "atomic16": Config(16, 16, 16, 1, 16, num_warps=2, num_stages=1, variant="atomic"),
}
SHAPES = [(1, 1, 1), (1, 37, 300), (16, 130, 77), (7, 1, 129), (3, 64, 20)]  # (M, N, K)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["NT", "NN"])  # NT: nn.Linear's weight (K-contiguous B)
def test_gemv_shapes_layouts_and_reductions(config, shape, layout):
    m, n, k = shape
    run_case(None, m, n, k, layout, torch.bfloat16, "bias_gelu", config=CONFIGS[config], template="gemv")


@pytest.mark.parametrize("config", ["nosplit", "two_pass2", "atomic4"])
@pytest.mark.parametrize(
    "shape", [(37, 1, 50), (130, 16, 77), (20, 5, 300)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("epilogue", ["bias_gelu", "col_vector", "residual", "two_outputs"])
def test_gemv_transposed_for_small_n(config, shape, layout, epilogue):
    """N <= 16 with a larger M runs as C.T = B.T @ A.T: row and column vectors, tiles and
    outputs must all land where they belong."""
    m, n, k = shape
    run_case(None, m, n, k, layout, torch.bfloat16, epilogue, config=CONFIGS[config], template="gemv")


@pytest.mark.parametrize("epilogue", ["none", "residual", "two_outputs", "col_vector", "scalar", "cast_fp32"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("config", ["nosplit", "two_pass2", "atomic4"])
def test_gemv_epilogues_and_dtypes(epilogue, dtype, config):
    run_case(None, 5, 33, 70, "NT", DTYPES[dtype], epilogue, config=CONFIGS[config], template="gemv")


def test_atomic_split_leaves_its_workspace_clean_for_the_next_launch():
    from epilab.templates.registry import bind

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 50, generator=gen).to(torch.float16)
    w = torch.randn(40, 50, generator=gen).to(torch.float16)
    ep, ops = simple_epilogue(a, w.t(), activation="silu")
    problem = for_template(make_problem(a, w.t(), ep, ops), "gemv")
    bound = bind(problem, CONFIGS["atomic4"], a, w.t(), ops)
    ref = reference(ep, a, w.t(), ops)[0]
    for _ in range(3):  # a dirty workspace or counter would double the sum on the second run
        bound.outs[0].fill_(float("nan"))
        bound.run()
        assert rel_error(bound.outs[0], ref) <= 1e-2


@pytest.mark.parametrize(
    "config,m,match",
    [
        (Config(32, 32, 16, 1, 1), 4, "BLOCK_M=16"),
        (Config(16, 32, 16, 1, 2), 4, "'default' means SPLIT_K=1"),
        (Config(16, 32, 16, 1, 1, variant="atomic"), 4, "'default' means SPLIT_K=1"),
        (Config(16, 32, 16, 1, 1), 17, "M or N <= 16"),
    ],
    ids=["block-m", "default-with-split", "atomic-without-split", "m-too-large"],
)
def test_bad_gemv_configs_are_refused_clearly(config, m, match):
    a, w = torch.randn(m, 8), torch.randn(8, 17)
    ep, ops = simple_epilogue(a, w)
    problem = for_template(make_problem(a, w, ep, ops), "gemv")
    with pytest.raises(ValueError, match=match):
        launch(problem, config, a, w, ops)


# ------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        "nosplit",
        "two_pass8",
        "atomic16",
    ],
)
@pytest.mark.parametrize(
    "m,n,k",
    [(1, 4096, 4096), (16, 14336, 4096), (8, 4096, 14336), (1, 128256, 4096), (5, 1, 777), (2048, 8, 4096)],
)
def test_gpu_gemv(config, m, n, k):
    big = dict(CONFIGS[config].to_dict(), BLOCK_N=64, BLOCK_K=128, num_stages=3)
    run_case(
        None, m, n, k, "NT", torch.bfloat16, "bias_gelu_tanh_residual", "cuda", Config(**big), template="gemv"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("split,warps", [(16, 2), (16, 8), (32, 4)])
def test_gpu_atomic_split_k_gives_the_full_sum_every_launch(split, warps):
    """The race an H200 showed before the per-thread fence (a split's adds not yet
    performed when the last split read the sum) was intermittent: launch many times."""
    from epilab.templates.registry import bind

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    ep, ops = simple_epilogue(a, w.t(), activation="gelu")
    problem = for_template(make_problem(a, w.t(), ep, ops), "gemv")
    config = Config(16, 32, 64, 1, split, num_warps=warps, num_stages=3, variant="atomic")
    ref = reference(ep, a, w.t(), ops)[0]
    bad = 0
    for _ in range(200):
        bound = bind(problem, config, a, w.t(), ops)
        bound.run()
        bad += rel_error(bound.outs[0], ref) > 1e-2
    assert bad == 0, f"{bad} of 200 launches gave a wrong sum"


def test_small_n_problems_have_a_gemv_twin_searched_on_the_kernel_shape():
    from epilab.policy.space import HOPPER, infeasible, space_for
    from epilab.templates.gemv.gemv import gemv_twin, kernel_problem

    a, w = torch.randn(4096, 64), torch.randn(64, 8)  # a MoE router: many tokens, 8 experts
    ep, ops = simple_epilogue(a, w)
    twin = gemv_twin(make_problem(a, w, ep, ops))
    assert twin is not None and twin.template == "gemv"
    assert (kernel_problem(twin).shape.m, kernel_problem(twin).shape.n) == (8, 4096)
    assert 256 in space_for(twin)["BLOCK_N"]  # capped by the kernel's N (4096), not by 8
    assert infeasible(twin, Config(16, 256, 64, 1, 1, num_warps=4, num_stages=2), HOPPER) is None
    big = torch.randn(64, 40)
    assert gemv_twin(make_problem(a, big, *simple_epilogue(a, big))) is None  # neither M nor N small
