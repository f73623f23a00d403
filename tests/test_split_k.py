"""Two-pass split-K on the matmul template (and its dual kind) and on conv2d's (r, s, c)
reduction, against a float64 reference.

Each split sums its share of the K blocks into an fp32 workspace; a second kernel adds the
partial sums in split order and runs the epilogue once. CPU runs use Triton's interpreter on
small awkward shapes (splits that do not divide K, empty splits, batches, every layout and
dtype, every epilogue); the ``gpu`` tests compile the same kernels, check real sizes and
launch many times (results bitwise equal run to run).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_conv2d import GEOMETRIES, run_geometry
from test_matmul import DTYPES, EPILOGUES, run_case

import epilab
from epilab.api.matmul import simple_epilogue
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.problem import Shape
from epilab.policy.space import HOPPER, infeasible
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_reference import reference
from epilab.templates.registry import bind, for_template

# (batch, M, N, K) with 16-deep K blocks: 41 -> 3 blocks, 100 -> 7, 70 -> 5, 129 -> 9
SHAPES = [(None, 37, 45, 100), (None, 7, 9, 41), (3, 20, 33, 70), (None, 1, 41, 129)]


def _split(split: int, variant: str = "default") -> Config:
    return Config(16, 32, 16, 4, split, num_warps=4, num_stages=1, variant=variant)


@pytest.mark.parametrize("split", [2, 8])  # 8 splits of 3..9 K blocks: some splits are empty
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NN", "TT", "NT"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_split_k_matches_float64(shape, layout, dtype, split):
    run_case(*shape, layout=layout, dtype=DTYPES[dtype], epilogue="bias_relu", config=_split(split))


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_split_k_runs_every_epilogue_once_on_the_full_sum(epilogue):
    # a residual or a scale applied per split would be counted 4 times: the reference sees it
    run_case(None, 33, 40, 90, "NT", torch.float16, epilogue, config=_split(4))


@pytest.mark.parametrize("split", [2, 4])
def test_split_k_on_the_tma_loop(split):
    run_case(None, 40, 48, 72, "NT", torch.bfloat16, "bias_gelu_tanh_residual", config=_split(split, "tma"))


def test_split_k_of_a_dual_gemm():
    gen = torch.Generator().manual_seed(1)
    a, b, b2 = (torch.randn(s, generator=gen).half() for s in ((21, 70), (70, 40), (70, 40)))
    bias = torch.randn(40, generator=gen).half()
    out = epilab.gated_matmul(a, b, b2, activation="silu", bias=bias, config=_split(4))
    g, u = a.double() @ b.double() + bias.double(), a.double() @ b2.double()
    assert rel_error(out, torch.nn.functional.silu(g) * u) <= 2e-3


def test_split_k_results_are_reproducible_and_the_workspace_is_fresh_each_call():
    """Two-pass split-K adds the partial sums in a fixed order: equal inputs give equal bits,
    and a call after a call with other inputs carries nothing over."""
    gen = torch.Generator().manual_seed(2)
    x, y, w = (torch.randn(s, generator=gen) for s in ((19, 90), (19, 90), (90, 33)))
    first = epilab.matmul(x, w, activation="gelu", config=_split(4))
    other = epilab.matmul(y, w, activation="gelu", config=_split(4))
    again = epilab.matmul(x, w, activation="gelu", config=_split(4))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert rel_error(other, torch.nn.functional.gelu(y.double() @ w.double())) <= 1e-5


@pytest.mark.parametrize(
    "config,match",
    [
        (Config(16, 32, 16, SPLIT_K=2, variant="persistent"), "split-K runs on the default and tma loops"),
        (Config(16, 32, 16, SPLIT_K=2, EPILOGUE_SUBTILE=2), "the reduction runs the epilogue"),
        (Config(16, 32, 16, SPLIT_K=2, variant="tma", TMA_STORE=1), "the reduction runs the epilogue"),
    ],
    ids=["persistent", "subtile", "tma-store"],
)
def test_split_k_refusals_say_what_is_accepted(config, match):
    with pytest.raises(ValueError, match=match):
        epilab.matmul(torch.randn(32, 48), torch.randn(48, 32), config=config)


def bf16_problem(m: int, n: int, k: int, batch: int = 1):
    """A bf16 matmul problem of this shape (a batch > 1 broadcasts), no epilogue."""
    a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16)
    if batch > 1:
        a, b = a.expand(batch, m, k), b.expand(batch, k, n)
    ep, ops = simple_epilogue(a, b)
    return make_problem(a, b, ep, ops)


@pytest.mark.parametrize(
    "shape,split,why",
    [
        ((1024, 1024, 1024), 4, None),  # 64 tiles of 128x128 on 132 SMs: split-K may pay
        ((4096, 4096, 4096), 2, "already fill"),  # 1024 tiles
        ((1024, 1024, 192), 2, "fewer than 2 K blocks"),  # 3 K blocks of 64
        ((1024, 1024, 8192), 16, "over 4 waves"),  # 64 tiles x 16
        ((256, 256, 4096, 64), 2, "already fill"),  # a batch of 64 x 4 tiles
    ],
    ids=["cube", "large", "short-k", "waves", "batched"],
)
def test_the_tuner_tries_split_k_only_where_tiles_underfill_the_device(shape, split, why):
    config = Config(128, 128, 64, 8, split, num_warps=8, num_stages=3)
    found = infeasible(bf16_problem(*shape), config, HOPPER)
    assert (found is None) if why is None else (why in (found or ""))


def test_symbolic_sizes_never_split():
    import sympy

    dynamic = dataclasses.replace(
        bf16_problem(1024, 1024, 1024), shape=Shape(1, sympy.Symbol("s0"), 1024, 1024)
    )
    assert "fill" in infeasible(dynamic, Config(128, 128, 64, 8, 2, num_warps=8, num_stages=3), HOPPER)


# ------------------------------------------------------------------ conv2d

CONV_SPLIT = ["3x3-pad1-odd", "3x3-stride2", "stem-7x7-s2-p3-c3", "c24-ragged", "groups2", "dilation2"]


@pytest.mark.parametrize("split", [2, 8])  # 8: more splits than some geometries have steps
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("geometry", CONV_SPLIT)
def test_conv_split_k_over_the_reduction(geometry, layout, split):
    run_geometry(GEOMETRIES[geometry], layout=layout, config=dataclasses.replace(_split(split), BLOCK_N=16))


@pytest.mark.parametrize("epilogue", ["bias_residual_relu", "two_outputs", "bn_relu"])
def test_conv_split_k_epilogues(epilogue):
    run_geometry(GEOMETRIES["3x3-pad1-odd"], epilogue=epilogue, dtype=torch.float16, config=_split(4))


def test_depthwise_convolutions_refuse_split_k():
    with pytest.raises(ValueError, match="depthwise convolution has no channel reduction"):
        run_geometry(GEOMETRIES["depthwise"], config=_split(2))


# ------------------------------------------------------------------ GPU

GPU_CASES = [  # (M, N, K, dtype, config)
    (1024, 1024, 1024, torch.bfloat16, Config(128, 128, 64, 8, 2, num_warps=8, num_stages=4, variant="tma")),
    (1024, 1024, 1024, torch.bfloat16, Config(128, 64, 64, 8, 4, num_warps=4, num_stages=4)),
    (512, 1024, 4096, torch.float16, Config(128, 128, 64, 8, 8, num_warps=8, num_stages=4, variant="tma")),
    (127, 4096, 1025, torch.bfloat16, Config(64, 128, 64, 8, 4, num_warps=4, num_stages=4)),  # ragged K
    (255, 129, 8193, torch.float32, Config(64, 64, 32, 8, 16, num_warps=4, num_stages=3)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4].short()}")
def test_gpu_split_k(case):
    m, n, k, dtype, config = case
    run_case(None, m, n, k, "NT", dtype, "bias_gelu_tanh_residual", device="cuda", config=config)
    batched = dataclasses.replace(config, variant="default")  # the tma loop is 2-D only
    run_case(2, m, n, k, "NN", dtype, "two_outputs", device="cuda", config=batched)


@pytest.mark.gpu
def test_gpu_split_k_is_bitwise_reproducible_over_many_launches():
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(256, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(1024, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    ep, ops = simple_epilogue(a, w.t(), activation="gelu")
    problem = for_template(make_problem(a, w.t(), ep, ops), "matmul")
    config = Config(128, 128, 64, 8, 8, num_warps=8, num_stages=4, variant="tma")
    ref = reference(ep, a, w.t(), ops)[0]
    first = bind(problem, config, a, w.t(), ops)
    first.run()
    assert rel_error(first.outs[0], ref) <= 1e-2
    differ = 0
    for _ in range(300):
        bound = bind(problem, config, a, w.t(), ops)
        bound.run()
        differ += not torch.equal(bound.outs[0], first.outs[0])
    assert differ == 0, f"{differ} of 300 launches differ from the first"


@pytest.mark.gpu
@pytest.mark.parametrize("hw,c", [(14, 256), (7, 512)], ids=["14x14", "7x7"])
@pytest.mark.parametrize("split", [2, 4])
def test_gpu_conv_split_k_resnet_layers(hw, c, split):
    from test_conv2d import run_conv

    config = Config(64, 128, 64, 8, split, num_warps=4, num_stages=3)
    run_conv(32, c, hw, hw, c, 3, 3, padding=1, epilogue="bias_residual_relu", config=config, device="cuda")
