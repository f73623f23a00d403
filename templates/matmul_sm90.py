"""The matmul's Gluon kernels for Hopper (``matmul_sm90.py.jinja``): what they take, how they
are rendered and bound. Two variants of the matmul kind:

- ``sm90_persistent``: num_warps (4 or 8) warps per program, one program per SM, the loads of
  a tile's first K steps issued during the previous tile's main loop;
- ``sm90_pingpong``: warp-specialized, a producer warp and two consumer warp groups of 4 warps
  that take turns on the tensor cores, each one's epilogue running under the other's MMAs.

With ``TMA_STORE`` each tile output (not a statistic, not bool) is staged in shared memory (one
buffer per consumer warp group) and stored by TMA; the wait for a store comes only before its
buffer is written again, a main loop later. They need an sm_90 GPU (wgmma and TMA; Triton's
interpreter runs no Gluon) and 16-bit inputs, 2-D, rows of A and B 16-byte aligned.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.problem import BATCHED_OPS, Config, Problem
from epilab.templates.bound import Bound, Described
from epilab.templates.runtime import single_launch, sm_count, tma_readable

SOURCE = "matmul_sm90.py.jinja"
VARIANTS = ("sm90_persistent", "sm90_pingpong")
INPUT_DTYPES = ("bfloat16", "float16")
CAPABILITY = 9  # wgmma: sm_90 only (Blackwell has tcgen05 instead)
# ping-pong registers: the kernel's 12 warps (3 warp groups: 2 consumers, the producer's padded)
# share 64K; each consumer holds a 128x128 fp32 accumulator (128 per thread) and its epilogue
CONSUMER_REGS = 232
PRODUCER_REGS = 40
PINGPONG_MAXNREG = 168  # 168 x 384 threads = 232 x 128 x 2 + 40 x 128
TMA_ALIGN_BYTES = 16


def staged_outputs(problem: Problem, config: Config) -> tuple[int, ...]:
    """The outputs stored from shared memory by TMA: with TMA_STORE, every tile output that TMA
    can store (not a statistic, not bool)."""
    if not config.TMA_STORE:
        return ()
    return tuple(i for i, o in enumerate(problem.epilogue.outputs) if not o.reduce and o.dtype != "bool")


def device_error(variant: str, capability: str, interpreter: bool) -> str | None:
    """The sm90 variants are Gluon kernels for sm_90 GPUs (wgmma): not in the interpreter."""
    if variant not in VARIANTS:
        return None
    if interpreter:
        return f"the {variant} variant is a Gluon kernel: Triton's interpreter cannot run it"
    if not capability.startswith(f"{CAPABILITY}."):
        return f"{variant} needs an sm_90 GPU (wgmma); the device's compute capability is {capability}"
    return None


def staging_copies(config: Config) -> int:
    """How many copies of each staged output tile the kernel keeps (one per consumer)."""
    return 2 if config.variant == "sm90_pingpong" else 1


def config_error(problem: Problem, config: Config) -> str | None:
    """Why the sm90 variants do not run ``problem`` tiled by ``config`` (None when they do)."""
    if problem.dtype not in INPUT_DTYPES:
        return f"the {config.variant} variant takes {' or '.join(INPUT_DTYPES)} inputs, not {problem.dtype}"
    s = problem.shape
    if s.batch != 1 or problem.op in BATCHED_OPS or "strided" in (problem.layout_a, problem.layout_b):
        return f"the {config.variant} variant takes 2-D problems with row- or column-major A and B"
    leading = {"a": s.k if problem.layout_a == "row" else s.m, "b": s.n if problem.layout_b == "row" else s.k}
    for name, dim in leading.items():
        if isinstance(dim, int) and dim * dtypes.itemsize(problem.dtype) % TMA_ALIGN_BYTES:
            return (
                f"the {config.variant} variant reads through TMA: {name.upper()}'s rows of {dim} "
                f"{problem.dtype} are not 16-byte aligned"
            )
    if config.SPLIT_K != 1 or config.EPILOGUE_SUBTILE != 1:
        return f"{config.variant} has no split-K and no epilogue slices: SPLIT_K=1, EPILOGUE_SUBTILE=1"
    if config.num_stages < 2:
        return f"the {config.variant} variant needs a ring of 2 stages or more"
    if config.BLOCK_K < 32 or config.BLOCK_N < 16:
        return f"the {config.variant} variant needs BLOCK_K >= 32 and BLOCK_N >= 16"
    warps = 4 if config.variant == "sm90_pingpong" else config.num_warps
    if config.variant == "sm90_pingpong" and config.num_warps != 4:
        return "sm90_pingpong's consumers are warp groups of 4 warps: num_warps=4"
    if warps not in (4, 8) or 16 * warps > config.BLOCK_M:
        return f"{warps} warps take wgmma tiles of BLOCK_M >= {16 * warps} (num_warps 4 or 8)"
    if config.TMA_STORE:
        staged = staged_outputs(problem, config)
        if not staged:
            return "TMA_STORE: no output is a tile TMA can store (statistics and bool outputs are not)"
        for i in staged:
            o = problem.epilogue.outputs[i]
            if isinstance(s.n, int) and s.n * dtypes.itemsize(o.dtype) % TMA_ALIGN_BYTES:
                return f"TMA_STORE needs 16-byte aligned output rows; rows of {s.n} {o.dtype} are not"
    return None


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    return {
        "tma_outputs": staged_outputs(problem, config),
        "consumer_regs": CONSUMER_REGS,
        "producer_regs": PRODUCER_REGS,
    }


def _layout(block: tuple[int, int], dtype: torch.dtype) -> object:
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, dtypes.name_of(dtype)))


def descriptors(
    problem: Problem, config: Config, a: torch.Tensor, b: torch.Tensor, outs: tuple[torch.Tensor, ...]
) -> tuple[Described, ...] | None:
    """Gluon tensor descriptors of A, B (each as stored: a column-major operand is described
    transposed) and the staged outputs, or None where TMA cannot address these tensors."""
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    a_row, b_row = problem.layout_a == "row", problem.layout_b == "row"
    staged = staged_outputs(problem, config)
    if not (
        tma_readable(a if a_row else a.t())
        and tma_readable(b if b_row else b.t())
        and all(tma_readable(outs[i]) for i in staged)
    ):
        return None
    a_block = (bm, bk) if a_row else (bk, bm)
    b_block = (bk, bn) if b_row else (bn, bk)
    return (
        Described("a_desc", "a_ptr", not a_row, a_block, _layout(a_block, a.dtype)),
        Described("b_desc", "b_ptr", not b_row, b_block, _layout(b_block, b.dtype)),
        *(
            Described(f"out{i}_desc", f"out{i}_ptr", False, (bm, bn), _layout((bm, bn), outs[i].dtype))
            for i in staged
        ),
    )


def bind(
    kind: object,
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    outs: tuple[torch.Tensor, ...],
    args: Mapping[str, object],
    target: str,
    index_64: bool,
    slots: tuple[int, int],
) -> Bound:
    """The launch of an sm90 variant: ``args`` are the matmul's (pointers, sizes, strides,
    the epilogue's) and get the descriptors, the grid's size and the ring's depth."""
    if target != "cuda":
        raise ValueError(
            f"the {config.variant} variant is a Gluon kernel for Hopper GPUs: Triton's interpreter "
            "cannot run it; use a default, tma or persistent variant there"
        )
    if a.device.type == "cuda" and torch.cuda.get_device_capability(a.device)[0] != CAPABILITY:
        cc = torch.cuda.get_device_capability(a.device)
        raise ValueError(
            f"the {config.variant} variant needs an sm_90 GPU (wgmma); {a.device} is sm_{cc[0]}{cc[1]}"
        )
    m, n = int(args["M"]), int(args["N"])  # type: ignore[call-overload]
    described = descriptors(problem, config, a, b, outs)
    if described is None:
        raise ValueError(
            f"the {config.variant} variant reads A and B (and writes staged outputs) through TMA: "
            "they need a unit inner stride and 16-byte aligned rows and addresses"
        )
    tensors = {"a_ptr": a, "b_ptr": b, **{f"out{i}_ptr": outs[i] for i in range(len(outs))}}
    tiles = triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N)
    grid = (min(sm_count(a.device), tiles),)
    extra: dict[str, object] = {
        **{d.arg: d.make(tensors[d.tensor]) for d in described},
        "BATCH": 1,
        "NUM_SMS": grid[0],
        "STAGES": config.num_stages,
        "INSTR_N": min(config.BLOCK_N, 256),
    }
    if config.variant == "sm90_pingpong":
        extra["maxnreg"] = PINGPONG_MAXNREG
    bound = single_launch(kind, problem, config, target, index_64, grid, {**args, **extra}, outs, None, slots)  # type: ignore[arg-type]
    return Bound(
        bound.outs,
        bound.run,
        bound.compile,
        bound.kernel,
        bound.args,
        bound.grid,
        described,
        None,
        bound.fills,
    )


__all__ = ["SOURCE", "VARIANTS", "bind", "config_error", "render_vars", "staged_outputs"]
