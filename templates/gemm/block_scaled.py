"""The block-scaled fp8 matmul (DeepSeek-V3's, transformers' ``FineGrainedFP8Config``).

    C[m, n] = epilogue(sum_g a_scales[m, g] * b_scales[g, n // 128] * sum_{k in g} A[m, k] B[k, n])

over the groups g of 128 elements of K. A [M, K] and B [K, N] are fp8 (float8_e4m3fn or
float8_e5m2, one dtype); ``a_scales`` is float32 [M, ceil(K/128)] (one scale a row and group:
the per-token-group quantization of activations) and ``b_scales`` float32
[ceil(K/128), ceil(N/128)] (one a 128x128 block of B: the weight's), any strides; their shapes
are those ``torch._scaled_mm`` takes for block scaling. The scales multiply inside the K
loop, each group's sum before it is added in fp32, so every problem accumulates exactly (one
promotion a group at least: BLOCK_K x PROMOTE divides 128). What follows the accumulator is
the epilogue as for every matmul (bias, activation, residual, several outputs, fp8 outputs
saturating).

The kernel is the matmul template's (``matmul.py.jinja`` rendered with ``block_scaled``) on
its Triton loops (classic, TMA, persistent, split-K, stream-K); 2-D only. Calls pass the
scales in ``operands`` under ``"a_scales"`` and ``"b_scales"`` (the kind's problem inputs),
beside the epilogue's operands. The baseline is ``torch._scaled_mm`` with block scales
(cuBLASLt; sm_90, CUDA 12.9 or newer) and the epilogue in eager torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem
from epilab.templates.gemm import matmul, matmul_config, matmul_sm90
from epilab.templates.gemm.matmul import FILES, bind_matmul, make_problem
from epilab.templates.gemm.matmul_reference import matmul_inputs
from epilab.templates.gemm.ops import BLOCK_SCALED_OP
from epilab.templates.runtime.render import Target

OP = BLOCK_SCALED_OP
GROUP = 128  # elements of K (and of N, for B) a scale covers
A_SCALES, B_SCALES = "a_scales", "b_scales"  # their names in a call's operands
SCALES = (A_SCALES, B_SCALES)


def scale_shapes(m: int, n: int, k: int) -> dict[str, tuple[int, int]]:
    """The shapes of the scales of an M x N x K problem."""
    groups = triton.cdiv(k, GROUP)
    return {A_SCALES: (m, groups), B_SCALES: (groups, triton.cdiv(n, GROUP))}


def check_scales(a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, object]) -> None:
    """Refuse scales that are not float32 tensors of ``scale_shapes`` on A's device."""
    if a.dim() != 2 or b.dim() != 2:
        shapes = f"{tuple(a.shape)} and {tuple(b.shape)}"
        raise ValueError(f"a block-scaled matmul takes 2-D A and B, got {shapes}")
    if dtypes.name_of(a.dtype) not in dtypes.FP8_DTYPES:
        raise TypeError(f"block scales apply to fp8 inputs ({', '.join(dtypes.FP8_DTYPES)}), not {a.dtype}")
    (m, k), n = a.shape, b.shape[1]
    for name, shape in scale_shapes(m, n, k).items():
        t = operands.get(name)
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"a block-scaled call passes {name} (float32 {list(shape)}) in operands")
        what = f"one scale per {'row and 128 of K' if name == A_SCALES else '128x128 block of B'}"
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 ({what}, as torch._scaled_mm takes it), got {t.dtype}")
        if tuple(t.shape) != shape or t.device != a.device:
            raise ValueError(
                f"{name} must be float32 of shape {list(shape)} on {a.device} ({what}), "
                f"got {list(t.shape)} on {t.device}"
            )


def make_block_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
) -> Problem:
    """The block-scaled problem of these tensors (checks them all): ``operands`` hold the
    scales and the epilogue's operands."""
    check_scales(a, b, operands)
    rest = epilogue_operands(operands)
    if set(SCALES) & {name for name, _ in epilogue.operands}:
        raise ValueError(f"an epilogue operand may not be named {A_SCALES!r} or {B_SCALES!r} here")
    return make_problem(a, b, epilogue, rest, op=OP, template=KIND_NAME, files=FILES)


def problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    return make_block_problem(a, b, problem.epilogue, operands)


def config_error(problem: Problem, config: Config) -> str | None:
    """The matmul's loops, 2-D, each promotion within one group of the scales."""
    if problem.op != OP or problem.shape.batch != 1:
        got = f"a {problem.op} of batch {problem.shape.batch}"
        return f"the block-scaled template takes 2-D {OP} problems, got {got}"
    if config.variant in matmul_sm90.VARIANTS and config.variant != matmul_sm90.COOPERATIVE:
        return (
            f"the {config.variant} variant has no block scales; block-scaled GEMMs run on the Triton "
            f"loops and {matmul_sm90.COOPERATIVE}"
        )
    if GROUP % (config.BLOCK_K * config.PROMOTE):
        return (
            f"block scales change every {GROUP} elements of K: BLOCK_K x PROMOTE must divide {GROUP}, "
            f"got {config.BLOCK_K} x {config.PROMOTE}"
        )
    return matmul_config.loop_error(problem, config)


def problem_error(problem: Problem) -> str | None:
    if problem.dtype not in dtypes.FP8_DTYPES or problem.precision != "ieee":
        return (
            f"a block-scaled problem has fp8 inputs and exact accumulation, "
            f"not {problem.dtype} ({problem.precision})"
        )
    return None


def loop_args(operands: Mapping[str, torch.Tensor]) -> dict[str, object]:
    """The scales as the kernel reads them: pointers and strides."""
    sa, sb = operands[A_SCALES], operands[B_SCALES]
    return {
        "a_scales_ptr": sa,
        "b_scales_ptr": sb,
        "stride_sam": sa.stride(0),
        "stride_sak": sa.stride(1),
        "stride_sbk": sb.stride(0),
        "stride_sbn": sb.stride(1),
    }


def epilogue_operands(operands: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A call's operands less the scales."""
    return {name: t for name, t in operands.items() if name not in SCALES}


def block_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, B, operands of the problem, and its scales (in ``operands``): positive,
    from 1/32 to 5/32."""
    a, b, operands = matmul_inputs(problem, device, gen)
    s = problem.shape
    for name, shape in scale_shapes(int(s.m), int(s.n), int(s.k)).items():
        operands[name] = (torch.rand(shape, generator=gen, device=device) + 0.25) / 8
    return a, b, operands


def dequantized(
    a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B times their scales, in ``dtype``."""
    k, n = b.shape
    sa = operands[A_SCALES].to(dtype).repeat_interleave(GROUP, 1)[:, :k]
    sb = operands[B_SCALES].to(dtype).repeat_interleave(GROUP, 0).repeat_interleave(GROUP, 1)[:k, :n]
    return a.to(dtype) * sa, b.to(dtype) * sb


def block_reference(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs in float64 (the dequantized inputs are exact there), before output rounding."""
    a64, b64 = dequantized(a, b, operands, torch.float64)
    rest = {name: t.double() for name, t in epilogue_operands(operands).items()}
    return problem.epilogue.evaluate(a64 @ b64, rest)


CUBLASLT_GROUPS = 4  # torch 2.11's block scaling is right only for ceil(K/128) a multiple of this


def cublaslt_layouts(operands: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``operands`` with the scales copied into the layouts cuBLASLt's block scaling takes: A's
    M-major ([M, K/128] with stride (1, M)), B's K-major; a no-op where they are already so."""
    return {
        **operands,
        A_SCALES: operands[A_SCALES].t().contiguous().t(),
        B_SCALES: operands[B_SCALES].t().contiguous().t(),
    }


def scaled_mm_blocks(a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``torch._scaled_mm`` with block scales (cuBLASLt, sm_90; A row-major, B column-major, the
    scales as ``cublaslt_layouts`` lays them out, copied first where they are not: time it on
    operands laid out beforehand), bf16 out. With torch 2.11 on an H200 its result is wrong
    (every column after the first 128, some inf) when ceil(K/128) is not a multiple of 4, and
    scales with padded strides are refused (RESULTS.md, issue 44): there A and B are
    dequantized to bf16 for cuBLAS's bf16 GEMM instead."""
    if triton.cdiv(a.shape[1], GROUP) % CUBLASLT_GROUPS:
        a16, b16 = dequantized(a, b, operands, torch.bfloat16)
        return a16 @ b16
    laid = cublaslt_layouts(operands)
    return torch._scaled_mm(
        a.contiguous(), b.t().contiguous().t(), laid[A_SCALES], laid[B_SCALES], out_dtype=torch.bfloat16
    )


def eager_block_scaled(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """``scaled_mm_blocks``, then the epilogue in eager torch."""
    return tuple(problem.epilogue.evaluate(scaled_mm_blocks(a, b, operands), epilogue_operands(operands)))


def block_input_elements(problem: Problem) -> tuple[int, int]:
    """A and its scales; B and its scales."""
    s = problem.shape
    m, n, k = int(s.m), int(s.n), int(s.k)
    shapes = scale_shapes(m, n, k)
    (am, ak), (bk, bn) = shapes[A_SCALES], shapes[B_SCALES]
    return m * k + am * ak, k * n + bk * bn


def default_block_config(
    problem: Problem, target: Target = "cuda", *, sm_count: int = matmul.H100_SMS
) -> Config:
    """The matmul's heuristic, with BLOCK_K at most one group of the scales."""
    c = matmul.default_matmul_config(problem, target, sm_count=sm_count)
    return dataclasses.replace(c, BLOCK_K=min(c.BLOCK_K, GROUP))


def sm90_default(problem: Problem, config: Config, capability: str, sm_count: int) -> Config:
    """Untuned on an sm_90 GPU: the cooperative kernel where its tiles fill the GPU, 4-6x the
    heuristic's Triton loop on DeepSeek-V3's shapes at M = 4096 (RESULTS.md 2026-11-28
    night); fewer tiles (M = 128: 0.82-0.90x the loop) keep the heuristic."""
    return matmul_sm90.cooperative_default(KIND, problem, config, capability, sm_count, SEEDS)


def scales_of(problem: Problem) -> tuple[str, ...]:
    return SCALES


SEEDS = [  # fp8 tiles with one K block (or two, PROMOTE=2) a group of the scales
    # sm_90: warp groups scaling and adding their K block's sum while the others' MMAs run,
    # outputs by TMA: the best of benchmarks/fp8.py on DeepSeek-V3's shapes (H200, RESULTS.md)
    Config(192, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(192, 128, 128, 16, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(192, 128, 128, 16, num_warps=4, num_stages=4, variant="sm90_cooperative"),
    Config(128, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative", TMA_STORE=1),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(128, 256, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", EPILOGUE_SUBTILE=2),
    Config(128, 128, 64, 8, num_warps=8, num_stages=5, variant="tma_persistent", FLATTEN=1, PROMOTE=2),
    Config(64, 128, 128, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(16, 64, 128, 8, num_warps=4, num_stages=4),
    Config(64, 128, 128, 8, 4, num_warps=4, num_stages=4),  # few tiles, long K: split-K
]

KIND_NAME = "block_scaled_matmul"
KIND = dataclasses.replace(  # the matmul's space, output layout and applies; its own tensors
    matmul.KIND,
    name=KIND_NAME,
    ops=(OP,),
    seeds=tuple(SEEDS),
    dtype_seeds=(),
    check=config_error,
    problem_error=problem_error,
    default_config=default_block_config,
    device_default=sm90_default,
    problem_of=problem_of,
    bind=lambda problem, config, a, b, operands, out=None: bind_matmul(
        problem, config, a, b, epilogue_operands(operands), out, kind=KIND, loop_args=loop_args(operands)
    ),
    inputs=block_inputs,
    reference=block_reference,
    baseline=eager_block_scaled,
    baseline_layouts=cublaslt_layouts,
    input_elements=block_input_elements,
    problem_inputs=scales_of,
    render_vars=lambda problem, config: {**matmul.render_vars(problem, config), "block_scaled": True},
    source=matmul.source,
    input_dtypes=dtypes.FP8_DTYPES,
    reductions=True,
)
