"""The matmul template's Hopper variants (tma: operand tiles through host-side tensor
descriptors; persistent: one program per SM looping over the tiles; both) and knobs
(EPILOGUE_SUBTILE, PROGRAMS_PER_SM, FLATTEN, WARP_SPECIALIZE) against the float64
reference, in Triton's interpreter; tensors TMA cannot read fall back to the classic
loop with the same result; the rules that make a config infeasible."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_matmul import DTYPES, run_case

from epilab.api.matmul import simple_epilogue
from epilab.ir.check import rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc
from epilab.ir.epilogue import ops as ops_
from epilab.policy.space import HOPPER, infeasible
from epilab.templates.gemm.matmul import make_problem, tma_descriptors
from epilab.templates.registry import bind, for_template, kind_of

TMA = Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant="tma")
HOPPER_VARIANTS = ["tma", "persistent", "tma_persistent", "stream_k", "tma_stream_k"]


def config_error(problem, config):
    return kind_of(problem).check(problem, config)


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
    assert [d.tensor for d in tma.descriptors] == ["a_ptr", "b_ptr"]  # remade when replayed
    assert [d.transposed for d in tma.descriptors] == [layout[0] == "T", layout[1] == "T"]
    assert torch.equal(tma.outs[0], classic.outs[0])


def test_tensors_tma_cannot_read_fall_back_to_the_classic_loop():
    # a problem whose rows are aligned, on a view whose address is not (one element in)
    base, w = torch.randn(20, 73).half(), torch.randn(24, 72).half()
    a = base[:, 1:]
    ep, ops = simple_epilogue(a, w.t())
    problem = make_problem(a, w.t(), ep, ops)
    assert config_error(problem, TMA) is None
    assert tma_descriptors(problem, TMA, a, w.t()) is None
    bound = bind(problem, TMA, a, w.t(), ops)
    bound.run()
    assert torch.allclose(bound.outs[0].float(), (a.float() @ w.float().t()), atol=5e-2, rtol=1e-2)


def test_problems_whose_rows_tma_cannot_read_make_the_tma_variants_infeasible():
    a, w = torch.randn(20, 70).half(), torch.randn(24, 70).half()  # 140-byte rows: not 16-aligned
    ep, ops = simple_epilogue(a, w.t())
    problem = make_problem(a, w.t(), ep, ops)
    for variant in ("tma", "tma_persistent"):
        why = infeasible(problem, Config(16, 32, 16, 1, variant=variant), HOPPER)
        assert "16-byte aligned rows" in why and "70 float16" in why
    assert infeasible(problem, Config(16, 32, 16, 1, variant="persistent"), HOPPER) is None


def test_tma_variant_is_refused_where_it_cannot_apply():
    a, b = torch.randn(3, 16, 32), torch.randn(3, 32, 16)
    ep, ops = simple_epilogue(a, b)
    assert "2-D problems" in config_error(make_problem(a, b, ep, ops, op="bmm"), TMA)
    a2, w2 = torch.randn(8, 32), torch.randn(32, 16)
    ep2, ops2 = simple_epilogue(a2, w2)
    gemv = for_template(make_problem(a2, w2, ep2, ops2), "gemv")
    assert "no variant 'tma'" in config_error(gemv, Config(16, 32, 16, 1, variant="tma"))


@pytest.mark.parametrize("subtile", [2, 4])
@pytest.mark.parametrize("variant", ["default", *HOPPER_VARIANTS])
@pytest.mark.parametrize("epilogue", ["bias_gelu_tanh_residual", "two_outputs", "col_vector"])
def test_epilogue_subtiles_store_every_column(subtile, variant, epilogue):
    """The epilogue on column slices: N=100 is ragged against each 64/subtile-column slice."""
    config = Config(16, 64, 16, 4, num_warps=4, num_stages=1, variant=variant, EPILOGUE_SUBTILE=subtile)
    run_case(None, 40, 100, 48, "NT", torch.bfloat16, epilogue, config=config)


@pytest.mark.parametrize("variant", ["persistent", "tma_persistent"])
@pytest.mark.parametrize(
    "knobs",
    [
        {"PROGRAMS_PER_SM": 2},
        {"FLATTEN": 1},
        {"WARP_SPECIALIZE": 1},
        {"FLATTEN": 1, "WARP_SPECIALIZE": 1, "EPILOGUE_SUBTILE": 2, "PROGRAMS_PER_SM": 2},
    ],
    ids=str,
)
def test_persistent_knobs(variant, knobs):
    config = Config(16, 32, 16, 4, num_warps=4, num_stages=1, variant=variant, **knobs)
    run_case(None, 72, 104, 40, "NN", torch.float16, "bias_gelu_tanh_residual", config=config)


@pytest.mark.parametrize("subtile", [1, 2, 4])
@pytest.mark.parametrize("variant", ["tma", "tma_persistent"])
@pytest.mark.parametrize("epilogue", ["bias_gelu_tanh_residual", "two_outputs", "col_vector", "cast_fp32"])
def test_tma_stores_write_every_element_and_clip_at_the_edges(subtile, variant, epilogue):
    """Outputs through tensor descriptors: 40x104 is ragged against 16x64 tiles (TMA clips)."""
    config = Config(
        16, 64, 16, 4, num_warps=4, num_stages=1, variant=variant, EPILOGUE_SUBTILE=subtile, TMA_STORE=1
    )
    run_case(None, 40, 104, 48, "NT", torch.float16, epilogue, config=config)


def test_tma_store_falls_back_to_pointer_stores_for_outputs_tma_cannot_write():
    gen = torch.Generator().manual_seed(1)
    a, w = torch.randn(40, 64, generator=gen).half(), torch.randn(48, 64, generator=gen).half()
    ep, ops = simple_epilogue(a, w.t(), activation="relu")
    problem = make_problem(a, w.t(), ep, ops)
    config = Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant="tma", TMA_STORE=1)
    assert [d.arg for d in bind(problem, config, a, w.t(), ops).descriptors][-1] == "out0_desc"
    out = torch.full((48, 40), float("nan"), dtype=torch.float16).t()  # column-major output
    bound = bind(problem, config, a, w.t(), ops, out=(out,))
    assert [d.arg for d in bound.descriptors] == ["a_desc", "b_desc"]
    bound.run()
    ref = torch.relu(a.double() @ w.double().t())
    assert rel_error(out, ref) <= tolerance("float16", "ieee", "float16")


def test_tma_store_rules():
    a, w = torch.randn(40, 64).half(), torch.randn(44, 64).half()
    ep, ops = simple_epilogue(a, w.t())
    odd = make_problem(a, w.t(), ep, ops)  # rows of 44 fp16 outputs: 88 bytes
    assert "16-byte aligned output rows" in config_error(odd, Config(16, 32, 16, variant="tma", TMA_STORE=1))
    b = torch.randn(64, 48).half()
    ep2, ops2 = simple_epilogue(a, b)
    fine = make_problem(a, b, ep2, ops2)
    assert "needs a tma variant" in config_error(fine, Config(16, 32, 16, variant="persistent", TMA_STORE=1))
    assert config_error(fine, Config(16, 32, 16, variant="tma_persistent", TMA_STORE=1)) is None
    # the staged output counts against shared memory: 196608 + 65536 bytes does not fit
    big = make_problem(torch.randn(512, 512).half(), torch.randn(512, 512).half(), ep2, ops2)
    store = Config(256, 128, 128, 8, num_warps=8, num_stages=2, variant="tma_persistent", TMA_STORE=1)
    assert "262144 bytes of shared memory" in infeasible(big, store, HOPPER)
    assert infeasible(big, dataclasses.replace(store, EPILOGUE_SUBTILE=2), HOPPER) is None
    mask = Epilogue.build([(ops_.gt(acc(), 0.0), "bool")])
    boolean = make_problem(a, b, mask, {})
    assert "bool outputs" in config_error(boolean, Config(16, 32, 16, variant="tma", TMA_STORE=1))


def test_hopper_knob_rules():
    a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    ep, ops = simple_epilogue(a, b)
    problem = make_problem(a, b, ep, ops)
    assert "below 16 columns" in config_error(problem, Config(16, 32, 16, EPILOGUE_SUBTILE=4))
    for knob in ({"PROGRAMS_PER_SM": 2}, {"FLATTEN": 1}, {"WARP_SPECIALIZE": 1}):
        for variant in ("default", "tma"):
            why = config_error(problem, Config(16, 32, 16, variant=variant, **knob))
            assert "persistent variants only" in why
        assert config_error(problem, Config(16, 32, 16, variant="persistent", **knob)) is None
    gemv = for_template(make_problem(a[:8], b, ep, ops), "gemv")
    assert "only the matmul template" in config_error(gemv, Config(16, 32, 16, EPILOGUE_SUBTILE=2))
    # two programs per SM: twice the shared memory and half the register file at most
    big = Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="persistent", PROGRAMS_PER_SM=2)
    large = make_problem(torch.randn(512, 512).half(), torch.randn(512, 512).half(), ep, ops)
    assert "shared memory" in infeasible(large, big, HOPPER)
    small = Config(64, 64, 64, 8, num_warps=4, num_stages=3, variant="persistent", PROGRAMS_PER_SM=2)
    assert infeasible(large, small, HOPPER) is None
    wide = Config(128, 256, 32, 8, num_warps=8, num_stages=2, variant="persistent", PROGRAMS_PER_SM=2)
    assert "register file" in infeasible(large, wide, HOPPER)


def test_a_warp_specialized_tile_of_over_64_rows_is_refused_as_a_hang():
    """Triton 3.6 splits such a tile over two consumer warp groups, and the kernel never
    finished on an H100 (mm 100352x144xK, K 16 to 96, and 401408x64x16: BLOCK_M 128 and 256,
    BLOCK_N 16 and 64, 2 to 4 stages, 1 or 2 programs per SM; BLOCK_M 64 ran). Where Triton
    does not specialize (8 warps, or flattened) the knob is harmless and allowed."""
    from epilab.templates.gemm.matmul_config import applies, config_error

    a, b = torch.randn(96, 24).half(), torch.randn(24, 80).half()
    ep, ops = simple_epilogue(a, b)
    problem = make_problem(a, b, ep, ops)
    ws = dict(variant="tma_persistent", WARP_SPECIALIZE=1, num_warps=4, num_stages=4)
    for rows in (128, 256):
        assert "hangs" in config_error(problem, Config(rows, 16, 16, 16, **ws))
        assert "hangs" in infeasible(problem, Config(rows, 64, 16, 8, **ws), HOPPER)
        assert config_error(problem, Config(rows, 64, 16, 8, **{**ws, "num_warps": 8})) is None
        assert config_error(problem, Config(rows, 64, 16, 8, **ws, FLATTEN=1)) is None
        assert not applies("WARP_SPECIALIZE", {"variant": "tma_persistent", "num_warps": 4, "BLOCK_M": rows})
    assert config_error(problem, Config(64, 64, 16, 8, **ws)) is None
    assert infeasible(problem, Config(64, 64, 16, 8, **ws), HOPPER) is None
    assert applies("WARP_SPECIALIZE", {"variant": "tma_persistent", "num_warps": 4, "BLOCK_M": 64})


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(100352, 144, 24), (1000, 200, 264), (4096, 4096, 4096)], ids=str)
def test_gpu_a_warp_specialized_loop_runs(shape):
    """The one warp-specialized tile the rules leave (BLOCK_M <= 64, 4 warps, tma_persistent)
    runs and is right: the config of the sweep that ran, on the shape where 128 and 256 rows hung."""
    config = Config(
        64,
        64,
        16,
        16,
        num_warps=4,
        num_stages=4,
        variant="tma_persistent",
        WARP_SPECIALIZE=1,
        PROGRAMS_PER_SM=2,
    )
    run_case(None, *shape, "NT", torch.bfloat16, "bias_gelu_tanh_residual", device="cuda", config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (2048, 14336, 4096), (129, 200, 264)], ids=str)
@pytest.mark.parametrize("variant", HOPPER_VARIANTS)
def test_gpu_hopper_variants(variant, layout, shape):
    m, n, k = shape
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant)
    if variant.startswith("tma") and layout == "TN" and m == 129:  # A stored [264, 129]: 258-byte rows
        with pytest.raises(ValueError, match="16-byte aligned rows"):
            run_case(None, m, n, k, layout, torch.bfloat16, "bias", device="cuda", config=config)
        return
    run_case(None, m, n, k, layout, torch.bfloat16, "bias_gelu_tanh_residual", device="cuda", config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["default", "tma", "persistent", "tma_persistent"])
@pytest.mark.parametrize(
    "knobs",
    [
        {"EPILOGUE_SUBTILE": 2},
        {"EPILOGUE_SUBTILE": 4},
        {"FLATTEN": 1},
        {"FLATTEN": 1, "WARP_SPECIALIZE": 1, "EPILOGUE_SUBTILE": 2},
        {"WARP_SPECIALIZE": 1},
        {"PROGRAMS_PER_SM": 2},
        {"TMA_STORE": 1},
        {"TMA_STORE": 1, "EPILOGUE_SUBTILE": 2},
    ],
    ids=str,
)
def test_gpu_hopper_knobs(variant, knobs):
    if variant in ("default", "tma") and not set(knobs) <= {"EPILOGUE_SUBTILE", "TMA_STORE"}:
        pytest.skip("persistent knob")
    if "TMA_STORE" in knobs and variant not in ("tma", "tma_persistent"):
        pytest.skip("TMA stores need a tma variant")
    warps_stages = {"num_warps": 4, "num_stages": 3} if "PROGRAMS_PER_SM" in knobs else {"num_warps": 8}
    bn = 64 if "PROGRAMS_PER_SM" in knobs else 256
    config = Config(128, bn, 64, 8, variant=variant, **warps_stages, **knobs)
    for m, n, k in ((2048, 14336, 4096), (1000, 1240, 520), (777, 136, 264)):
        run_case(None, m, n, k, "NT", torch.bfloat16, "bias_gelu_tanh_residual", device="cuda", config=config)
