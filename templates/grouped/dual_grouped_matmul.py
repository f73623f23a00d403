"""The dual grouped GEMM: every expert's gate and up projections in one kernel.

    C[m, n] = epilogue(sum_k A[m, k] * B[e, k, n], sum_k A[m, k] * B2[e, k, n], operands)

for the rows m of expert e, as the grouped template (``grouped_matmul.py``) has them, with a
second accumulator (``silu(acc) * acc2`` is an MoE's SwiGLU). The kernel is
``grouped_matmul.py.jinja`` rendered with ``dual`` on: each A tile is loaded once for both
dots, and neither [T, N] half is written or read back. B and B2 are two ``[E, K, N]`` tensors
of one shape and one set of strides; calls pass B2 in ``operands`` under ``"b2"`` beside the
offsets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem
from epilab.templates.gemm.matmul import H100_SMS
from epilab.templates.gemm.matmul_config import idle_threads_error
from epilab.templates.grouped import grouped_matmul, grouped_reference
from epilab.templates.grouped.grouped_geometry import GATHER, SCATTER
from epilab.templates.grouped.grouped_matmul import (
    FILES,
    OFFS,
    bind_grouped,
    make_grouped_problem,
    routing_of,
)
from epilab.templates.runtime.render import Target

OP = "dual_grouped_mm"
B2 = "b2"  # the name of the second weight in a call's operands


def make_dual_grouped_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    b2: object,
    offs: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
    **routing: Any,
) -> Problem:
    """The dual grouped problem of these tensors (checks them all; ``routing``: the indices
    and combine ``make_grouped_problem`` takes)."""
    taken = [name for name in (B2, OFFS, GATHER, SCATTER) if name in operands]
    if taken:
        raise ValueError(f"an epilogue operand may not be named {taken[0]!r} in a dual grouped GEMM")
    if not isinstance(b2, torch.Tensor):
        raise TypeError(f"b2 must be a torch.Tensor, got {type(b2).__name__}")
    if b2.shape != b.shape or b2.stride() != b.stride() or b2.dtype != b.dtype or b2.device != b.device:
        raise ValueError(
            "b2 must have b's shape, strides, dtype and device (one kernel reads both alike): b is "
            f"{b.dtype} {tuple(b.shape)} strides {b.stride()}, "
            f"b2 {b2.dtype} {tuple(b2.shape)} strides {b2.stride()}"
        )
    return make_grouped_problem(a, b, offs, epilogue, operands, op=OP, template=KIND.name, **routing)


def dual_grouped_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    for name in (OFFS, B2):
        if name not in operands:
            raise ValueError(f"a dual grouped GEMM's call passes operands[{name!r}]")
    rest = {name: t for name, t in operands.items() if name not in KIND.inputs_of(problem)}
    return make_dual_grouped_problem(
        a, b, operands[B2], operands[OFFS], problem.epilogue, rest, **routing_of(problem, operands)
    )


def default_dual_grouped_config(
    problem: Problem, target: Target = "cuda", *, sm_count: int = H100_SMS
) -> Config:
    """The grouped heuristic with two accumulators (fewer registers a thread: more warps)."""
    return grouped_matmul.default_grouped_config(problem, target, sm_count=sm_count, accumulators=2)


def dual_grouped_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The grouped inputs, and B2 strided as B."""
    a, b, operands = grouped_reference.grouped_inputs(problem, device, gen)
    b2 = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device=device)
    b2.copy_(torch.randn(b.shape, generator=gen, device=device).to(b.dtype))
    return a, b, {B2: b2, **operands}


def dual_grouped_input_elements(problem: Problem) -> tuple[int, int]:
    a, b = grouped_matmul.grouped_input_elements(problem)
    return a, 2 * b


SEEDS = (  # two accumulators: 128x128 tiles with 8 warps at most
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(128, 64, 64, 8, num_warps=4, num_stages=4, variant="tma_persistent"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    Config(16, 64, 128, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(32, 64, 128, 8, num_warps=4, num_stages=3, variant="tma"),
)

KIND = dataclasses.replace(
    grouped_matmul.KIND,
    name="dual_grouped_matmul",
    files=FILES,
    ops=(OP,),
    seeds=SEEDS,
    default_config=default_dual_grouped_config,
    problem_of=dual_grouped_problem_of,
    bind=lambda problem, config, a, b, operands, out=None: bind_grouped(
        problem, config, a, b, operands, out, kind=KIND
    ),
    inputs=dual_grouped_inputs,
    input_elements=dual_grouped_input_elements,
    search_error=lambda problem, config: idle_threads_error(config),
    extra_inputs=(OFFS, B2),
    accumulators=2,
)
