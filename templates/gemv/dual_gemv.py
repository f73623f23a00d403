"""The dual GEMV template: a gated MLP's gate and up projections at decode (M <= 16).

    C[m, n] = epilogue(sum_k A[m, k] * B[k, n], sum_k A[m, k] * B2[k, n], operands)

The gemv template's kernel (``gemv.py.jinja`` rendered with ``dual``): each program streams
a BLOCK_K x BLOCK_N slab of B and of B2 while A's few rows stay in cache, with the gemv's
split-K reductions (two-pass workspaces and atomic sums hold both accumulators). One launch
replaces two GEMVs and the join, and A is read once. It runs the dual problems of M <= 16
(``dual_matmul``'s twins) and is preferred untuned, as the gemv is for skinny matmuls.
"""

from __future__ import annotations

import dataclasses

from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates.gemm import dual_matmul
from epilab.templates.gemv import gemv
from epilab.templates.gemv.gemv import bind_gemv, split_k_error
from epilab.templates.runtime.render import kernel_hash


def config_error(problem: Problem, config: Config) -> str | None:
    """The gemv template's rules, for dual problems of a static M <= 16."""
    m = problem.shape.m
    if problem.op != dual_matmul.OP:
        return f"the dual GEMV takes {dual_matmul.OP} problems, got {problem.op}"
    if not (isinstance(m, int) and m <= gemv.BLOCK_M):
        return f"the dual GEMV takes a static M <= {gemv.BLOCK_M}, got M={m}"
    return gemv.loop_error(problem, config)


NAME = "dual_gemv"


def dual_twins(problem: Problem) -> tuple[Problem, ...]:
    """A dual problem of a static M <= 16 on the dual GEMV (the dual GEMM's twin, as the gemv
    is the matmul's: this kind, not the dual GEMM's, says which of its problems it runs)."""
    m = problem.shape.m
    if problem.template != "dual_matmul" or not (isinstance(m, int) and m <= gemv.BLOCK_M):
        return ()
    return (
        dataclasses.replace(problem, template=NAME, template_hash=kernel_hash(gemv.FILES, problem.epilogue)),
    )


def dual_gemv_search_error(problem: Problem, config: Config) -> str | None:
    return split_k_error(problem, config)


SEEDS = [  # the gemv's, with narrower column tiles (two B slabs per step)
    Config(16, 64, 128, 1, 1, num_warps=4, num_stages=3),
    Config(16, 64, 128, 1, 4, num_warps=4, num_stages=3, variant="two_pass"),
    Config(16, 32, 256, 1, 8, num_warps=4, num_stages=3, variant="two_pass"),
    Config(16, 32, 128, 1, 16, num_warps=4, num_stages=4, variant="two_pass"),
]

KIND = dataclasses.replace(  # the gemv's space and heuristic; the dual GEMM's tensors
    dual_matmul.KIND,
    name=NAME,
    files=gemv.FILES,
    ops=(),  # it runs the dual problems it takes (dual_matmul's twins)
    takes=dual_matmul.KIND.ops,
    space=gemv.SPACE,
    seeds=tuple(SEEDS),
    check=config_error,
    default_config=gemv.default_gemv_config,
    kernel_shape=lambda problem: problem.shape,
    problem_of=dual_matmul.problem_of_on(NAME, gemv.FILES),
    bind=lambda problem, config, a, b, operands, out=None: bind_gemv(
        problem, config, a, b, operands, out, kind=KIND
    ),
    search_error=dual_gemv_search_error,
    applies=lambda name, chosen: True,
    twins=dual_twins,
    prefer_untuned=True,
    split_k_underfilled=gemv.KIND.split_k_underfilled,
    reductions=True,
    groups=False,  # as the gemv's
)
