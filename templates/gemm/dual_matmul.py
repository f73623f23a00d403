"""The dual GEMM template (a gated MLP's gate and up projections in one kernel).

    C[m, n] = epilogue(sum_k A[m, k] * B[k, n], sum_k A[m, k] * B2[k, n], operands)

The epilogue reads the two accumulators as ``acc`` and ``acc2`` (``silu(acc) * acc2`` for
SwiGLU, ``gelu_tanh(acc) * acc2`` for GeGLU), operands as every template does, and may have
several outputs (the training forward stores the two halves for the backward too). Each
A tile is loaded once for both dots: against cuBLAS twice and a pointwise join, A is read
once instead of twice, and the two [M, N] halves are never written or read back.

The kernel is the matmul template's (``matmul.py.jinja`` rendered with ``dual``): every main
loop it has (classic, TMA, persistent, both) and its epilogue slices. B and B2 are two
tensors of one shape and one set of strides: two weights, or the halves of one concatenated
[K, 2N] weight (``halves``). Their problem is op ``dual_mm``; 2-D only. Calls pass B2 in
``operands`` under ``"b2"`` (the kind's extra input), beside the epilogue's operands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem
from epilab.templates.gemm import matmul, matmul_config, matmul_sm90
from epilab.templates.gemm.matmul import FILES, bind_matmul, make_problem
from epilab.templates.gemm.matmul_config import idle_threads_error
from epilab.templates.gemm.matmul_reference import matmul_inputs, random_tensor
from epilab.templates.gemm.ops import DUAL_OP
from epilab.templates.kind import MAX_ACC_REGS
from epilab.templates.runtime.render import Target

B2 = "b2"  # the name of the second weight in a call's operands
OP = DUAL_OP  # ep(A @ B, A @ B2): a problem op of its own (its kinds run it: ``ops``)


def check_b2(a: torch.Tensor, b: torch.Tensor, b2: object) -> torch.Tensor:
    """Refuse a B2 that is not B's twin: a tensor of B's shape, strides, dtype and device."""
    if not isinstance(b2, torch.Tensor):
        raise TypeError(f"b2 must be a torch.Tensor, got {type(b2).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a dual GEMM takes 2-D A and B, got {tuple(a.shape)} and {tuple(b.shape)}")
    if b2.shape != b.shape or b2.stride() != b.stride():
        raise ValueError(
            f"b2 must have b's shape and strides (one kernel reads both alike): b is "
            f"{tuple(b.shape)} with strides {b.stride()}, b2 {tuple(b2.shape)} with strides {b2.stride()}"
        )
    if b2.dtype != b.dtype or b2.device != b.device:
        raise ValueError(f"b2 is {b2.dtype} on {b2.device}; b is {b.dtype} on {b.device}")
    return b2


def halves(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two weights of one concatenated [K, 2N] B (``w.t()`` of a fused gate-and-up
    linear's [2N, K] weight) as views: its first N columns and its last N."""
    if b.dim() != 2 or b.shape[1] % 2:
        raise ValueError(f"a concatenated weight is [K, 2N] with an even 2N, got {tuple(b.shape)}")
    n = b.shape[1] // 2
    return b[:, :n], b[:, n:]


def make_dual_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    b2: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
    *,
    precision: str = "ieee",
    template: str = "dual_matmul",
    files: tuple[str, ...] = FILES,
) -> Problem:
    """The dual problem of these tensors (checks them all); ``operands`` are the epilogue's."""
    if B2 in operands:
        raise ValueError(f"an epilogue operand may not be named {B2!r} in a dual GEMM (its second weight is)")
    check_b2(a, b, b2)
    return make_problem(a, b, epilogue, operands, op=OP, precision=precision, template=template, files=files)


def split_b2(operands: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A dual call's second weight (``operands[B2]``) and the other operands."""
    if B2 not in operands:
        raise ValueError(f"a dual GEMM's call passes its second weight as operands[{B2!r}]")
    return operands[B2], {name: t for name, t in operands.items() if name != B2}


def problem_of_on(template: str, files: tuple[str, ...]) -> Callable[..., Problem]:
    """A dual kind's ``problem_of``: the problem tensors make on ``template`` (whose files
    are ``files``), B2 in ``operands``."""

    def problem_of(
        problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
    ) -> Problem:
        b2, rest = split_b2(operands)
        return make_dual_problem(
            a,
            b,
            b2,
            problem.epilogue,
            rest,
            precision=problem.precision,
            template=template,
            files=files,
        )

    return problem_of


def config_error(problem: Problem, config: Config) -> str | None:
    """The matmul template's rules, for 2-D dual problems."""
    if problem.op != OP or problem.shape.batch != 1:
        return f"the dual templates take 2-D {OP} problems, got a {problem.op} of batch {problem.shape.batch}"
    if config.variant in matmul_sm90.VARIANTS:
        return f"the {config.variant} variant computes one accumulator; a dual GEMM runs on the Triton loops"
    return matmul_config.loop_error(problem, config)


def default_dual_config(
    problem: Problem, target: Target = "cuda", *, sm_count: int = matmul.H100_SMS
) -> Config:
    """The matmul's heuristic, with the tile shrunk until both accumulators fit in 128
    registers per thread (8 warps for a 128x128 tile; a 128x256 tile does not fit) and
    three stages of A, B and B2 tiles."""
    c = matmul.default_matmul_config(problem, target, sm_count=sm_count)
    if target == "interpreter":
        return c
    bm, bn, warps = c.BLOCK_M, c.BLOCK_N, c.num_warps
    while 2 * bm * bn // (32 * warps) > MAX_ACC_REGS:
        if warps < 8:
            warps = 8
        elif bn > 64:
            bn //= 2
        else:
            bm //= 2
    return dataclasses.replace(c, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=3)


def dual_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator, *, b_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, B, operands of the problem, and B2 (in ``operands``) strided as B (B and B2 of
    ``b_dtype`` where given: a weight-only problem's fp8)."""
    a, b, operands = matmul_inputs(problem, device, gen, b_dtype=b_dtype)
    s = problem.shape
    b2 = random_tensor(int(s.k), int(s.n), None, problem.layout_b, b.dtype, device, gen)
    if b2.stride() != b.stride():  # a 1-wide dim's stride is free: make B2 B's exact twin
        b2 = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device=device).copy_(b2)
    return a, b, {B2: b2, **operands}


def dual_reference(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs in float64, before output rounding."""
    a64 = a.double()
    rest = {name: t.double() for name, t in operands.items() if name != B2}
    return problem.epilogue.evaluate(a64 @ b.double(), rest, acc2=a64 @ operands[B2].double())


def eager_dual(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The unfused baseline: cuBLAS twice, then the join in eager torch."""
    b2, rest = split_b2(operands)
    return tuple(problem.epilogue.evaluate(a @ b, rest, acc2=a @ b2))


def dual_input_elements(problem: Problem) -> tuple[int, int]:
    """A once; B and B2 (the B side of ``input_elements``)."""
    s = problem.shape
    m, n, k = int(s.m), int(s.n), int(s.k)
    return m * k, 2 * k * n


def dual_search_error(problem: Problem, config: Config) -> str | None:
    return idle_threads_error(config) or matmul_config.warp_specialize_error(config)


SEEDS = [  # two accumulators: 128x128 tiles with 8 warps at most (128 registers each thread)
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma", EPILOGUE_SUBTILE=2),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    Config(128, 64, 64, 8, num_warps=4, num_stages=4),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4),
    Config(64, 64, 64, 8, num_warps=4, num_stages=4),
    Config(32, 64, 64, 8, num_warps=4, num_stages=4),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma_stream_k"),  # a short last wave
]

KIND = dataclasses.replace(  # the matmul's space, output layout and applies; its own tensors
    matmul.KIND,
    name="dual_matmul",
    ops=(OP,),
    seeds=tuple(SEEDS),
    check=config_error,
    default_config=default_dual_config,
    problem_of=problem_of_on("dual_matmul", FILES),
    bind=lambda problem, config, a, b, operands, out=None: bind_matmul(
        problem, config, a, b, operands, out, kind=KIND
    ),
    inputs=dual_inputs,
    reference=dual_reference,
    baseline=eager_dual,
    input_elements=dual_input_elements,
    search_error=dual_search_error,
    extra_inputs=(B2,),
    accumulators=2,
    input_dtypes=dtypes.WIDE_INPUT_DTYPES,
)
