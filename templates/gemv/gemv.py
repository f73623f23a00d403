"""The gemv template's Python half: binding a skinny matmul (M <= 16) with split-K.

    C[m, n] = epilogue(sum_k A[m, k] * B[k, n], operands)

A is [M, K] with M <= 16, B is [K, N] (nn.Linear's weight W[N, K] passes as W.T),
any strides; 2-D only. The transposed case, N <= 16 with a larger M, runs the same
kernel on C.T = B.T @ A.T: ``kernel_problem`` swaps the roles (and the row and
column vectors of the epilogue) and the launch swaps every (m, n) stride pair.
The config's SPLIT_K and variant pick the reduction: ``default`` (no split),
``two_pass`` (partial sums in a workspace, then a second kernel adds them and runs
the epilogue) or ``atomic`` (fp32 atomics into a zeroed workspace; the last split
of each column tile runs the epilogue and zeroes the workspace again). Reduction outputs
(row and column statistics) are filled by whichever program runs the epilogue, one slot a
column tile (``runtime.Statistics``). Zero sizes and K = 0 are handled as in
``templates.matmul``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config, extend
from epilab.ir.epilogue import Epilogue, Node, Output
from epilab.ir.problem import Problem, Shape
from epilab.templates.bound import Bound
from epilab.templates.gemm import matmul
from epilab.templates.gemm.knobs import hopper_knobs_error
from epilab.templates.gemm.matmul import check_inputs, matmul_problem_of, trivial_bound
from epilab.templates.gemm.ops import WEIGHT_ONLY_OPS
from epilab.templates.kind import TemplateKind
from epilab.templates.runtime.binding import (
    INT32_MAX,
    Statistics,
    epilogue_args,
    extent,
    kernel_for,
    outputs_for,
    target_for,
    two_pass_bound,
)
from epilab.templates.runtime.render import EPILOGUE_FILES, kernel_hash

_FLIP = {"row": "col", "col": "row"}
_FLIP_REDUCE = {"row_sum": "col_sum", "col_sum": "row_sum", "row_max": "col_max", "col_max": "row_max"}
FILES = ("gemv.py.jinja", "split_k.py.jinja", *EPILOGUE_FILES)
BLOCK_M = 16  # the gemv template covers M <= 16 with one tile of rows
VARIANTS = extend("variant", ("default", "two_pass", "atomic"))  # default: no split-K


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the gemv template for ``problem`` (None when it does)."""
    return loop_error(problem, config)


def loop_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the gemv kernel for ``problem``."""
    why = hopper_knobs_error(config)
    if why is not None:
        return why
    s = problem.shape
    if config.BLOCK_M != BLOCK_M:
        return f"the gemv template computes M in one tile of {BLOCK_M} rows; use BLOCK_M={BLOCK_M}"
    if config.variant not in VARIANTS:
        return f"the gemv template has no variant {config.variant!r}; use one of {VARIANTS}"
    if (config.variant == "default") != (config.SPLIT_K == 1):
        return f"gemv variant {config.variant!r} with SPLIT_K={config.SPLIT_K}: 'default' means SPLIT_K=1"
    if s.batch != 1 or not any(isinstance(d, int) and d <= BLOCK_M for d in (s.m, s.n)):
        return f"the gemv template takes 2-D problems with a static M or N <= {BLOCK_M}, got {s}"
    return None


def split_k_error(problem: Problem, config: Config) -> str | None:
    """The tuner's rule: every split has at least one K block."""
    k = problem.shape.k
    k_blocks = triton.cdiv(k, config.BLOCK_K) if isinstance(k, int) else 1 << 20
    if k_blocks < config.SPLIT_K:
        return f"SPLIT_K={config.SPLIT_K} exceeds the {k_blocks} K blocks"
    return None


def is_transposed(problem: Problem) -> bool:
    """A gemv problem with a small N rather than a small M (C.T = B.T @ A.T is computed)."""
    m, n = problem.shape.m, problem.shape.n
    return not (isinstance(m, int) and m <= BLOCK_M) and isinstance(n, int) and n <= BLOCK_M


def _flip_broadcasts(ep: Epilogue) -> Epilogue:
    def flipped(node: Node) -> Node:
        if node.op != "operand":
            return node
        return dataclasses.replace(
            node, attrs=tuple((k, _FLIP.get(str(v), v) if k == "broadcast" else v) for k, v in node.attrs)
        )

    def flipped_output(o: Output) -> Output:  # C's row statistics are C.T's column ones
        return dataclasses.replace(o, reduce=_FLIP_REDUCE.get(o.reduce, o.reduce))

    return Epilogue(tuple(flipped(n) for n in ep.nodes), tuple(flipped_output(o) for o in ep.outputs))


def kernel_epilogues(epilogue: Epilogue) -> tuple[Epilogue, ...]:
    """The epilogue as written and as its transpose's kernel renders it (row and column
    vectors swapped), in an order of their own: a gemv problem's hash covers both."""
    return tuple(sorted({epilogue, _flip_broadcasts(epilogue)}, key=lambda ep: ep.text()))


def gemv_hash(epilogue: Epilogue) -> str:
    """The hash of a problem with ``epilogue`` on the gemv files (gemv and dual_gemv)."""
    return kernel_hash(FILES, *kernel_epilogues(epilogue))


def kernel_problem(problem: Problem) -> Problem:
    """The problem the kernel is rendered for: ``problem`` itself, or for a small N its
    transpose (M and N swapped, A.T and B.T swapped, row and column vectors and statistics
    swapped)."""
    if not is_transposed(problem):
        return problem
    s = problem.shape
    return dataclasses.replace(
        problem,
        shape=Shape(s.batch, s.n, s.m, s.k),
        layout_a=_FLIP[problem.layout_b],
        layout_b=_FLIP[problem.layout_a],
        epilogue=_flip_broadcasts(problem.epilogue),
    )


def _swap_mn(args: dict[str, object]) -> dict[str, object]:
    """Epilogue arguments of C for the kernel that computes C.T."""
    out = dict(args)
    for name in args:
        if name.endswith("_stride_m"):
            twin = name[: -len("_stride_m")] + "_stride_n"
            out[name], out[twin] = args[twin], args[name]
    return out


def bind_gemv(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
    *,
    kind: TemplateKind | None = None,
) -> Bound:
    """Everything a gemv launch does up to the launch itself (see ``matmul.bind``); ``kind``:
    a kind that renders this template under its own name (the dual GEMV: its extra input B2
    comes in ``operands``, is read as B is, and its sums take a second workspace)."""
    kind = KIND if kind is None else kind
    extra = {name: operands[name] for name in kind.extra_inputs}
    operands = {name: t for name, t in operands.items() if name not in extra}
    bt = check_inputs(a, b, weight_only=problem.op in WEIGHT_ONLY_OPS)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"the gemv template takes 2-D inputs, got {tuple(a.shape)} and {tuple(b.shape)}")
    why = kind.config_error(problem, config)
    if why is not None:
        raise ValueError(why)
    outs = outputs_for(problem, bt.out_shape, a.device, out)
    m, n, k = bt.a[0][1], bt.b[0][2], bt.a[0][2]
    trivial = trivial_bound(problem, bt, outs, operands, a.device)
    if trivial is not None:
        return trivial
    transposed = is_transposed(problem)
    if (n if transposed else m) > config.BLOCK_M:
        raise ValueError(f"the gemv template takes M or N <= {config.BLOCK_M}, got {m}x{n}")
    ep_args = epilogue_args(problem.epilogue, operands, outs, bt.out_shape, (1, m, n))
    if transposed:  # C.T = B.T @ A.T with M and N swapped
        if extra:
            raise ValueError(f"the {kind.name} template takes M <= {config.BLOCK_M}, got {m}x{n}")
        a, b, m, n, ep_args = b.t(), a.t(), n, m, _swap_mn(ep_args)
    kp = kernel_problem(problem)
    target = target_for(a.device)
    tensors = [a, b, *extra.values(), *outs, *operands.values()]
    index_64 = any(extent(t) > INT32_MAX for t in tensors)
    grid_n = triton.cdiv(n, config.BLOCK_N)
    split = config.SPLIT_K
    ws, lock = _workspace(kind, config, m, n, a.device)
    args: dict[str, object] = {
        "a_ptr": a,
        "b_ptr": b,
        **{f"{name}_ptr": t for name, t in extra.items()},
        **ep_args,
        "ws_ptr": ws,
        "lock_ptr": lock,
        "M": m,
        "N": n,
        "K": k,
        "stride_am": a.stride(0),
        "stride_ak": a.stride(1),
        "stride_bk": b.stride(0),
        "stride_bn": b.stride(1),
        "BLOCK_M": config.BLOCK_M,
        "BLOCK_N": config.BLOCK_N,
        "BLOCK_K": config.BLOCK_K,
        "SPLIT_K": split,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    grid = (grid_n, split)
    kernel = kernel_for(kind, kp, config, target, index_64)
    stats = Statistics.of(kp.epilogue, outs, (1, grid_n))  # one tile of rows; the kernel's terms
    if config.variant != "two_pass":
        return _one_pass_bound(outs, kernel, grid, args, stats, target, config.variant == "atomic")
    reduce = kernel_for(kind, kp, config, target, index_64, "_reduce")
    reduce_args = {
        **ep_args,
        "ws_ptr": ws,
        "M": m,
        "N": n,
        "BLOCK_M": config.BLOCK_M,
        "BLOCK_N": config.BLOCK_N,
        "SPLIT_K": split,
        "num_warps": 4,
        **stats.args,
    }
    return two_pass_bound(outs, target, (kernel, grid, args), (reduce, (grid_n, 1), reduce_args), stats)


def _workspace(
    kind: TemplateKind, config: Config, m: int, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 partial sums (one region per accumulator: every split's for the two-pass
    reduce, one running sum for the atomic variant, none otherwise) and the atomic variant's
    per-column-tile locks."""
    sums = kind.accumulators
    if config.variant == "two_pass":
        ws = torch.empty((sums * config.SPLIT_K, m, n), dtype=torch.float32, device=device)
    else:
        ws_shape = (sums, m, n) if config.variant == "atomic" else (1,)
        ws = torch.zeros(ws_shape, dtype=torch.float32, device=device)
    grid_n = triton.cdiv(n, config.BLOCK_N)
    lock = torch.zeros((grid_n if config.variant == "atomic" else 1,), dtype=torch.int32, device=device)
    return ws, lock


def _one_pass_bound(
    outs: tuple[torch.Tensor, ...],
    kernel: Any,
    grid: tuple[int, int],
    args: dict[str, object],
    stats: Statistics,
    target: str,
    atomic: bool,
) -> Bound:
    """The bound launch of a one-kernel variant; replayable unless its launch carries state
    (the atomic variant's workspace, statistics finished in order)."""
    args.update(stats.args)
    launcher = kernel[grid]

    def compile_one() -> None:
        if target != "interpreter":
            kernel.warmup(grid=grid, **args)

    def run() -> object:
        stats.fill()
        compiled = launcher(**args)
        if stats.finish is not None:
            stats.finish()
        return compiled

    if atomic or stats.finish is not None:
        return Bound(outs, run, compile_one)
    return Bound(outs, run, compile_one, kernel, args, grid, fills=stats.fills)


def default_gemv_config(problem: Problem, target: str = "cuda", *, sm_count: int = 132) -> Config:
    """The untuned gemv config: 64-wide column tiles with 128-deep K steps (64 for fp32),
    split-K (two-pass) until there are two programs per multiprocessor, never more splits
    than K blocks. The interpreter gets small tiles and no split."""
    if target == "interpreter":
        return Config(16, 32, 32, 1, 1, num_warps=4, num_stages=1)
    s = kernel_problem(problem).shape
    n = s.n if isinstance(s.n, int) else 1 << 20
    k = s.k if isinstance(s.k, int) else 1 << 20
    block_n, block_k = 64, 128 if problem.dtype != "float32" else 64
    tiles, k_blocks = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    split = 1
    while tiles * split < 2 * sm_count and split * 2 <= min(32, k_blocks):
        split *= 2
    variant = "two_pass" if split > 1 else "default"
    return Config(16, block_n, block_k, 1, split, num_warps=4, num_stages=3, variant=variant)


def gemv_twin(problem: Problem) -> Problem | None:
    """The same problem for the gemv template when it applies (a 2-D matmul problem
    with a static M, and M <= 16 or a static N <= 16), else None."""
    s = problem.shape

    def small(d: object) -> bool:
        return isinstance(d, int) and d <= BLOCK_M

    if (
        problem.template != "matmul"
        or s.batch != 1
        or not isinstance(s.m, int)
        or not (small(s.m) or small(s.n))
    ):
        return None
    return dataclasses.replace(problem, template="gemv", template_hash=gemv_hash(problem.epilogue))


# ------------------------------------------------------------------ the kind

# where the tuner searches (block sizes are capped at the kernel shape when a study starts)
SPACE: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "BLOCK_M": (16,),
    "BLOCK_N": (16, 32, 64, 128, 256),
    "BLOCK_K": (16, 32, 64, 128, 256),
    "GROUP_M": (1,),
    "SPLIT_K": (1, 2, 4, 8, 16, 32),
    "variant": ("default", "two_pass", "atomic"),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3, 4, 5, 6),
}

SEEDS = [  # for the gemv template: a plain slab, and two-pass split-K
    Config(16, 64, 128, 1, 1, num_warps=4, num_stages=3),
    Config(16, 128, 128, 1, 4, num_warps=4, num_stages=3, variant="two_pass"),
    Config(16, 64, 256, 1, 8, num_warps=4, num_stages=3, variant="two_pass"),
    Config(16, 32, 256, 1, 16, num_warps=4, num_stages=4, variant="two_pass"),
]


def gemv_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The gemv problem these tensors make (the matmul's, on this template)."""
    found = matmul_problem_of(problem, a, b, operands)
    return dataclasses.replace(found, template="gemv", template_hash=gemv_hash(found.epilogue))


def gemv_twins(problem: Problem) -> tuple[Problem, ...]:
    twin = gemv_twin(problem)
    return () if twin is None else (twin,)


KIND = dataclasses.replace(  # the matmul's tensors, outputs, inputs, reference and baseline
    matmul.KIND,
    name="gemv",
    files=FILES,
    ops=(),  # no op is made for it first: it runs the matmul problems it takes (its twins)
    takes=matmul.KIND.ops,
    space=SPACE,
    seeds=tuple(SEEDS),
    check=config_error,
    default_config=default_gemv_config,
    kernel_shape=lambda problem: kernel_problem(problem).shape,
    problem_of=gemv_problem_of,
    bind=bind_gemv,
    search_error=split_k_error,
    input_dtypes=dtypes.WIDE_INPUT_DTYPES,
    reductions=True,
    groups=False,  # its tiles are BLOCK_K x BLOCK_N slabs of split-K sums: no column groups yet
    applies=lambda name, chosen: True,
    twins=gemv_twins,
    prefer_untuned=True,  # a skinny matmul runs better on its heuristic than on a 16-row tile
    split_k_underfilled=False,  # a GEMV splits K to stream its weight: its own rule (split_k_error)
    kernel_epilogues=kernel_epilogues,  # the transpose's kernel renders row and column swapped
)
