"""The weight-only fp8 GEMVs: decode-time (M <= 16) weight-only problems on the gemv kernel.

    C[m, n] = epilogue(sum_k A[m, k] * float(B[k, n]))                      weight_only_gemv
    C[m, n] = epilogue(sum_k A[m, k] * float(B[k, n]), ... float(B2[k, n]))  dual_weight_only_gemv

The gemv template's kernel (``gemv.py.jinja``: each program streams a BLOCK_K x BLOCK_N slab of
the weight while A's few rows stay in cache, split-K over the K blocks) with the weight-only
main loop's conversion (``weight_only.render_vars``): each fp8 slab is converted to A's dtype
after its load, exactly. At decode a weight-only GEMM is bound by reading the weight, and its
bytes are half a 16-bit weight's. Measured (H200, RESULTS.md 2026-11-28 evening): tuned, the GEMV
reads them at up to 85% of the copy bandwidth, 0.99-1.05x the tuned weight-only matmul alone and
1.12-1.17x it dual (silu-gate); untuned, its heuristic runs 1.3-3.8x the matmul's default.

These kinds make no problems of their own: they run the weight-only problems of a static
M <= 16 (their twins, made by ``twins``): the tuner tunes them beside the weight-only matmuls
and records whichever is faster; a compiled model's untuned calls run the GEMV (``prefer_untuned``).
The transposed case (a small N with a large M), which the gemv runs as
C.T = B.T @ A.T, is not taken: there B would be the 16-bit operand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates.gemm import dual_weight_only, weight_only
from epilab.templates.gemm.ops import DUAL_WEIGHT_ONLY_OP, WEIGHT_ONLY_OP
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES, WeightGeometry, weight_dtype
from epilab.templates.gemv import dual_gemv, gemv
from epilab.templates.gemv.gemv import bind_gemv, split_k_error
from epilab.templates.runtime.render import kernel_hash

KIND_NAME = "weight_only_gemv"
DUAL_KIND_NAME = "dual_weight_only_gemv"
_ON = {WEIGHT_ONLY_OP: KIND_NAME, DUAL_WEIGHT_ONLY_OP: DUAL_KIND_NAME}


def config_error(problem: Problem, config: Config) -> str | None:
    """The gemv kernel's rules, for weight-only problems of a static M <= 16."""
    m = problem.shape.m
    if problem.op not in _ON:
        return f"the weight-only GEMVs take {' and '.join(_ON)} problems, got {problem.op}"
    if not (isinstance(m, int) and m <= gemv.BLOCK_M) or problem.shape.batch != 1:
        return f"the weight-only GEMVs take 2-D problems of a static M <= {gemv.BLOCK_M}, got {problem.shape}"
    return gemv.loop_error(problem, config)


def on_gemv(problem: Problem) -> Problem:
    """The weight-only ``problem`` on its GEMV kind."""
    made = kernel_hash(gemv.FILES, problem.epilogue)
    return dataclasses.replace(problem, template=_ON[problem.op], template_hash=made)


def twins(problem: Problem) -> tuple[Problem, ...]:
    """A weight-only matmul problem's GEMV twin, where its M is static and at most 16."""
    m = problem.shape.m
    small = isinstance(m, int) and m <= gemv.BLOCK_M and problem.shape.batch == 1
    ours = problem.template in (weight_only.KIND_NAME, dual_weight_only.KIND_NAME)
    return (on_gemv(problem),) if small and ours else ()


def problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The problem these tensors make, on this kind (the weight-only matmul's, moved here)."""
    made = weight_only.problem_of if problem.op == WEIGHT_ONLY_OP else dual_weight_only.problem_of
    return on_gemv(made(problem, a, b, operands))


SEEDS = [  # the gemv's: fp8 slabs are half as many bytes, so wider K steps come first
    Config(16, 64, 256, 1, 1, num_warps=4, num_stages=3),
    Config(16, 64, 256, 1, 4, num_warps=4, num_stages=3, variant="two_pass"),
    *gemv.SEEDS,
]

_COMMON = {
    "ops": (),  # they run the weight-only problems they take (the weight-only matmuls' twins)
    "space": gemv.SPACE,
    "seeds": tuple(SEEDS),
    "check": config_error,
    "default_config": gemv.default_gemv_config,
    "kernel_shape": lambda problem: problem.shape,
    "problem_of": problem_of,
    "search_error": split_k_error,
    "applies": lambda name, chosen: True,
    "prefer_untuned": True,  # its heuristic runs 1.3-3.8x the weight-only matmul's at decode (H200)
    "split_k_underfilled": gemv.KIND.split_k_underfilled,
    "reductions": True,
    "groups": False,  # as the gemv's
    "render_vars": weight_only.render_vars,
    "input_dtypes": WEIGHT_ONLY_DTYPES,
    "geometry": WeightGeometry,
    "problem_error": weight_only.problem_error,
    "b_dtype": weight_dtype,
}

KIND = dataclasses.replace(  # the weight-only matmul's tensors, inputs and baseline; the gemv's kernel
    weight_only.KIND,
    name=KIND_NAME,
    files=gemv.FILES,
    takes=(WEIGHT_ONLY_OP,),
    twins=twins,  # asked of every problem (registry.twins): it makes both kinds' twins
    bind=lambda problem, config, a, b, operands, out=None: bind_gemv(
        problem, config, a, b, operands, out, kind=KIND
    ),
    **_COMMON,
)

DUAL_KIND = dataclasses.replace(  # the dual weight-only's tensors (B2 in operands); the dual GEMV's kernel
    dual_weight_only.KIND,
    name=DUAL_KIND_NAME,
    files=gemv.FILES,
    takes=(DUAL_WEIGHT_ONLY_OP,),
    twins=lambda problem: (),
    bind=lambda problem, config, a, b, operands, out=None: bind_gemv(
        problem, config, a, b, operands, out, kind=DUAL_KIND
    ),
    **{**_COMMON, "seeds": (*SEEDS[:2], *dual_gemv.SEEDS)},
)
