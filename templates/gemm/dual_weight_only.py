"""The dual weight-only fp8 matmul: a gated MLP's gate and up projections of fp8 weights.

    C[m, n] = epilogue(sum_k A[m, k] * float(B[k, n]), sum_k A[m, k] * float(B2[k, n]))

The dual template (``dual_matmul.py``: each A tile loaded once for both dots) with the
weight-only kind's main loop (``weight_only.py``): A float16 or bfloat16, B and B2 fp8 of one
dtype, shape and strides, each fp8 tile converted to A's dtype after its load. The weights'
scales are epilogue operands (``acc * weight_scale[n]``, ``acc2 * weight_scale2[n]``), so a
SwiGLU of torchao weight-only linears, ``silu(x @ dq(w1).T) * (x @ dq(w3).T)``, is one kernel
that reads each weight's bytes once and writes no 16-bit weight. Problem op
``dual_weight_only_mm``, 2-D; calls pass B2 in ``operands`` under ``"b2"``. The baseline
converts both weights, runs cuBLAS twice and the join in eager torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem
from epilab.templates.gemm import dual_matmul, matmul, matmul_config, matmul_sm90, weight_only
from epilab.templates.gemm.dual_matmul import B2, check_b2
from epilab.templates.gemm.matmul import FILES, bind_matmul, make_problem
from epilab.templates.gemm.ops import DUAL_WEIGHT_ONLY_OP
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES, WeightGeometry, weight_dtype
from epilab.templates.gemm.weight_only import weight_error

OP = DUAL_WEIGHT_ONLY_OP
KIND_NAME = "dual_weight_only_matmul"


def make_dual_weight_only_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    b2: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
) -> Problem:
    """The problem of these tensors (checks them all); ``operands`` are the epilogue's."""
    if B2 in operands:
        raise ValueError(f"an epilogue operand may not be named {B2!r} in a dual GEMM (its second weight is)")
    check_b2(a, b, b2)
    geometry = WeightGeometry(dtypes.name_of(b.dtype))
    return make_problem(a, b, epilogue, operands, op=OP, template=KIND_NAME, files=FILES, geometry=geometry)


def problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    b2, rest = dual_matmul.split_b2(operands)
    return make_dual_weight_only_problem(a, b, b2, problem.epilogue, rest)


def config_error(problem: Problem, config: Config) -> str | None:
    s = problem.shape
    if problem.op != OP or s.batch != 1:
        return f"the dual weight-only template takes 2-D {OP} problems, got a {problem.op} of batch {s.batch}"
    return weight_error(problem, config) or matmul_config.loop_error(problem, config)


def inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, fp8 B and B2 (B2 strided as B, in ``operands``) and the epilogue's operands."""
    return dual_matmul.dual_inputs(problem, device, gen, b_dtype=dtypes.torch_dtype(weight_dtype(problem)))


def eager(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Both weights converted to A's dtype, cuBLAS twice, the join in eager torch."""
    b2, rest = dual_matmul.split_b2(operands)
    return tuple(problem.epilogue.evaluate(a @ b.to(a.dtype), rest, acc2=a @ b2.to(a.dtype)))


SEEDS = [  # decode tiles first (the two weights' bytes bound it), then the dual's own
    Config(16, 64, 256, 1, num_warps=4, num_stages=4),
    Config(16, 64, 128, 1, 4, num_warps=4, num_stages=4),
    # prefill on Hopper: the Gluon kernel paired (BLOCK_N 64: a warp group a weight, 256 tokens;
    # H200's best at M = 2048), then with both weights on each warp group (two accumulators:
    # BLOCK_M 128 at most; its best at M = 128), then the Triton loops with the weights'
    # converted tiles on the dots' left (RESULTS.md, 2026-11-30 fourth)
    Config(256, 64, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=6, variant="sm90_weight_only"),
    Config(256, 64, 64, 8, num_warps=4, num_stages=3, variant="sm90_weight_only"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_weight_only"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma", SWAP_AB=1),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma", SWAP_AB=1),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, SWAP_AB=1),
    *dual_matmul.SEEDS,
]

KIND = dataclasses.replace(  # the dual's tensors and space, weight-only's main loop
    dual_matmul.KIND,
    name=KIND_NAME,
    ops=(OP,),
    seeds=tuple(SEEDS),
    space={**dual_matmul.KIND.space, **{k: weight_only.SPACE[k] for k in ("BLOCK_N", "variant", "SWAP_AB")}},
    source=matmul.source,
    check=config_error,
    problem_of=problem_of,
    bind=lambda problem, config, a, b, operands, out=None: bind_matmul(
        problem, config, a, b, operands, out, kind=KIND
    ),
    inputs=inputs,
    baseline=eager,
    twins=lambda problem: (),
    render_vars=weight_only.render_vars,
    input_dtypes=WEIGHT_ONLY_DTYPES,
    geometry=WeightGeometry,
    problem_error=weight_only.problem_error,
    b_dtype=weight_dtype,
    exchange_smem=matmul_sm90.exchange_bytes,
)
