"""The cooperative Gluon kernel (variant ``sm90_cooperative``, ``templates/gemm/matmul_sm90.py``): fp8
with exact accumulation, block-scaled or not, its promotions overlapping other warp groups' MMAs.

CPU: what it takes and refuses (fp8 with exact accumulation, A row-major and B column-major,
2 or 3 warp groups of 64 rows, BLOCK_K 128, no column sums; TMA stores of each warp group's
rows; row statistics, column maxima, the quantize step's groups one a tile), BLOCK_M = 192 for
this variant only, the tuner's feasibility (never in the interpreter; shared memory; registers
counted per warp group), and that it compiles for sm_90a through Triton and ptxas without
spills, with fp8 wgmma (QGMMA) and TMA loads (``templates/tools/cross.py``). GPU (``-m gpu``):
block-scaled and rowwise-scaled problems against float64 over ragged shapes (partial tiles,
a partial last K group, K shorter than a block), epilogues with a bias, activations, a
residual and an fp8 output; row statistics and column maxima; the quantize step for the next
GEMM (q and its scales as torch quantizes the kernel's own unquantized output); exact
accumulation's error equal to cuBLASLt's ``use_fast_accum=False`` (both promote every 128
elements of K).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
from test_block_scaled import block_tensors
from test_block_scaled import reference as block_reference
from test_fp8 import FP8, exact_case, fp8_tensor, scales
from test_matmul_sm90 import checked_kernel, compile_cases
from test_quantize_epilogue import torch_quantized

from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.quantize import quantized_groups
from epilab.policy.space import HOPPER, DeviceLimits, infeasible, run_error, smem_bytes
from epilab.templates.gemm.block_scaled import A_SCALES, cublaslt_layouts, make_block_problem
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_sm90 import last_wave_split, tail_split
from epilab.templates.registry import kind_of
from epilab.templates.verify import checked_launch

THREE = Config(192, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative")
THREE_TMA = Config(192, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1)
TWO = Config(128, 128, 128, 8, num_warps=4, num_stages=6, variant="sm90_cooperative")
TWO_TMA = Config(128, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative", TMA_STORE=1)
NARROW = Config(128, 64, 128, 4, num_warps=4, num_stages=4, variant="sm90_cooperative")
H100 = DeviceLimits("NVIDIA H100 80GB HBM3", "9.0", 132, 232_448)
BLOCK = Spec(1024, 2112, 2048, dtype="float8_e4m3fn", scales="block", epilogue="bias_gelu")
ROWWISE = Spec(1024, 2048, 2048, dtype="float8_e4m3fn", epilogue="bias_gelu")


def _error(problem, config):
    return kind_of(problem).config_error(problem, config)


# ------------------------------------------------------------------ rules (CPU)


@pytest.mark.parametrize("spec", [BLOCK, ROWWISE], ids=["block", "rowwise"])
def test_what_the_cooperative_variant_takes_and_refuses(spec):
    p = spec.problem()
    for config in (THREE, TWO, NARROW):
        assert _error(p, config) is None, config.short()
    assert "exact accumulation" in _error(Spec(1024, 2048, 2048, epilogue="bias_gelu").problem(), TWO)
    fast = dataclasses.replace(ROWWISE.problem(), precision="fast")
    assert "exact accumulation" in _error(fast, TWO)
    nn = Spec(1024, 2048, 2048, dtype="float8_e4m3fn", layout="NN").problem()
    assert "K-major" in _error(nn, TWO)
    assert "BLOCK_M 128 or 192" in _error(p, dataclasses.replace(TWO, BLOCK_M=64))
    assert "BLOCK_M 128 or 192" in _error(p, dataclasses.replace(TWO, BLOCK_M=256))
    assert "spill" in _error(p, dataclasses.replace(TWO, BLOCK_N=256))
    assert "BLOCK_K=128" in _error(p, dataclasses.replace(TWO, BLOCK_K=64))
    assert _error(p, dataclasses.replace(TWO, TMA_STORE=1)) is None
    assert "num_warps=4" in _error(p, dataclasses.replace(TWO, num_warps=8))
    col_sums = Epilogue.build([(acc(), "bfloat16"), (acc(), "float32", "col_sum")])
    assert "column sums" in _error(dataclasses.replace(p, epilogue=col_sums, operands=()), TWO)


def test_row_statistics_column_maxima_and_groups_it_takes():
    """Each warp group owns whole rows of its tile: row statistics and column maxima (their
    order does not matter) are its; the quantize step's groups are one a tile (BLOCK_N 128)."""
    p = BLOCK.problem()
    stats = Epilogue.build(
        [(acc(), "bfloat16"), (acc() * acc(), "float32", "row_sum"), (acc(), "float32", "col_max")]
    )
    assert _error(dataclasses.replace(p, epilogue=stats, operands=()), TWO) is None
    quant = Spec(
        1024, 2112, 2048, dtype="float8_e4m3fn", scales="block", epilogue="silu", quantize=128
    ).problem()
    for config in (THREE, TWO, THREE_TMA):
        assert _error(quant, config) is None, config.short()
    assert "BLOCK_N = 128" in _error(quant, NARROW)
    pingpong = Config(128, 256, 64, 8, num_warps=4, num_stages=3, variant="sm90_pingpong")
    bf16 = Spec(1024, 2048, 2048, epilogue="silu", quantize=128).problem()
    assert "BLOCK_N = 128" in _error(bf16, pingpong)
    assert _error(bf16, dataclasses.replace(pingpong, BLOCK_N=128, TMA_STORE=1)) is None


def test_block_m_192_is_the_cooperative_variants_only():
    p = ROWWISE.problem()
    for variant in ("default", "tma", "tma_persistent", "sm90_pingpong"):
        config = dataclasses.replace(THREE, variant=variant, num_warps=8 if variant != "sm90_pingpong" else 4)
        assert "not a power of two" in _error(p, config), variant


def test_feasibility_counts_registers_per_warp_group_and_shared_memory():
    p = Spec(4096, 7168, 2048, dtype="float8_e4m3fn", scales="block").problem()
    assert "interpreter" in infeasible(p, THREE, HOPPER)
    assert infeasible(p, THREE, H100) is None  # 192 x 128 over 3 x 4 warps: 64 registers each
    assert infeasible(p, TWO, H100) is None
    # 6 stages of (192 + 128) x 128 fp8 = 240 KiB > 227 KiB; with TMA stores a 192 x 128 bf16
    # staging (three 64-row buffers, 48 KiB) fits beside 4 stages, not 5
    assert "shared memory" in infeasible(p, dataclasses.replace(THREE, num_stages=6), H100)
    assert infeasible(p, THREE_TMA, H100) is None
    assert "shared memory" in infeasible(p, dataclasses.replace(THREE_TMA, num_stages=5), H100)
    # only tile outputs are staged: the quantize step's q (1 byte) beside 4 stages, not its
    # scales; a bf16 tile and its row statistic (by pointers) likewise
    quant = Spec(
        4096, 7168, 2048, dtype="float8_e4m3fn", scales="block", epilogue="silu", quantize=128
    ).problem()
    assert smem_bytes(quant, THREE_TMA) == 4 * (192 + 128) * 128 + 192 * 128
    assert infeasible(quant, THREE_TMA, H100) is None
    stats = Epilogue.build([(acc(), "bfloat16"), (acc() * acc(), "float32", "row_sum")])
    assert infeasible(dataclasses.replace(p, epilogue=stats), THREE_TMA, H100) is None


def test_a_partial_last_wave_is_split_along_k_only_where_it_pays():
    """tail_split: (tiles, SMs, K steps) -> ranges of K a tile of the last wave is split into."""
    assert tail_split(704, 132, 56) == 3  # 4096 x 4096 x 7168 in 192 x 128: 5 waves + 44 tiles
    assert tail_split(1232, 132, 128) == 3  # 4096 x 7168 x 16384: 9 waves + 44
    assert tail_split(1232, 132, 16) == 1  # the same at K = 2048: 10 steps saved, not worth it
    assert tail_split(4224, 132, 12) == 1  # 32 full waves: nothing to split
    assert tail_split(374, 132, 56) == 1  # a last wave 110 / 132 full: no program is free
    assert tail_split(32, 132, 32) == 4  # M = 128: 32 tiles, each split 4 ways (split-K)
    assert tail_split(6, 132, 33) == 8  # at most MAX_TAIL_SPLIT ranges
    assert tail_split(6, 132, 9) == 1  # each range 2 steps at least, and worth its sum


# --------------------------------------------------- compiled for sm_90a (CPU)

COMPILED = [
    ("block, 3 warp groups", Spec(4096, 2112, 7168, dtype="float8_e4m3fn", scales="block"), THREE),
    ("block, last wave split 3 ways", Spec(4096, 4096, 7168, dtype="float8_e4m3fn", scales="block"), THREE),
    ("block bias_gelu, 2", BLOCK, TWO),
    ("block 64 wide, residual", Spec(1000, 776, 1024, dtype="float8_e4m3fn", scales="block", epilogue="bias_residual"), NARROW),
    ("rowwise exact bias_gelu, 3", ROWWISE, THREE),
    ("tensorwise exact, e5m2", Spec(1024, 1024, 1024, dtype="float8_e5m2", scales="tensor"), TWO),
    ("block, TMA stores", Spec(4096, 32768, 512, dtype="float8_e4m3fn", scales="block"), THREE_TMA),
    ("rowwise, two outputs by TMA", Spec(1024, 2048, 2048, dtype="float8_e4m3fn", epilogue=(("acc", "float32"), ("gelu(acc)", None))), dataclasses.replace(TWO, TMA_STORE=1, num_stages=4)),
    ("block, quantized per 128 for the next GEMM, q by TMA", Spec(2048, 14336, 4096, dtype="float8_e4m3fn", scales="block", epilogue="silu", quantize=128), THREE_TMA),
    ("block, quantized per 128, last wave split 3 ways", Spec(2048, 14336, 4096, dtype="float8_e4m3fn", scales="block", epilogue="silu", quantize=128), THREE),
]  # fmt: skip


@pytest.fixture(scope="module")
def compiled():
    return compile_cases(COMPILED)


@pytest.mark.parametrize("index", range(len(COMPILED)), ids=[c[0] for c in COMPILED])
def test_compiles_for_sm90_without_spills(compiled, index):
    what, _, config = COMPILED[index]
    kernel = checked_kernel(compiled[index], what, config, mma="QGMMA")
    # the consumer warp groups and the producer's (one warp, padded to a warp group)
    assert kernel["num_warps"] == 4 * (config.BLOCK_M // 64 + 1)


@pytest.mark.parametrize("index", range(len(COMPILED)), ids=[c[0] for c in COMPILED])
def test_main_loops_do_not_wait_for_their_own_loads(compiled, index):
    """Each consumer warp group's K loop (``sass.main_loops``) issues its wgmma without waiting
    for a global load of the same step: the block scales are loaded a step ahead. Loaded in
    their step (or a scalar B scale moved to a uniform register right after its load) they held
    up the step's MMAs for an L2 round trip: 2-8% of the kernel (RESULTS.md, 2026-11-29)."""
    what, _, config = COMPILED[index]
    loops = compiled[index]["kernels"][0]["loops"]
    assert len(loops) == config.BLOCK_M // 64, f"{what}: one K loop a consumer, found {len(loops)}"
    for loop in loops:
        assert loop["opcodes"]["QGMMA"] == 4, f"{what}: 4 wgmma of K 32 a step of BLOCK_K 128"
        assert not loop["waits_on_loads"], f"{what}: " + "; ".join(loop["waits_on_loads"])


@pytest.mark.parametrize("index", range(len(COMPILED)), ids=[c[0] for c in COMPILED])
def test_loops_load_the_next_scales_while_their_mmas_run(compiled, index):
    """Each K step loads the next step's block scales (3 loads) between issuing its wgmma and
    waiting for it, so their latency overlaps tensor-core work: 4-5% of the kernel on an H200
    against loads issued before the wgmma (RESULTS.md, 2026-11-29 fifth), in the whole-tile
    loop, the split last wave's and a quantize step's alike. With 3 consumers at 152 registers
    ptxas sank them past the wait in the latter two (2026-11-29 seventh). Rowwise and
    tensorwise loops load nothing."""
    what, spec, _ = COMPILED[index]
    block = spec.scales == "block"
    for loop in compiled[index]["kernels"][0]["loops"]:
        places = loop["load_places"]
        assert places == (["under"] * 3 if block else []), f"{what}: {places}"


@pytest.mark.parametrize("what", [c[0] for c in COMPILED if "quantized" in c[0] or "split" in c[0]])
def test_the_split_cases_are_compiled_split(what):
    """The ``split 3 ways`` cases compile the split loop (an H100's 132 SMs); a quantize step
    storing by TMA keeps its last wave whole (``last_wave_split``)."""
    (_, spec, config) = next(c for c in COMPILED if c[0] == what)
    tiles = triton.cdiv(spec.m, config.BLOCK_M) * triton.cdiv(spec.n, config.BLOCK_N)
    steps = triton.cdiv(spec.k, config.BLOCK_K)
    assert tail_split(tiles, H100.sm_count, steps) == 3
    split = last_wave_split(spec.problem(), config, tiles, H100.sm_count, steps)
    assert split == (1 if "TMA" in what else 3)


# ------------------------------------------------------------------ GPU


def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the cooperative kernel is a Gluon kernel for sm_90 (wgmma)")


# (M, N, K): ragged against 192 and 128; a partial last K group (1040 = 8 groups + 16); a K
# shorter than one block; a single row; many tiles per program (the ring wraps)
GPU_SHAPES = [(1000, 2112, 2048), (200, 328, 1040), (8, 16, 16), (1, 128, 256), (4096, 4096, 1024)]


# two outputs staged (bf16 and fp8: 72 KiB) leave room for 3 stages of 192 x 128 x 128
TWO_OUTPUTS_TMA = dataclasses.replace(THREE_TMA, num_stages=3)


def _runnable(problem, config):
    """``config``, with pointer stores where TMA cannot store the outputs' rows (an fp8 output
    of 328 columns), checked to launch on an H100 (its rules and shared memory; blocks larger
    than a small problem are fine to run, the tuner only skips them)."""
    if config.TMA_STORE and run_error(problem, config, H100):
        config = dataclasses.replace(config, TMA_STORE=0)
    why = run_error(problem, config, H100)
    assert why is None, why
    return config


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config", [THREE, TWO, NARROW, TWO_OUTPUTS_TMA], ids=["three", "two", "narrow", "tma-store"]
)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_block_scaled_matches_float64(shape, config):
    """Block scales (A per row and 128 of K, B per 128x128), a bias, GELU and a residual; an
    fp8 second output (within its range) beside the bf16 one."""
    _hopper()
    m, n, k = shape
    torch.manual_seed(m + n + k)
    a, b, tensors = block_tensors(m, n, k, FP8["e4m3"], device="cuda")
    tensors["bias"] = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    tensors["residual"] = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    x = ops.gelu(acc() + operand("bias", "row")) + operand("residual", "tile")
    ep = Epilogue.build([(x, "bfloat16"), (x * 0.125, "float8_e4m3fn")])
    problem = make_block_problem(a, b, ep, tensors)
    checked_launch(problem, _runnable(problem, config), a, b, tensors)  # every output against float64


@pytest.mark.gpu
@pytest.mark.parametrize("config", [THREE, TWO, TWO_OUTPUTS_TMA], ids=["three", "two", "tma-store"])
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_rowwise_exact_matches_float64(shape, fp8, config):
    """Rowwise scales, a bias and GELU (tanh) in the epilogue, bf16 and fp8 outputs."""
    _hopper()
    m, n, k = shape
    torch.manual_seed(m * n + k)
    a = fp8_tensor(m, k, FP8[fp8], False, "cuda")
    b = fp8_tensor(k, n, FP8[fp8], True, "cuda")
    tensors = {**scales("row", m, n, "cuda"), "bias": torch.randn(n, device="cuda", dtype=torch.bfloat16)}
    x = ops.gelu_tanh(acc() * operand("scale_a", "col") * operand("scale_b", "row") + operand("bias", "row"))
    ep = Epilogue.build([(x, "bfloat16"), (x * 8.0, "float8_e4m3fn")])
    problem = make_problem(a, b, ep, tensors)
    checked_launch(problem, _runnable(problem, config), a, b, tensors)


# shapes whose last wave is split along K (``tail_split``): ragged M, N and K (33 K steps over
# 6 or 8 tiles: 8 ranges each); M = 128 (32 tiles, 4 ranges each: a split-K); 5 waves and 44
# tiles of 192 x 128 (3 ranges each); each with 3 warp groups and with 2 (TMA stores)
SPLIT_CASES = [
    ((200, 328, 4160), THREE), ((200, 328, 4160), TWO_TMA),
    ((128, 4096, 4096), THREE), ((128, 4096, 4096), TWO_TMA),
    ((4096, 4096, 7168), THREE), ((4096, 4096, 7168), THREE_TMA),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shape", "config"), SPLIT_CASES, ids=lambda c: c.short() if isinstance(c, Config) else str(c)
)
def test_gpu_a_split_last_wave_matches_float64_deterministically(shape, config):
    """Block scales, a bias, GELU and a residual, the last wave's tiles split along K: the
    outputs match float64, a second launch gives the same bits (the partial sums are added
    in a fixed order), and every flag of the call's scratch is back at zero."""
    _hopper()
    m, n, k = shape
    tiles = -(-m // config.BLOCK_M) * -(-n // config.BLOCK_N)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert tail_split(tiles, sms, -(-k // 128)) > 1, "the shape does not split: the test checks nothing"
    torch.manual_seed(m + n + k)
    a, b, tensors = block_tensors(m, n, k, FP8["e4m3"], device="cuda")
    tensors["bias"] = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    tensors["residual"] = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ep = Epilogue.build(
        [(ops.gelu(acc() + operand("bias", "row")) + operand("residual", "tile"), "bfloat16")]
    )
    problem = make_block_problem(a, b, ep, tensors)
    bound = checked_launch(problem, _runnable(problem, config), a, b, tensors)
    first = bound.outs[0].clone()
    bound.run()
    torch.cuda.synchronize()
    assert torch.equal(bound.outs[0], first)
    assert not bound.args["flags_ptr"].any(), "a flag was left raised"


@pytest.mark.gpu
def test_gpu_a_split_last_wave_of_rowwise_exact_accumulation():
    """Rowwise scales, exact accumulation, M = 128 (32 tiles, each split into 4 ranges)."""
    _hopper()
    m, n, k = 128, 4096, 4096
    a = fp8_tensor(m, k, FP8["e4m3"], False, "cuda")
    b = fp8_tensor(k, n, FP8["e4m3"], True, "cuda")
    tensors = scales("row", m, n, "cuda")
    x = acc() * operand("scale_a", "col") * operand("scale_b", "row")
    problem = make_problem(a, b, Epilogue.build([(x, "bfloat16")]), tensors)
    checked_launch(problem, THREE_TMA, a, b, tensors)


@pytest.mark.gpu
@pytest.mark.parametrize("same_sign", [False, True], ids=["signed", "same-sign"])
def test_gpu_exact_error_equals_cublaslt_exact(same_sign):
    """fp32 out, no scales: a promotion every K block of 128 is cuBLASLt's exact mode's
    error against float64 (docs/design.md's table; the interval of 128 matched it to 3 digits)."""
    _hopper()
    a, b, ref, bound, problem = exact_case(same_sign, seed=5)
    for config in (THREE, TWO, TWO_OUTPUTS_TMA):  # 96 KiB of fp32 staging beside 3 stages
        (out,) = checked_launch(problem, config, a, b, {}).outs
        assert rel_error(out, ref) <= 1.01 * bound, (config.short(), rel_error(out, ref), bound)


@pytest.mark.gpu
def test_gpu_block_scaled_matches_cublaslt():
    """DeepSeek-V3's shape at M = 1000: the same values as torch._scaled_mm's block scaling."""
    _hopper()
    a, b, tensors = block_tensors(1000, 2112, 2048, FP8["e4m3"], device="cuda")
    problem = make_block_problem(a, b, Epilogue.identity("bfloat16"), tensors)
    (ours,) = checked_launch(problem, THREE_TMA, a, b, tensors).outs
    theirs = kind_of(problem).baseline(problem, a, b, tensors)[0]
    ref = block_reference(a, b, tensors)
    assert rel_error(ours, ref) <= 1.5 * max(rel_error(theirs, ref), 1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [THREE, TWO_TMA], ids=["three", "two-tma-store"])
def test_gpu_block_scales_in_cublaslt_layouts_and_programs_of_many_tiles(config):
    """The scales as cuBLASLt takes them (A's M-major: stride (1, M)), and as given (row-major),
    give the same result; 6 x 33 or 8 x 33 tiles over 132 programs, so a program's last K step
    loads its next tile's first scales (ragged M, N past the last block of 128, 13 K groups)."""
    _hopper()
    m, n, k = 1000, 4160, 1664
    torch.manual_seed(k)
    a, b, tensors = block_tensors(m, n, k, FP8["e4m3"], device="cuda")
    problem = make_block_problem(a, b, Epilogue.identity("bfloat16"), tensors)
    laid = cublaslt_layouts(tensors)
    assert laid[A_SCALES].stride() == (1, m)
    (rows,) = checked_launch(problem, config, a, b, tensors).outs
    (cols,) = checked_launch(problem, config, a, b, laid).outs
    assert torch.equal(rows, cols)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [THREE, TWO, THREE_TMA], ids=["three", "two", "tma-store"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_row_statistics_and_column_maxima_match_float64(shape, config):
    """An RMSNorm's sum of squares per row (a tile's share from each warp group's rows) and a
    column max (two or three warp groups' shares of one tile's columns) beside the bf16 tile."""
    _hopper()
    m, n, k = shape
    torch.manual_seed(m + k)
    a, b, tensors = block_tensors(m, n, k, FP8["e4m3"], device="cuda")
    tensors["residual"] = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    x = acc() + operand("residual", "tile")
    ep = Epilogue.build([(x, "bfloat16"), (x * x, "float32", "row_sum"), (abs(x), "float32", "col_max")])
    problem = make_block_problem(a, b, ep, tensors)
    checked_launch(problem, _runnable(problem, config), a, b, tensors)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [THREE, TWO, THREE_TMA], ids=["three", "two", "tma-store"])
@pytest.mark.parametrize("shape", [(1000, 2112, 2048), (200, 384, 1040), (1, 256, 256)], ids=str)
def test_gpu_quantizes_for_the_next_gemm(shape, config):
    """silu of a block-scaled product quantized per row and 128 columns in the epilogue: the
    scales as torch computes them from the kernel's own unquantized output, the fp8 codes equal
    but where the scale's last bit moved a value across a rounding boundary."""
    _hopper()
    _quantized_matches_torch(shape, config)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [THREE, TWO, THREE_TMA], ids=["three", "two", "tma-store"])
@pytest.mark.parametrize("shape", [(128, 4096, 4096), (200, 1024, 4160)], ids=str)
def test_gpu_quantizes_a_split_last_wave(shape, config):
    """The same where the last wave's tiles are split along K (M = 128: 4 ranges a tile; 16
    ragged tiles of 33 K steps: 8 ranges): the group maxima are taken over the summed tile."""
    _hopper()
    m, n, k = shape
    tiles = -(-m // config.BLOCK_M) * -(-n // config.BLOCK_N)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert tail_split(tiles, sms, -(-k // 128)) > 1, "the shape does not split: the test checks nothing"
    _quantized_matches_torch(shape, config)


def _quantized_matches_torch(shape, config):
    m, n, k = shape
    torch.manual_seed(n + k)
    a, b, tensors = block_tensors(m, n, k, FP8["e4m3"], device="cuda")
    silu = Epilogue.build([(ops.silu(acc()), "bfloat16")])
    problem = make_block_problem(a, b, quantized_groups(silu, 128), tensors)
    config = _runnable(problem, config)
    q, scale = checked_launch(problem, config, a, b, tensors).outs
    (y,) = checked_launch(make_block_problem(a, b, silu, tensors), config, a, b, tensors).outs
    want_q, want_scale = torch_quantized(y, 128)
    torch.testing.assert_close(scale, want_scale, rtol=2e-7, atol=0)
    assert (q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean().item() < 1e-4
