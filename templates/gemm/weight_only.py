"""The weight-only fp8 matmul: a float16 or bfloat16 A times an fp8 B (a weight stored in fp8).

    C[m, n] = epilogue(sum_k A[m, k] * float(B[k, n]))

A [M, K] is float16 or bfloat16 (activations), B [K, N] float8_e4m3fn or float8_e5m2 (a
linear layer's [N, K] weight transposed, any strides). The K loop loads B's fp8 tile (half
the bytes of a 16-bit weight: what decode-time GEMMs, bound by reading the weight, gain) and
converts it to A's dtype, which is exact for both fp8 formats, before a 16-bit dot that adds
into fp32. The weight's scales (one per output channel, or one for the tensor) are epilogue
operands as every other: ``acc * scale[n]``, then bias, activation, residual, casts.

This is what ``mm(x, (w8.to(dtype) * scale).t())`` computes (torchao's
``Float8WeightOnlyConfig``): the compiler rewrites that graph to this problem
(``compiler/match.py``). The graph rounds each dequantized weight to A's dtype before
the GEMM; the kernel scales the fp32 sum instead, which is nearer the float64 product of the
dequantized weight. The problem's ``dtype`` is A's; its ``WeightGeometry`` holds B's. The
baseline converts B to A's dtype (one pointwise kernel) and runs cuBLAS, then the epilogue in
eager torch: what the graph runs unfused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem
from epilab.templates.gemm import matmul, matmul_config, matmul_sm90
from epilab.templates.gemm.matmul import FILES, bind_matmul, make_problem
from epilab.templates.gemm.matmul_reference import matmul_inputs
from epilab.templates.gemm.ops import WEIGHT_ONLY_OP
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES, WeightGeometry, weight_dtype

OP = WEIGHT_ONLY_OP
KIND_NAME = "weight_only_matmul"
GLUON_BLOCK_N = 192  # the Gluon kernel's three warp groups of 64 weight rows; not a power of two


def make_weight_only_problem(
    a: torch.Tensor, b: torch.Tensor, epilogue: Epilogue, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The weight-only problem of these tensors (checks them all)."""
    geometry = WeightGeometry(dtypes.name_of(b.dtype))
    return make_problem(a, b, epilogue, operands, op=OP, template=KIND_NAME, files=FILES, geometry=geometry)


def problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    return make_weight_only_problem(a, b, problem.epilogue, operands)


def problem_error(problem: Problem) -> str | None:
    if problem.dtype not in WEIGHT_ONLY_DTYPES or problem.precision != "ieee":
        return (
            f"a weight-only problem's A is {' or '.join(WEIGHT_ONLY_DTYPES)} (its dots add in fp32), "
            f"not {problem.dtype} ({problem.precision})"
        )
    return None


def config_error(problem: Problem, config: Config) -> str | None:
    """The matmul's Triton loops, 2-D; TMA rows of B 16-byte aligned in fp8."""
    s = problem.shape
    if problem.op != OP or s.batch != 1:
        return f"the weight-only template takes 2-D {OP} problems, got a {problem.op} of batch {s.batch}"
    return weight_error(problem, config) or matmul_config.loop_error(problem, config)


def weight_error(problem: Problem, config: Config) -> str | None:
    """What an fp8 B asks of a config: a Triton loop or the Gluon weight-only kernel (the other
    Gluon variants read one dtype), TMA rows 16-byte aligned in fp8."""
    s = problem.shape
    if config.variant in matmul_sm90.SAME_DTYPE_VARIANTS:
        return (
            f"the {config.variant} variant reads A and B of one dtype; weight-only runs on the Triton "
            f"loops and {matmul_sm90.WEIGHT_ONLY}"
        )
    if config.variant in matmul_config.TMA_VARIANTS:
        rows = s.n if problem.layout_b == "row" else s.k
        if (
            isinstance(rows, int)
            and rows * dtypes.itemsize(weight_dtype(problem)) % matmul_config.TMA_ALIGN_BYTES
        ):
            return f"the tma variants need 16-byte aligned rows; B's rows of {rows} fp8 elements are not"
    return None


def weight_only_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, fp8 B (normal values, rounded) and operands of the problem."""
    return matmul_inputs(problem, device, gen, b_dtype=dtypes.torch_dtype(weight_dtype(problem)))


def eager_weight_only(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """B converted to A's dtype, cuBLAS, then the epilogue in eager torch."""
    return tuple(problem.epilogue.evaluate(a @ b.to(a.dtype), dict(operands)))


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    """The Triton types B's fp8 tile is converted through after each load, ending at A's: a
    bf16 A's through fp16, which holds every e4m3 and e5m2 value (NaN and inf too) and whose
    conversion to bf16 is exact; the direct fp8-to-bf16 conversion ran the main loop 14-21%
    slower (H200, RESULTS.md)."""
    via = ["tl.float16"] if problem.dtype == "bfloat16" else []
    gluon = matmul_sm90.render_vars(problem, config) if config.variant == matmul_sm90.WEIGHT_ONLY else {}
    return {
        **gluon,
        "b_convert": "".join(f".to({t})" for t in (*via, dtypes.TABLE[problem.dtype].triton)),
        "swap_ab": bool(config.SWAP_AB),
    }


# the weight-only kinds' space: the matmul's Triton loops and the Gluon weight-only kernel (its
# BLOCK_N of 192: three warp groups of 64 weight rows), and SWAP_AB (the weight the Triton
# dot's left operand)
SPACE = {
    **matmul.SPACE,
    "BLOCK_N": (*matmul.SPACE["BLOCK_N"], GLUON_BLOCK_N),
    "variant": (*matmul_config.TRITON_VARIANTS, matmul_sm90.WEIGHT_ONLY),
    "SWAP_AB": (0, 1),
}

SEEDS = [  # decode (a few rows: the weight's bytes bound it), then prefill tiles of the 16-bit loops
    Config(16, 64, 256, 1, num_warps=4, num_stages=4),
    Config(16, 128, 128, 1, num_warps=4, num_stages=4),
    Config(16, 64, 128, 1, 4, num_warps=4, num_stages=4),
    Config(32, 64, 128, 1, num_warps=4, num_stages=4, variant="tma"),
    # Hopper: the Gluon kernel (the weight wgmma's left operand, converted a K step ahead), the
    # fastest of a sweep (benchmarks/RESULTS.md) on 7 of Llama-3-8B's 8 single
    # projections at M = 128 and 2048 on an H200 (RESULTS.md, 2026-11-30 second; 0.98x the
    # Triton loop at 128x28672x4096); the swapped Triton loops it beat are left to the search
    Config(256, 128, 64, 8, num_warps=4, num_stages=4, variant=matmul_sm90.WEIGHT_ONLY),
    Config(256, 128, 64, 8, num_warps=4, num_stages=3, variant=matmul_sm90.WEIGHT_ONLY),
    Config(64, 128, 128, 8, num_warps=4, num_stages=4, variant=matmul_sm90.WEIGHT_ONLY),
    Config(128, 128, 64, 8, num_warps=4, num_stages=6, variant=matmul_sm90.WEIGHT_ONLY),
    *(c for c in matmul.SEEDS if c.variant not in matmul_sm90.VARIANTS),
]

KIND = dataclasses.replace(  # the matmul's space, output layout and applies; B in fp8
    matmul.KIND,
    name=KIND_NAME,
    ops=(OP,),
    seeds=tuple(SEEDS),
    space=SPACE,
    dtype_seeds=(),
    check=config_error,
    problem_error=problem_error,
    problem_of=problem_of,
    bind=lambda problem, config, a, b, operands, out=None: bind_matmul(
        problem, config, a, b, operands, out, kind=KIND
    ),
    inputs=weight_only_inputs,
    baseline=eager_weight_only,
    b_dtype=weight_dtype,
    render_vars=render_vars,
    source=matmul.source,
    input_dtypes=WEIGHT_ONLY_DTYPES,
    geometry=WeightGeometry,
    reductions=True,
)
