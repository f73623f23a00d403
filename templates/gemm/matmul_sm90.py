"""The matmul's Gluon kernels for Hopper (``matmul_sm90.py.jinja``): what they take, how they
are rendered and bound. Three variants of the matmul kinds:

- ``sm90_persistent``: num_warps (4 or 8) warps per program, one program per SM, the loads of
  a tile's first K steps issued during the previous tile's main loop;
- ``sm90_pingpong``: warp-specialized, a producer warp and two consumer warp groups of 4 warps
  that take turns on the tensor cores, each one's epilogue running under the other's MMAs;
- ``sm90_weight_only``: a 16-bit A times an fp8 weight (the weight-only kinds): warp-specialized,
  a producer warp and BLOCK_N / 64 consumer warp groups (2 or 3), each owning 64 columns of the
  tile (64 rows of the [N, K] weight) and computing them as C^T = B^T A^T: the weight's fp8 slice
  is loaded into registers, converted and given to wgmma as its left operand (which wgmma reads
  from registers; a right operand only from shared memory, so the Triton loops write the
  converted tile back there every K step). The next K step's slice is converted while the
  current wgmma runs (for an fp16 A each 16-deep K block's while the blocks before it run:
  ``block_loop``). Tile outputs only (no statistics, no group outputs), stored by pointers.
  A dual GEMM of BLOCK_N 64 runs paired (``paired``): the gate's 64 weight rows on one warp
  group, the up's on the other, each over the tile's BLOCK_M tokens; they swap halves of their
  accumulators through shared memory before the epilogue.
- ``sm90_cooperative``: fp8 with exact accumulation (and block scales, ``block_scaled``):
  warp-specialized, a producer warp and BLOCK_M / 64 consumer warp groups (2 or 3), each
  owning 64 rows of the tile (and with TMA_STORE a staging buffer of those rows). Each K
  block's tensor-core sum is waited for and added in fp32 (times its block scales) by its warp
  group while the others' MMAs run: the promotion that one warp group cannot overlap with its
  own MMAs (DeepGEMM's scheme; RESULTS.md, issue 44). Where the tiles' last wave would leave
  SMs idle (``tail_split``), its tiles are split into ranges of K steps on the idle programs:
  the later ranges' partial sums go through scratch made for the call (``CallScratch``) and
  are added in order by the tile's first range, which runs the epilogue.

With ``TMA_STORE`` each tile output (not a statistic, not a group output, not bool) is staged
in shared memory (one buffer per consumer warp group) and stored by TMA; the wait for a store
comes only before its buffer is written again, a main loop later. Statistics and the group
outputs of a quantize step (one group a tile: BLOCK_N its width, ``matmul.group_error``) are
stored by pointers. They need an sm_90 GPU (wgmma and TMA; Triton's
interpreter runs no Gluon), 2-D problems, rows of A and B 16-byte aligned; persistent and
pingpong take 16-bit inputs, cooperative fp8 ones (A row-major, B column-major: wgmma reads
8-bit operands K-major only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config, extend
from epilab.ir.problem import BATCHED_OPS, Problem
from epilab.ir.rules import TRITON_DTYPES
from epilab.templates.bound import Bound, CallScratch, Described
from epilab.templates.gemm.ops import DUAL_WEIGHT_ONLY_OP, WEIGHT_ONLY_OPS
from epilab.templates.kind import TemplateKind
from epilab.templates.runtime.binding import single_launch, sm_count, tma_readable

SOURCE = "matmul_sm90.py.jinja"
VARIANTS = extend("variant", ("sm90_persistent", "sm90_pingpong", "sm90_cooperative", "sm90_weight_only"))
# three warp groups of 64 rows (the cooperative kernel's) or of 64 weight rows (the weight-only's)
extend("BLOCK_M", (192,))
extend("BLOCK_N", (192,))
COOPERATIVE = "sm90_cooperative"
WEIGHT_ONLY = "sm90_weight_only"
SAME_DTYPE_VARIANTS = tuple(v for v in VARIANTS if v != WEIGHT_ONLY)  # A and B of one dtype: any matmul
INPUT_DTYPES = ("bfloat16", "float16")
CAPABILITY = 9  # wgmma: sm_90 only (Blackwell has tcgen05 instead)
# ping-pong registers: the kernel's 12 warps (3 warp groups: 2 consumers, the producer's padded)
# share 64K; each consumer holds a 128x128 fp32 accumulator (128 per thread) and its epilogue
CONSUMER_REGS = 232
PRODUCER_REGS = 40
PINGPONG_MAXNREG = 168  # 168 x 384 threads = 232 x 128 x 2 + 40 x 128
TMA_ALIGN_BYTES = 16
# cooperative: consumer warp groups of SUB_M rows each (one m64 wgmma); per count, the
# consumers' registers, the producer's and the kernel's maxnreg (2: 232 x 128 x 2 + 40 x 128
# <= 168 x 384; 3: 160 x 128 x 3 + 32 x 128 = 128 x 512): each consumer holds two 64 x BLOCK_N
# fp32 tiles (the sum and the K block's product), 128 registers at BLOCK_N = 128 (256 spilled,
# sm_90a ptxas). At 3 x 152 + 40, ptxas sank the next scales' loads past the wgmma's wait in
# the split loop and a quantize step's loop; at 3 x 160 + 32 it leaves them among the wgmmas
# (RESULTS.md 2026-11-29 seventh)
SUB_M = 64
# weight-only: consumer warp groups of 64 weight rows (BLOCK_N / 64 of them), each holding a
# 64 x BLOCK_M fp32 accumulator and two converted weight slices; per count the consumers'
# registers, the producer's and the kernel's maxnreg, as for the cooperative kernel. Three
# consumers hold BLOCK_M <= 128 (at 256 ptxas asks for 158 registers of the kernel's 128)
WEIGHT_ONLY_REGS = {2: (232, PRODUCER_REGS, 168), 3: (160, 32, 128)}
WEIGHT_ONLY_BLOCK_M = {2: (64, 128, 256), 3: (64, 128)}
PAIR = 2  # a paired dual's warp groups: the gate's and the up's (``paired``)
COOPERATIVE_REGS = {2: (232, PRODUCER_REGS, 168), 3: (160, 32, 128)}
COOPERATIVE_BLOCK_K = 128  # one promotion a K block: the interval of cuBLASLt's exact mode
MAX_TAIL_SPLIT = 8  # ranges of K a tile of the cooperative kernel's last wave is split into, at most
SPLIT_FIXUP_STEPS = 10  # a split tile's wait and sum, in K steps of the kernel (``tail_split``)
SPLIT_LOOP_COST = 0.03  # the split kernel's K loop against the unsplit one, on whole tiles


def staged_outputs(problem: Problem, config: Config) -> tuple[int, ...]:
    """The outputs stored from shared memory by TMA: with TMA_STORE, every tile output that TMA
    can store (not a statistic or group output, not bool)."""
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


SHARED_BYTES = 232_448  # every sm_90 part's opt-in shared memory a block (227 KiB)


def cooperative_default(
    kind: TemplateKind, problem: Problem, config: Config, capability: str, sms: int, seeds: Sequence[Config]
) -> Config:
    """An untuned config of ``kind`` on a GPU of ``capability``: on sm_90 the first cooperative
    config of ``seeds`` that runs ``problem`` with a tile for every SM (the Triton loops wait for
    each K block's promotion, one warp group cannot hide its own), else ``config`` (the
    heuristic's). Tensors TMA cannot address fall back to the classic loop where bound."""
    if capability != "9.0":
        return config
    m, n = problem.shape.m, problem.shape.n

    def tiles(c: Config) -> int:
        rows = triton.cdiv(m, c.BLOCK_M) if isinstance(m, int) else sms
        return rows * (triton.cdiv(n, c.BLOCK_N) if isinstance(n, int) else sms)

    for seed in seeds:
        fills = seed.variant == COOPERATIVE and tiles(seed) >= sms
        if (
            fills
            and kind.config_error(problem, seed) is None
            and kind.smem_bytes(problem, seed) <= SHARED_BYTES
        ):
            return seed
    return config


def tail_split(tiles: int, sms: int, k_steps: int) -> int:
    """How many ranges of K steps the cooperative kernel splits each tile of its last wave into
    (1: none). The ``tiles % sms`` tiles of a partial last wave leave the other SMs idle for a
    whole tile (4096 x 4096 x 7168 in 192 x 128 tiles: 704 = 5 x 132 + 44, a sixth wave a third
    full); split into S ranges on S programs each, that wave takes about 1/S of the time. Each
    range keeps 2 K steps at least; a full last wave, or one over half full, is not split.

    The split kernel's K loop runs about ``SPLIT_LOOP_COST`` slower on every whole tile, and
    the tile's first range waits for the others and adds their sums (``SPLIT_FIXUP_STEPS``):
    it splits only where the K steps saved exceed both (fitted on an H200, RESULTS.md
    2026-11-29 third: 4096 x 4096 x 7168 and 4096 x 7168 x 16384 gained 5.7% and 3.5%,
    4096 x 7168 x 2048 lost 2.7%)."""
    tail = tiles % sms
    if tail == 0:
        return 1
    split = max(1, min(sms // tail, k_steps // 2, MAX_TAIL_SPLIT))
    saved = k_steps - k_steps / split
    waves = tiles // sms
    return split if saved > SPLIT_FIXUP_STEPS + SPLIT_LOOP_COST * waves * k_steps else 1


def last_wave_split(problem: Problem, config: Config, tiles: int, sms: int, k_steps: int) -> int:
    """``tail_split`` for a cooperative launch, but 1 for a quantize step (column groups)
    storing its tile by TMA: beside that epilogue ptxas moves the next block scales' loads past
    the wgmma's wait (``sass.Loop.load_places``), and the split ran 7.9% slower than the whole
    last wave on 2048 x 14336 x 4096 (H200); without TMA stores the split gained 5.1%
    (RESULTS.md, 2026-11-30)."""
    if problem.epilogue.group_size and config.TMA_STORE:
        return 1
    return tail_split(tiles, sms, k_steps)


def consumers(config: Config) -> int:
    """The consumer warp groups of the cooperative kernel (BLOCK_M / 64) or the weight-only one
    (BLOCK_N / 64; 2 at BLOCK_N 64, the paired dual's, ``paired``)."""
    if config.variant == WEIGHT_ONLY:
        return max(config.BLOCK_N // SUB_M, PAIR)
    return config.BLOCK_M // SUB_M


def paired(problem: Problem, config: Config) -> bool:
    """Whether the weight-only kernel runs ``problem`` as a paired dual: BLOCK_N 64 columns of a
    dual GEMM, the gate's weight rows on one warp group and the up's on the other, each over
    the tile's BLOCK_M tokens. Each converted weight element feeds BLOCK_M MACs, as in a single
    GEMM's 256-row tile, where a warp group that converts both weights' slices holds BLOCK_M
    128 at most (twice the conversions a MAC). After the K loop the two swap halves of their
    accumulators through shared memory (``exchange_bytes``), so each runs the epilogue on half
    the tokens with both accumulators."""
    return config.variant == WEIGHT_ONLY and problem.op == DUAL_WEIGHT_ONLY_OP and config.BLOCK_N == SUB_M


def block_loop(problem: Problem) -> bool:
    """Whether the weight-only consumers run the K-block loop: a wgmma a K block of 16, each
    block's slice converted while the blocks before it run, one wait a K step. Taken for an
    fp16 A: the step loop (a whole step's slice converted while the step before runs, two
    slices in turn) is serialized by ptxas there, every wgmma waited for (C7512), and took
    1.05-1.10x the block loop's time at M = 2048 on an H200. For a bf16 A the step loop is
    not serialized and was as fast (0.98-1.03x at M = 2048) or faster: the block loop took
    1.15x its time at 128x4096x14336 on 64x128x128 tiles, a block's conversion not hidden
    under a 64-token wgmma (RESULTS.md, 2026-11-30 fifth)."""
    return problem.dtype == "float16"


def exchange_bytes(problem: Problem, config: Config) -> int:
    """Shared memory a paired dual's warp groups swap their accumulators' halves through: two
    64 x BLOCK_M / 2 fp32 halves (0 for every other kernel)."""
    return 2 * SUB_M * (config.BLOCK_M // 2) * 4 if paired(problem, config) else 0


def warp_groups(config: Config) -> int:
    """The warp groups of num_warps each that share one tile's accumulator: the cooperative
    and weight-only kernels' consumers; 1 for every other kernel (the ping-pong's consumers
    hold a tile each)."""
    return consumers(config) if config.variant in (COOPERATIVE, WEIGHT_ONLY) else 1


def weight_only_error(problem: Problem, config: Config) -> str | None:
    """What the weight-only variant asks beyond the sm90 variants' common rules."""
    if problem.op not in WEIGHT_ONLY_OPS:
        return f"{WEIGHT_ONLY} takes weight-only problems (a 16-bit A times an fp8 B), not {problem.op}"
    if (problem.layout_a, problem.layout_b) != ("row", "col"):
        return (
            f"{WEIGHT_ONLY} reads A row-major and the fp8 weight K-major (B column-major: a [N, K] "
            f"weight transposed), got {problem.layout_a} and {problem.layout_b}"
        )
    count = consumers(config)
    dual = problem.op == DUAL_WEIGHT_ONLY_OP
    pair = paired(problem, config)
    if not pair and (config.BLOCK_N % SUB_M or config.BLOCK_N // SUB_M not in WEIGHT_ONLY_REGS):
        return (
            f"{WEIGHT_ONLY} takes BLOCK_N 128 or 192 (2 or 3 warp groups of 64 weight rows)"
            f"{', or 64 for a dual (a warp group a weight)' if dual else ''}, not {config.BLOCK_N}"
        )
    # a dual's warp group holds two 64 x BLOCK_M accumulators, a paired one two halves
    rows = WEIGHT_ONLY_BLOCK_M[count][: -1 if dual and not pair else None]
    if config.BLOCK_M not in rows:
        return (
            f"{WEIGHT_ONLY} with {count} warp groups takes BLOCK_M in {rows} (wgmma's N; each warp "
            f"group holds {'two' if dual else 'a'} 64 x BLOCK_M accumulator{'s' if dual else ''}), "
            f"not {config.BLOCK_M}"
        )
    if config.BLOCK_K not in (64, 128):
        return f"{WEIGHT_ONLY} takes BLOCK_K 64 or 128, not {config.BLOCK_K}"
    if config.SWAP_AB or config.TMA_STORE or config.PROMOTE != 1:
        return (
            f"{WEIGHT_ONLY} always holds the weight as wgmma's left operand and stores by "
            "pointers: SWAP_AB=0 (a knob of the Triton loops), TMA_STORE=0, PROMOTE=1"
        )
    if problem.epilogue.reductions or problem.epilogue.group_size:
        return (
            f"{WEIGHT_ONLY} has no statistics or group outputs (its warp groups split a tile's "
            "columns); the Triton loops have them"
        )
    k = problem.shape.k
    if not isinstance(k, int) or k < 1:  # a weight's K is static; its first K step is issued unconditionally
        return f"{WEIGHT_ONLY} takes a static K of 1 or more (a weight's in-features), not {k}"
    if k % TMA_ALIGN_BYTES:
        return (
            f"{WEIGHT_ONLY} reads the fp8 weight through TMA: its rows of {k} bytes are not 16-byte aligned"
        )
    return None


def cooperative_error(problem: Problem, config: Config) -> str | None:
    """What the cooperative variant asks beyond the sm90 variants' common rules."""
    if problem.dtype not in dtypes.FP8_DTYPES or problem.precision != "ieee":
        return (
            f"{COOPERATIVE} promotes fp8 sums: it takes fp8 inputs with exact accumulation, "
            f"not {problem.dtype} ({problem.precision})"
        )
    if (problem.layout_a, problem.layout_b) != ("row", "col"):
        return (
            f"{COOPERATIVE} reads fp8 operands K-major (wgmma's only order for 8-bit types): A "
            f"row-major and B column-major (a weight's [N, K] transposed), got {problem.layout_a} "
            f"and {problem.layout_b}"
        )
    if config.BLOCK_M // SUB_M not in COOPERATIVE_REGS or config.BLOCK_M % SUB_M:
        return f"{COOPERATIVE} takes BLOCK_M 128 or 192 (2 or 3 warp groups of 64 rows), not {config.BLOCK_M}"
    if config.BLOCK_N not in (64, 128) or config.BLOCK_K != COOPERATIVE_BLOCK_K or config.PROMOTE != 1:
        return (
            f"{COOPERATIVE} takes BLOCK_N 64 or 128 (a 64 x 256 sum and product spill), "
            f"BLOCK_K={COOPERATIVE_BLOCK_K} and PROMOTE=1 (a promotion every K block)"
        )
    shared = [problem.epilogue.outputs[i].reduce for i in problem.epilogue.reductions]
    if "col_sum" in shared:
        return (
            f"{COOPERATIVE} has no column sums: its warp groups share a tile's columns, and their "
            "shares would be added in a varying order (row statistics and column maxima it has)"
        )
    return None


def config_error(problem: Problem, config: Config) -> str | None:
    """Why the sm90 variants do not run ``problem`` tiled by ``config`` (None when they do)."""
    cooperative = config.variant == COOPERATIVE
    if cooperative or config.variant == WEIGHT_ONLY:
        why = cooperative_error(problem, config) if cooperative else weight_only_error(problem, config)
        if why is not None:
            return why
    if not cooperative and problem.dtype not in INPUT_DTYPES:
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
    specialized = ("sm90_pingpong", COOPERATIVE, WEIGHT_ONLY)
    warps = 4 if config.variant in specialized else config.num_warps
    if config.variant in specialized and config.num_warps != 4:
        return f"{config.variant}'s consumers are warp groups of 4 warps: num_warps=4"
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
    if config.variant in (COOPERATIVE, WEIGHT_ONLY):
        count = consumers(config)
        regs = (COOPERATIVE_REGS if config.variant == COOPERATIVE else WEIGHT_ONLY_REGS)[count]
        return {
            "tma_outputs": staged_outputs(problem, config),
            "consumers": count,
            "consumer_regs": regs[0],
            "producer_regs": regs[1],
            "paired": paired(problem, config),
            "block_loop": block_loop(problem),
            "k_blocks": config.BLOCK_K // 16,  # the block loop's wgmmas a K step (16 deep each)
        }
    return {
        "tma_outputs": staged_outputs(problem, config),
        "consumer_regs": CONSUMER_REGS,
        "producer_regs": PRODUCER_REGS,
    }


def _layout(block: tuple[int, int], dtype: torch.dtype) -> object:
    from triton.experimental.gluon import language as gl

    triton_name = TRITON_DTYPES[dtypes.name_of(dtype)].removeprefix("tl.")  # fp8: Triton's own names
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, triton_name))


def descriptors(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    outs: tuple[torch.Tensor, ...],
    b2: torch.Tensor | None = None,
) -> tuple[Described, ...] | None:
    """Gluon tensor descriptors of A, B (and a dual GEMM's B2, strided as B; each as stored: a
    column-major operand is described transposed) and the staged outputs, or None where TMA
    cannot address these tensors."""
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    a_row, b_row = problem.layout_a == "row", problem.layout_b == "row"
    staged = staged_outputs(problem, config)
    weights = (b,) if b2 is None else (b, b2)
    if not (
        tma_readable(a if a_row else a.t())
        and all(tma_readable(w if b_row else w.t()) for w in weights)
        and all(tma_readable(outs[i]) for i in staged)
    ):
        return None
    if config.variant == COOPERATIVE:  # A and the staged outputs in slices of rows, one a warp group
        bm = SUB_M
    if config.variant == WEIGHT_ONLY:  # the weight in slices of its [N, K] rows, one a warp group
        bn = SUB_M
    a_block = (bm, bk) if a_row else (bk, bm)
    b_block = (bk, bn) if b_row else (bn, bk)
    return (
        Described("a_desc", "a_ptr", not a_row, a_block, _layout(a_block, a.dtype)),
        Described("b_desc", "b_ptr", not b_row, b_block, _layout(b_block, b.dtype)),
        *(
            ()
            if b2 is None
            else (Described("b2_desc", "b2_ptr", not b_row, b_block, _layout(b_block, b.dtype)),)
        ),
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
    b2 = args.get("b2_ptr")  # a dual GEMM's second weight
    described = descriptors(problem, config, a, b, outs, b2)  # type: ignore[arg-type]
    if described is None:
        raise ValueError(
            f"the {config.variant} variant reads A and B (and writes staged outputs) through TMA: "
            "they need a unit inner stride and 16-byte aligned rows and addresses"
        )
    tensors = {"a_ptr": a, "b_ptr": b, "b2_ptr": b2, **{f"out{i}_ptr": outs[i] for i in range(len(outs))}}
    tiles = triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N)
    sms = sm_count(a.device)
    grid = (min(sms, tiles),)
    workspace, extra = None, {}
    if config.variant == COOPERATIVE:  # a partial last wave split along K (``tail_split``)
        k_steps = triton.cdiv(int(args["K"]), config.BLOCK_K)  # type: ignore[call-overload]
        split = last_wave_split(problem, config, tiles, sms, k_steps)
        grid = (sms,) if split > 1 else grid
        # a slot of partial sums per program and warp group, and its flag, made for each call
        # (none without a split: the kernel does not touch them)
        partial_slots = grid[0] * consumers(config) if split > 1 else 0
        workspace = CallScratch(partial_slots, SUB_M * config.BLOCK_N)
        extra["TAIL_SPLIT"] = split
    extra = {
        **extra,
        **{d.arg: d.make(tensors[d.tensor]) for d in described},
        "BATCH": 1,
        "NUM_SMS": grid[0],
        "STAGES": config.num_stages,
        # wgmma's N: the tile's columns, or for the weight-only kernel (C^T) its rows (one
        # wgmma a K slice: two of half as many, reading one converted slice, ptxas serializes)
        "INSTR_N": config.BLOCK_M if config.variant == WEIGHT_ONLY else min(config.BLOCK_N, 256),
    }
    if config.variant == "sm90_pingpong":
        extra["maxnreg"] = PINGPONG_MAXNREG
    elif config.variant == COOPERATIVE:
        extra["maxnreg"] = COOPERATIVE_REGS[consumers(config)][2]
    elif config.variant == WEIGHT_ONLY:
        extra["maxnreg"] = WEIGHT_ONLY_REGS[consumers(config)][2]
    launch_args = {**args, **extra}
    bound = single_launch(kind, problem, config, target, index_64, grid, launch_args, outs, workspace, slots)  # type: ignore[arg-type]
    return dataclasses.replace(bound, descriptors=described)


__all__ = ["SOURCE", "VARIANTS", "bind", "config_error", "render_vars", "staged_outputs"]
