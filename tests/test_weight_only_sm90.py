"""The Gluon weight-only kernel (variant ``sm90_weight_only``, ``templates/gemm/matmul_sm90.py``): a
16-bit A times an fp8 weight, the weight's converted slice wgmma's left operand in registers.

CPU: what it takes and refuses (weight-only problems only, A row-major and the weight K-major,
2 or 3 warp groups of 64 weight rows, or a dual's pair, BLOCK_M by warp groups, no SWAP_AB, TMA
stores, statistics or groups, 16-byte weight rows), BLOCK_N = 192 for this variant only, the
search spaces (the weight-only kind draws it, the matmul and dual kinds do not), the tuner's
feasibility (never in the interpreter), and that it (and every Gluon seed of both kinds)
compiles for sm_90a without spills and without wgmmas serialized by ptxas, every wgmma of its K
loops reading the weight from registers (``templates/tools/cross.py``). GPU
(``-m gpu``): ragged shapes (partial tiles, weight rows past N, a partial last K step, an odd
and an even number of K steps), both fp8 formats, fp16 and bf16 A, an epilogue with the
weight's scales, a bias, GELU, a residual and a second fp32 output, against float64 and the
baseline.
"""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
from test_cooperative import H100
from test_matmul_sm90 import checked_kernel, compile_cases
from test_weight_only import FP8, WIDE, dual_swiglu, tensors

from epilab.ir.check import rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.policy.space import HOPPER, infeasible
from epilab.templates.gemm import matmul, matmul_config, matmul_sm90
from epilab.templates.gemm.dual_weight_only import KIND as DUAL_KIND
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.gemm.weight_only import KIND, make_weight_only_problem
from epilab.templates.registry import kind_of
from epilab.templates.verify import checked_launch

W = "sm90_weight_only"
TWO = Config(256, 128, 64, 8, num_warps=4, num_stages=3, variant=W)  # 2 warp groups of 64 weight rows
THREE = Config(128, 192, 64, 8, num_warps=4, num_stages=5, variant=W)  # 3 warp groups
LLAMA_GATE = Spec(2048, 14336, 4096, weight="float8_e4m3fn")


def _error(problem, config):
    return kind_of(problem).config_error(problem, config)


def test_what_the_weight_only_kernel_takes_and_refuses():
    p = LLAMA_GATE.problem()
    assert _error(p, TWO) is None and _error(p, THREE) is None
    assert _error(p, dataclasses.replace(TWO, BLOCK_M=64, BLOCK_K=128)) is None
    refusals = [
        (dataclasses.replace(TWO, BLOCK_N=256), "BLOCK_N 128 or 192"),
        (dataclasses.replace(TWO, BLOCK_N=64), "BLOCK_N 128 or 192"),
        (dataclasses.replace(THREE, BLOCK_M=256), "BLOCK_M in (64, 128)"),
        (dataclasses.replace(TWO, BLOCK_K=32), "BLOCK_K 64 or 128"),
        (dataclasses.replace(TWO, SWAP_AB=1), "SWAP_AB=0"),
        (dataclasses.replace(TWO, TMA_STORE=1), "TMA_STORE=0"),
        (dataclasses.replace(TWO, num_warps=8), "num_warps=4"),
        (dataclasses.replace(TWO, SPLIT_K=2), "no split-K"),
    ]
    for config, message in refusals:
        assert message in (_error(p, config) or ""), (config.short(), _error(p, config))
    row_b = Spec(2048, 4096, 4096, weight="float8_e4m3fn", layout="NN").problem()
    assert "K-major" in _error(row_b, TWO)
    ragged_k = Spec(256, 512, 1000, weight="float8_e4m3fn").problem()  # rows of 1000 bytes
    assert "16-byte aligned" in _error(ragged_k, TWO)
    for k in (0, sympy.Symbol("s2")):  # its first K step is issued unconditionally: K = 0 would hang
        empty = dataclasses.replace(p, shape=dataclasses.replace(p.shape, k=k))
        assert "static K of 1 or more" in matmul_sm90.config_error(empty, TWO)
    scaled = acc() * operand("weight_scale", "row")
    stats = Epilogue.build([(scaled, "bfloat16"), (scaled * scaled, "float32", "row_sum")])
    assert "statistics" in _error(dataclasses.replace(p, epilogue=stats), TWO)


def test_other_kinds_refuse_it_and_only_it_takes_block_n_192():
    bf16 = Spec(2048, 4096, 4096).problem()
    assert "weight-only problems" in _error(bf16, TWO)
    p = LLAMA_GATE.problem()
    for variant in ("default", "tma", "tma_persistent"):
        config = dataclasses.replace(THREE, variant=variant)
        assert "BLOCK_N=192 is not a power of two" in _error(p, config), variant


def test_a_dual_holds_two_accumulators_a_warp_group():
    """The gated MLP's gate and up projections in one kernel: each warp group converts a slice
    of both weights a K step and holds two 64 x BLOCK_M accumulators, so BLOCK_M is one step
    smaller than a single GEMM's."""
    dual = Spec(2048, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2").problem()
    assert dual.template == DUAL_KIND.name
    assert _error(dual, dataclasses.replace(TWO, BLOCK_M=128)) is None
    assert "BLOCK_M in (64, 128)" in _error(dual, TWO) and "two 64 x BLOCK_M" in _error(dual, TWO)
    assert _error(dual, dataclasses.replace(THREE, BLOCK_M=64)) is None
    assert "BLOCK_M in (64,)" in _error(dual, THREE)
    assert W in DUAL_KIND.space["variant"] and 192 in DUAL_KIND.space["BLOCK_N"]
    for seed in (c for c in DUAL_KIND.seeds if c.variant == W):
        assert _error(dual, seed) is None, seed.short()
    # B and B2 each in slices of 64 weight rows a stage
    assert DUAL_KIND.smem_bytes(dual, TWO) == 3 * (256 * 64 * 2 + 2 * 128 * 64)


PAIRED = Config(256, 64, 64, 8, num_warps=4, num_stages=4, variant=W)  # a dual: a warp group a weight


def test_a_paired_dual_gives_each_weight_a_warp_group():
    """BLOCK_N 64 runs a dual as a pair of warp groups, the gate's weight rows on one and the
    up's on the other, each holding the tile's tokens in two halves (so BLOCK_M 256, as a single
    GEMM's) and swapping halves through shared memory before the epilogue."""
    dual = Spec(2048, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2").problem()
    single = LLAMA_GATE.problem()
    assert _error(dual, PAIRED) is None and matmul_sm90.paired(dual, PAIRED)
    assert matmul_sm90.consumers(PAIRED) == 2
    assert not matmul_sm90.paired(single, PAIRED) and not matmul_sm90.paired(dual, TWO)
    assert "or 64 for a dual" in _error(dual, dataclasses.replace(PAIRED, BLOCK_N=32))
    assert "or 64 for a dual" not in _error(single, PAIRED)
    assert "BLOCK_M in (64, 128, 256)" in _error(dual, dataclasses.replace(PAIRED, BLOCK_M=32))
    # stages of A's 256 rows and both weights' 64 rows, and the two exchanged fp32 halves
    assert DUAL_KIND.smem_bytes(dual, PAIRED) == 4 * (256 * 64 * 2 + 2 * 64 * 64) + 2 * 64 * 128 * 4
    assert matmul_sm90.exchange_bytes(dual, TWO) == 0
    assert infeasible(dual, PAIRED, H100) is None
    assert "shared memory" in infeasible(dual, dataclasses.replace(PAIRED, num_stages=5), H100)
    assert matmul_sm90.render_vars(dual, PAIRED)["paired"]


def test_the_weight_only_kinds_search_it_and_the_others_do_not():
    assert W in KIND.space["variant"] and 192 in KIND.space["BLOCK_N"]
    assert W not in matmul.KIND.space["variant"]
    # the Gluon variants that read one dtype are not drawn for an fp8 weight
    assert set(KIND.space["variant"]) == {*matmul_config.TRITON_VARIANTS, W}
    assert not matmul.KIND.applies("SWAP_AB", {"variant": W})
    assert not matmul.KIND.applies("TMA_STORE", {"variant": W})
    assert any(c.variant == W for c in KIND.seeds)
    for seed in (c for c in KIND.seeds if c.variant == W):
        assert _error(LLAMA_GATE.problem(), seed) is None, seed.short()


def test_feasible_on_hopper_never_in_the_interpreter():
    p = LLAMA_GATE.problem()
    assert "interpreter" in infeasible(p, TWO, HOPPER)
    assert infeasible(p, TWO, H100) is None and infeasible(p, THREE, H100) is None
    # 5 stages of 256 x 64 bf16 and 128 x 64 fp8: 200 KiB; 6 are 240 KiB
    assert infeasible(p, dataclasses.replace(TWO, num_stages=5), H100) is None
    assert "shared memory" in infeasible(p, dataclasses.replace(TWO, num_stages=6), H100)


COMPILED = [  # (what, spec, config): Llama-3-8B's projections at prefill
    ("two groups, e4m3, bf16", LLAMA_GATE, TWO),
    ("three groups, e4m3, bf16", Spec(2048, 6144, 4096, weight="float8_e4m3fn"), THREE),
    (
        "dual, two groups, silu(acc) * acc2",
        Spec(2048, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2"),
        Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant=W),
    ),
    ("paired dual, silu(acc) * acc2", Spec(2048, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2"), PAIRED),
    (
        "BLOCK_K 128, e5m2, fp16, gelu + residual",
        Spec(2048, 4096, 14336, dtype="float16", weight="float8_e5m2", epilogue="gelu(acc) + residual"),
        Config(128, 128, 128, 8, num_warps=4, num_stages=3, variant=W),
    ),
]  # fmt: skip


def test_compiles_for_sm90_with_the_weight_in_registers():
    """Compiled for sm_90a: no spills, TMA loads, and every wgmma of each warp group's K loop
    reads the converted weight from registers, a K step's wgmmas waited for once (none
    serialized): the step loop for a bf16 A (unrolled by 2: two slices in turn), the K-block
    loop for an fp16 A (``matmul_sm90.block_loop``)."""
    for (what, spec, config), answer in zip(COMPILED, compile_cases(COMPILED), strict=True):
        kernel = checked_kernel(answer, what, config)
        loops = kernel["loops"]
        assert len(loops) == matmul_sm90.consumers(config), (what, len(loops))  # one a warp group
        steps = 1 if matmul_sm90.block_loop(spec.problem()) else 2  # K steps a turn of the loop
        assert steps == (1 if spec.dtype == "float16" else 2), what
        for loop in loops:
            mmas = loop["opcodes"]["HGMMA"]
            # a warp group converts both weights' slices, but a paired one only its own
            weights = 2 if "acc2" in spec.epilogue and not matmul_sm90.paired(spec.problem(), config) else 1
            assert mmas == steps * weights * config.BLOCK_K // 16 and loop["register_a_mmas"] == mmas, (
                what,
                loop,
            )
            # ptxas serializes wgmmas it cannot keep in flight: a wait beside each. The step loop
            # was serialized for every fp16 A, and block loops that keep wgmmas in flight across
            # their turn were serialized for a bf16 A (fp16 not tried)
            assert loop["mma_waits"] == steps, (what, loop["opcodes"], loop["mma_waits"])


def test_every_gluon_seed_compiles_unserialized():
    """The Gluon seeds of both weight-only kinds (the configs a study tries first) compile for
    sm_90a without spills and with one wait for wgmma a K step (none serialized by ptxas: a
    wait beside each wgmma), on Llama-3-8B's gate shape, with a bf16 and an fp16 A."""
    cases = [
        (f"{kind.name} seed {c.short()}, {dtype}", spec, c)
        for dtype in ("bfloat16", "float16")
        for kind, epilogue in ((KIND, "acc"), (DUAL_KIND, "silu(acc) * acc2"))
        for spec in [Spec(2048, 14336, 4096, dtype=dtype, weight="float8_e4m3fn", epilogue=epilogue)]
        for c in kind.seeds
        if c.variant == W
    ]
    for (what, spec, config), answer in zip(cases, compile_cases(cases), strict=True):
        steps = 1 if matmul_sm90.block_loop(spec.problem()) else 2  # K steps a turn of the loop
        for loop in checked_kernel(answer, what, config)["loops"]:
            assert loop["mma_waits"] == steps < loop["opcodes"]["HGMMA"], (what, loop["opcodes"])


# ------------------------------------------------------------------ GPU


def _scaled_gelu_residual(dtype: str) -> Epilogue:
    x = ops.gelu_tanh(acc() * operand("scale", "row") + operand("bias", "row"))
    return Epilogue.build([(x + operand("residual", "tile"), dtype), (x * 2.0, "float32")])


@pytest.mark.gpu
@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
def test_gpu_matches_float64_and_the_baseline(wide, fp8):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon weight-only kernel needs an sm_90 GPU (wgmma)")
    dtype = str(WIDE[wide]).split(".")[1]
    torch.manual_seed(3)
    for m, n, k in ((300, 520, 1040), (64, 200, 4096), (1000, 1100, 112)):
        a, b, scale, bias = tensors(m, n, k, WIDE[wide], FP8[fp8], "col", "cuda")
        residual = torch.randn(m, n, device="cuda").to(WIDE[wide])
        ops_ = {"scale": scale, "bias": bias, "residual": residual}
        problem = make_weight_only_problem(a, b, _scaled_gelu_residual(dtype), ops_)
        for config in (
            TWO,
            THREE,
            Config(64, 128, 128, 8, num_warps=4, num_stages=4, variant=W),
            Config(128, 128, 64, 1, num_warps=4, num_stages=2, variant=W),
        ):
            outs = checked_launch(problem, config, a, b, ops_).outs
            base = KIND.baseline(problem, a, b, ops_)
            assert rel_error(outs[0], base[0].to(outs[0].dtype)) <= 2 * tolerance(dtype, "ieee", dtype), (
                (m, n, k),
                config.short(),
            )


@pytest.mark.gpu
@pytest.mark.parametrize("wide", list(WIDE))
def test_gpu_dual_matches_float64(wide):
    """Both loops: the step loop (bf16 A) and the K-block loop (fp16 A)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon weight-only kernel needs an sm_90 GPU (wgmma)")
    torch.manual_seed(5)
    for m, n, k in ((300, 520, 1040), (64, 200, 4096), (1000, 1100, 112)):
        problem, a, w1, w3, ops_ = dual_swiglu(m, n, k, WIDE[wide])
        for config in (
            Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant=W),
            Config(64, 192, 64, 8, num_warps=4, num_stages=4, variant=W),
            Config(64, 128, 128, 1, num_warps=4, num_stages=2, variant=W),
            PAIRED,  # the paired form: a warp group a weight, the halves swapped
            Config(128, 64, 128, 1, num_warps=4, num_stages=3, variant=W),
            Config(64, 64, 64, 8, num_warps=4, num_stages=2, variant=W),
        ):
            checked_launch(problem, config, a, w1.t(), {"b2": w3.t(), **ops_})
