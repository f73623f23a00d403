"""The matmul template's Python half: problems from tensors, a default config,
the launcher and the float64 reference (``epilab.matmul`` is in api/matmul.py).

    C[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n], operands)

A is [M, K] or [batch, M, K], B is [K, N] or [batch, K, N] (a 2-D side is shared
by every batch), any strides. Operands broadcast to C's shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import BATCHED_OPS, Geometry, Problem, Shape, applied_precision
from epilab.ir.rules import RULES
from epilab.templates.bound import Bound, Described, Workspace
from epilab.templates.gemm import matmul_sm90
from epilab.templates.gemm.matmul_config import (
    FP8_MIN_BLOCK_K,
    PERSISTENT_VARIANTS,
    STREAM_K_VARIANTS,
    TMA_VARIANTS,
    TRITON_VARIANTS,
    WARP_GROUP_ROWS,
    applies,
    config_error,
    matmul_search_error,
    promote_space,
)
from epilab.templates.gemm.matmul_reference import eager_matmul, matmul_inputs, reference
from epilab.templates.gemm.ops import WEIGHT_ONLY_OPS
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES
from epilab.templates.kind import OutputSpec, TemplateKind
from epilab.templates.runtime.binding import (
    INT32_MAX,
    checked_operands,
    epilogue_args,
    extent,
    layout_of,
    outputs_for,
    single_launch,
    sm_count,
    split_k_bound,
    target_for,
    tma_readable,
)
from epilab.templates.runtime.render import EPILOGUE_FILES, Target, kernel_hash

_GRID_Y_MAX = 65535


# ------------------------------------------------------------------ what the template accepts

FILES = ("matmul.py.jinja", matmul_sm90.SOURCE, "tile_order.py.jinja", "split_k.py.jinja", *EPILOGUE_FILES)


@dataclass(frozen=True)
class _Batched:
    """A and B seen as 3-D (a missing batch is stride 0), and the output shape."""

    a: tuple[tuple[int, int, int], tuple[int, int, int]]  # sizes, strides
    b: tuple[tuple[int, int, int], tuple[int, int, int]]
    out_shape: tuple[int, ...]
    batch: int


def _as_3d(t: torch.Tensor, batch: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    if t.dim() == 2:
        return (batch, t.shape[0], t.shape[1]), (0, t.stride(0), t.stride(1))
    stride_b = 0 if t.shape[0] == 1 else t.stride(0)
    return (batch, t.shape[1], t.shape[2]), (stride_b, t.stride(1), t.stride(2))


def check_inputs(a: torch.Tensor, b: torch.Tensor, *, weight_only: bool = False) -> _Batched:
    """A and B's shapes, strides and batch, checked: one dtype, or (``weight_only``) a 2-D
    float16 or bfloat16 A and a 2-D fp8 B (``templates/gemm/weight_only.py``)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D (batched), got shape {tuple(t.shape)}")
        if dtypes.name_or_none(t.dtype) not in dtypes.INPUT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported input dtypes: {dtypes.INPUT_DTYPES}")
    if weight_only:
        check_weight_only(a, b)
    elif a.dtype != b.dtype:
        raise TypeError(
            f"a and b must have the same dtype (or a {' or '.join(WEIGHT_ONLY_DTYPES)} a with a 2-D fp8 b: "
            f"a weight-only matmul), got {a.dtype} and {b.dtype}"
        )
    fp8 = b if weight_only else a
    if dtypes.name_of(fp8.dtype) in dtypes.FP8_DTYPES and fp8.is_cuda:
        cc = torch.cuda.get_device_capability(a.device)
        if cc < dtypes.FP8_CAPABILITY:
            raise TypeError(
                f"fp8 matmuls need a GPU of compute capability {'.'.join(map(str, dtypes.FP8_CAPABILITY))} "
                "or "
                f"newer (Ada, Hopper); {a.device} is {cc[0]}.{cc[1]}"
            )
    if a.device != b.device:
        raise ValueError(f"a and b are on different devices ({a.device} and {b.device})")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"cannot multiply a {tuple(a.shape)} by b {tuple(b.shape)}: "
            f"a's last dim ({a.shape[-1]}) must equal b's second-to-last ({b.shape[-2]})"
        )
    batches = {t.shape[0] for t in (a, b) if t.dim() == 3}
    if len(batches - {1}) > 1:
        raise ValueError(f"batch sizes of a {tuple(a.shape)} and b {tuple(b.shape)} do not broadcast")
    batch = max(batches) if batches else 1
    m, n = a.shape[-2], b.shape[-1]
    out_shape = (batch, m, n) if batches else (m, n)
    return _Batched(_as_3d(a, batch), _as_3d(b, batch), out_shape, batch)


def check_weight_only(a: torch.Tensor, b: torch.Tensor) -> None:
    """A weight-only matmul's inputs: 2-D float16 or bfloat16 A, 2-D fp8 B."""
    wide, fp8 = dtypes.name_of(a.dtype), dtypes.name_of(b.dtype)
    if a.dim() != 2 or b.dim() != 2 or wide not in WEIGHT_ONLY_DTYPES or fp8 not in dtypes.FP8_DTYPES:
        raise TypeError(
            f"a weight-only matmul takes a 2-D {' or '.join(WEIGHT_ONLY_DTYPES)} a and a 2-D fp8 b "
            f"({', '.join(dtypes.FP8_DTYPES)}), got {a.dtype} {tuple(a.shape)} and {b.dtype} {tuple(b.shape)}"
        )


def make_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
    *,
    op: str = "matmul",
    precision: str = "ieee",
    template: str = "matmul",
    files: tuple[str, ...] = FILES,
    geometry: Geometry | None = None,
) -> Problem:
    """The Problem that ``launch`` would run for these tensors (checks them all), for
    ``template`` (whose files are ``files``: a dual GEMM's kinds make theirs here too; a
    weight-only one's ``geometry`` holds B's dtype)."""
    bt = check_inputs(a, b, weight_only=op in WEIGHT_ONLY_OPS)
    target_for(a.device)
    specs = checked_operands(epilogue, operands, a.device, bt.out_shape)
    (batch, m, k), a_strides = bt.a
    n = bt.b[0][2]
    return Problem(
        op=op,
        template=template,
        template_hash=kernel_hash(files, epilogue),
        dtype=dtypes.name_of(a.dtype),
        layout_a=layout_of((m, k), a_strides[1:]),
        layout_b=layout_of(bt.b[0][1:], bt.b[1][1:]),
        operands=specs,
        epilogue=epilogue,
        shape=Shape(batch, m, n, k),
        precision=applied_precision(dtypes.name_of(a.dtype), precision),
        geometry=geometry,
    )


# ------------------------------------------------------------- default config


H100_SMS = 132  # H100 SXM and H200: the default when no device is at hand


def default_matmul_config(problem: Problem, target: Target = "cuda", *, sm_count: int = H100_SMS) -> Config:
    """The documented heuristic used when no config is given (untuned).

    Interpreter: tiles just large enough for the problem (16..64 per dim), since
    the interpreter's cost is per program and per op.

    CUDA: start from 128x256 tiles (128x128 for fp32) with BLOCK_K=64 (32 for
    fp32, 128 for fp8), no larger than the problem needs; then, while there are fewer tiles
    than 90% of the multiprocessors, halve BLOCK_N (down to 64) and then BLOCK_M
    (down to 32) so that small problems still fill the chip. 8 warps for tiles
    of 128x256 or more, else 4; 4 stages; GROUP_M=8. (These choices come from
    benchmarks/matmul_quick.py --probe on an H200: see benchmarks/RESULTS.md.)
    Symbolic dims count as large.
    """
    s = problem.shape

    def fit(dim: object, lo: int, hi: int) -> int:
        if not isinstance(dim, int):
            return hi  # symbolic: assume large
        return max(lo, min(hi, triton.next_power_of_2(max(dim, 1))))

    if target == "interpreter":
        k_lo = FP8_MIN_BLOCK_K if problem.dtype in dtypes.FP8_DTYPES else 16
        blocks = (fit(s.m, 16, 64), fit(s.n, 16, 64), fit(s.k, k_lo, 64))
        return Config(*blocks, GROUP_M=4, num_warps=4, num_stages=1)
    wide = problem.dtype != "float32"
    block_k = 128 if problem.dtype in dtypes.FP8_DTYPES else 64 if wide else 32
    block_m = fit(s.m, 16, 128)
    block_n = fit(s.n, 64, 256 if wide else 128)

    def tiles(bm: int, bn: int) -> int:
        dims = [d if isinstance(d, int) else 1 << 20 for d in (s.batch, s.m, s.n)]
        return dims[0] * triton.cdiv(dims[1], bm) * triton.cdiv(dims[2], bn)

    while 10 * tiles(block_m, block_n) < 9 * sm_count and (block_n > 64 or block_m > 32):
        if block_n > 64:
            block_n //= 2
        else:
            block_m //= 2
    big = block_m * block_n >= 128 * 256
    return Config(block_m, block_n, block_k, GROUP_M=8, num_warps=8 if big else 4, num_stages=4)


# ------------------------------------------------------------------- launch


def matmul_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The matmul problem these tensors make under ``problem``'s op and precision: equal
    to ``problem`` exactly when they fit it (checks them all)."""
    return make_problem(a, b, problem.epilogue, operands, op=problem.op, precision=problem.precision)


# a TMA variant's loop by pointers, where the tensors do not suit TMA (else: stream-K's)
_WITHOUT_TMA = {"tma": "default", "tma_persistent": "persistent"}


def bind_matmul(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
    *,
    kind: TemplateKind | None = None,
    loop_args: Mapping[str, object] | None = None,
) -> Bound:
    """Everything a launch of the matmul template does up to the launch itself (``kind``:
    a kind that renders this template under its own name and rules; the matmul's). The
    kind's extra inputs (a dual GEMM's B2) come in ``operands`` and are read as B is;
    ``loop_args`` are the main loop's other arguments (a block-scaled kind's scales)."""
    kind = KIND if kind is None else kind
    extra = {name: operands[name] for name in kind.extra_inputs}
    operands = {name: t for name, t in operands.items() if name not in extra}
    bt = check_inputs(a, b, weight_only=problem.op in WEIGHT_ONLY_OPS)
    why = kind.config_error(problem, config)
    if why is not None:
        raise ValueError(why)
    ep = problem.epilogue
    outs = outputs_for(problem, bt.out_shape, a.device, out)
    batch, m, n, k = bt.batch, bt.a[0][1], bt.b[0][2], bt.a[0][2]
    trivial = trivial_bound(problem, bt, outs, operands, a.device)
    if trivial is not None:
        return trivial
    target = target_for(a.device)
    tensors = (a, b, *extra.values(), *outs, *operands.values())
    index_64 = any(extent(t) > INT32_MAX for t in tensors) or batch * m * n > INT32_MAX
    grid: tuple[int, ...] = (triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N), batch)
    if batch > _GRID_Y_MAX:
        raise ValueError(f"batch {batch} is larger than the {_GRID_Y_MAX} this template launches")
    args: dict[str, object] = {
        "a_ptr": a,
        "b_ptr": b,
        "M": m,
        "N": n,
        "K": k,
        "stride_ab": bt.a[1][0],
        "stride_am": bt.a[1][1],
        "stride_ak": bt.a[1][2],
        "stride_bb": bt.b[1][0],
        "stride_bk": bt.b[1][1],
        "stride_bn": bt.b[1][2],
        **{f"{name}_ptr": t for name, t in extra.items()},
        **(loop_args or {}),
    }
    ep_args = epilogue_args(ep, operands, outs, bt.out_shape, (batch, m, n))
    args.update(ep_args)
    if config.variant in matmul_sm90.VARIANTS:
        if target == "cuda" and matmul_sm90.descriptors(problem, config, a, b, outs, extra.get("b2")) is None:
            # views TMA cannot address (a transposed M = 1, an unaligned slice): the classic loop
            config = dataclasses.replace(config, variant="default", TMA_STORE=0)
        else:
            slots = tile_slots(config, m, n)
            return matmul_sm90.bind(kind, problem, config, a, b, outs, args, target, index_64, slots)
    workspace = None
    if config.variant in (*PERSISTENT_VARIANTS, *STREAM_K_VARIANTS):
        grid, workspace = _persistent_grid(kind, config, grid[0] * batch, k, sm_count(a.device))
        args.update(BATCH=batch, NUM_SMS=grid[0])
    if config.variant in TMA_VARIANTS:
        described = tma_descriptors(problem, config, a, b, extra)
        if described is None:  # these tensors' strides or addresses do not suit TMA: no descriptors
            config = dataclasses.replace(config, variant=_WITHOUT_TMA.get(config.variant, "stream_k"))
        else:
            stores = tma_store_descriptors(config, outs) if config.TMA_STORE else ()
            if stores is None:  # these outputs do not suit TMA: pointer stores
                config, stores = dataclasses.replace(config, TMA_STORE=0), ()
            tensors = (a, b, *extra.values(), *(outs[i] for i in range(len(stores))))
            args.update({d.arg: d.make(t) for d, t in zip((*described, *stores), tensors, strict=True)})
            if config.SPLIT_K == 1:
                slots = tile_slots(config, m, n)
                bound = single_launch(
                    kind, problem, config, target, index_64, grid, args, outs, workspace, slots
                )
                return dataclasses.replace(bound, descriptors=(*described, *stores))
    if config.SPLIT_K > 1:
        grid = (*grid, config.SPLIT_K)  # the splits on the third axis
        out3 = (batch, m, n)
        return split_k_bound(kind, problem, config, target, index_64, grid, args, ep_args, outs, out3)
    slots = tile_slots(config, m, n)
    return single_launch(kind, problem, config, target, index_64, grid, args, outs, workspace, slots)


def _persistent_grid(
    kind: TemplateKind, config: Config, tiles: int, k: int, sms: int
) -> tuple[tuple[int], Workspace | None]:
    """The one-axis grid of a persistent or stream-K launch over ``tiles`` output tiles (of
    every batch), and stream-K's workspace of partial tiles (None for persistent)."""
    if config.variant in STREAM_K_VARIANTS:
        grid = (min(sms, stream_k_programs(tiles, triton.cdiv(k, config.BLOCK_K))),)
        return grid, Workspace(grid[0], kind.accumulators * config.BLOCK_M * config.BLOCK_N)
    return (min(sms * config.PROGRAMS_PER_SM, tiles),), None


def tile_slots(config: Config, m: int, n: int) -> tuple[int, int]:
    """The epilogue's tiles along M and along N (its column slices count one each): the
    slots of ordered statistics (``runtime.Statistics``)."""
    return triton.cdiv(m, config.BLOCK_M), triton.cdiv(n, config.BLOCK_N) * config.EPILOGUE_SUBTILE


def stream_k_programs(tiles: int, k_blocks: int) -> int:
    """The programs stream-K shares ``tiles`` x ``k_blocks`` iterations over, at most: each
    share at least half a tile's K blocks (2 at least), so a tile is finished from at most 3
    programs' work. (Shares of one K block left 7 partials for each tile of 512^3 to add one
    after another: 20 us against 6 us whole-tile on an H100.)"""
    return triton.cdiv(tiles * k_blocks, max(2, k_blocks // 2))


def tma_store_descriptors(config: Config, outs: tuple[torch.Tensor, ...]) -> tuple[Described, ...] | None:
    """How TMA_STORE describes each output (one store per epilogue slice), or None when an
    output is not a row-major, 16-byte aligned matrix."""
    if not all(tma_readable(o) for o in outs):
        return None
    block = (config.BLOCK_M, config.BLOCK_N // config.EPILOGUE_SUBTILE)
    return tuple(Described(f"out{i}_desc", f"out{i}_ptr", False, block) for i in range(len(outs)))


def tma_descriptors(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> tuple[Described, ...] | None:
    """How the tma variants describe A, B and the B-side ``extra`` inputs (each as it is
    stored: a column-major operand is described transposed), or None when TMA cannot read
    these tensors (2-D only; unit inner stride; 16-byte aligned outer stride and address)."""
    bs = {"b": b, **(extra or {})}
    if a.dim() != 2 or any(t.dim() != 2 for t in bs.values()):
        return None
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    a_row, b_row = problem.layout_a == "row", problem.layout_b == "row"
    if not (
        tma_readable(a if a_row else a.t()) and all(tma_readable(t if b_row else t.t()) for t in bs.values())
    ):
        return None
    return (
        Described("a_desc", "a_ptr", not a_row, (bm, bk) if a_row else (bk, bm)),
        *(
            Described(f"{name}_desc", f"{name}_ptr", not b_row, (bk, bn) if b_row else (bn, bk))
            for name in bs
        ),
    )


def trivial_bound(
    problem: Problem,
    bt: _Batched,
    outs: tuple[torch.Tensor, ...],
    operands: Mapping[str, torch.Tensor],
    device: torch.device,
) -> Bound | None:
    """A launch that needs no kernel: an empty output, or K = 0 (the epilogue of a zero
    accumulator); None otherwise."""
    batch, m, n, k = bt.batch, bt.a[0][1], bt.b[0][2], bt.a[0][2]
    if batch == 0 or m == 0 or n == 0:

        def empty_statistics() -> None:  # a reduction over no elements: 0 (sum) or -inf (max)
            for i in problem.epilogue.reductions:
                outs[i].fill_(0.0 if problem.epilogue.outputs[i].reduce.endswith("sum") else -math.inf)

        return Bound(outs, empty_statistics, lambda: None)
    if k != 0:
        return None

    def zero_k() -> None:
        zero = torch.zeros(bt.out_shape, dtype=torch.float32, device=device)
        for o, v in zip(outs, problem.epilogue.evaluate(zero, operands, acc2=zero), strict=True):
            o.copy_(RULES["cast"].torch(v, dtype=dtypes.name_of(o.dtype)))  # fp8 saturates

    return Bound(outs, zero_k, lambda: None)


# ------------------------------------------------------------------ the kind

# where the tuner searches (block sizes are capped at the kernel shape when a study starts)
SPACE: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "BLOCK_M": (16, 32, 64, 128, *WARP_GROUP_ROWS, 256),  # 192: sm90_cooperative's (promote_space)
    "BLOCK_N": (16, 32, 64, 128, 256),
    "BLOCK_K": (16, 32, 64, 128, 256),
    "GROUP_M": (1, 4, 8, 16),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3, 4, 5, 6),
    "variant": (*TRITON_VARIANTS, *matmul_sm90.SAME_DTYPE_VARIANTS),  # not the weight-only kinds' own
    "SPLIT_K": (1, 2, 4, 8, 16),  # after the variant: drawn only for the default and tma loops
    "EPILOGUE_SUBTILE": (1, 2, 4),
    "PROGRAMS_PER_SM": (1, 2),
    "FLATTEN": (0, 1),
    "WARP_SPECIALIZE": (0, 1),
    "TMA_STORE": (0, 1),
    "PROMOTE": (1, 2, 4),  # after the variant and SPLIT_K; fp8 exact accumulation only
}

SEEDS = [  # seeds enqueued in every new study (when feasible), after the default config
    # sm_90 GPUs: the Gluon ping-pong, whose epilogue overlaps the other warp group's MMAs
    # (benchmarks/epilogue_cost.py on an H100, RESULTS.md, issue 36); feasible only there
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1),
    Config(64, 256, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1),
    Config(128, 64, 64, 8, num_warps=4, num_stages=6, variant="sm90_pingpong", TMA_STORE=1),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="sm90_persistent", TMA_STORE=1),
    # Hopper main loops: the winners of benchmarks/matmul_hopper.py on an H200 (RESULTS.md)
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma", EPILOGUE_SUBTILE=2),
    Config(
        128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1, EPILOGUE_SUBTILE=2
    ),
    Config(128, 256, 64, 8, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 256, 64, 8, 1, 8, 3, "tma_persistent", EPILOGUE_SUBTILE=2, FLATTEN=1, TMA_STORE=1),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="persistent", FLATTEN=1),
    # the classic loop (any GPU, any layout)
    Config(128, 256, 64, 8, num_warps=8, num_stages=4),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4),
    Config(64, 64, 64, 8, num_warps=4, num_stages=4),
    Config(128, 128, 32, 8, num_warps=4, num_stages=4),
    Config(32, 64, 64, 8, num_warps=4, num_stages=4),
    Config(16, 64, 128, 1, num_warps=2, num_stages=4),
    # two-pass split-K, for few output tiles and a long K (feasible only where tiles underfill)
    Config(128, 128, 64, 8, 2, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 128, 64, 8, 4, num_warps=8, num_stages=4, variant="tma"),
    Config(128, 64, 64, 8, 4, num_warps=4, num_stages=4),
    Config(64, 128, 64, 8, 8, num_warps=4, num_stages=4),
    # stream-K, for a last wave of tiles that would leave SMs idle (feasible only there)
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_stream_k"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma_stream_k"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="stream_k"),
]


# fp8 inputs (one byte an element: K blocks of 128 fit where 16-bit tiles do not), tried first:
# the winners of benchmarks/fp8.py on an H100 (RESULTS.md, issue 21)
FP8_SEEDS = (
    # exact accumulation on sm_90 (infeasible elsewhere, and for fast accumulation): warp groups
    # promoting while the others' MMAs run, outputs by TMA; the best of benchmarks/fp8.py at
    # 8192^3 on an H200, 1.03x _scaled_mm(use_fast_accum=False) (RESULTS.md, issue 44)
    Config(192, 128, 128, 8, num_warps=4, num_stages=4, variant="sm90_cooperative", TMA_STORE=1),
    Config(192, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative"),
    Config(128, 128, 128, 8, num_warps=4, num_stages=5, variant="sm90_cooperative", TMA_STORE=1),
    Config(128, 256, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 256, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", EPILOGUE_SUBTILE=2),
    Config(
        128, 256, 128, 8, num_warps=8, num_stages=4, variant="tma_persistent", FLATTEN=1, EPILOGUE_SUBTILE=2
    ),
    Config(128, 128, 256, 8, num_warps=8, num_stages=3, variant="tma"),
    Config(128, 128, 128, 8, num_warps=8, num_stages=4, variant="tma"),
    Config(64, 128, 128, 8, num_warps=4, num_stages=5, variant="tma"),
    Config(16, 64, 128, 8, num_warps=4, num_stages=4),
    # exact accumulation (promotion every 256 elements of K): the best of benchmarks/fp8.py at
    # 8192^3 on an H100, 0.79x _scaled_mm(use_fast_accum=False) (RESULTS.md, issue 44)
    Config(128, 128, 256, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1, PROMOTE=2),
)


def device_default(problem: Problem, config: Config, capability: str, sm_count: int) -> Config:
    """Untuned fp8 with exact accumulation on sm_90: the cooperative kernel of ``FP8_SEEDS``
    where its tiles fill the GPU (``matmul_sm90.cooperative_default``); else the heuristic."""
    if problem.dtype not in dtypes.FP8_DTYPES or problem.precision != "ieee":
        return config
    return matmul_sm90.cooperative_default(KIND, problem, config, capability, sm_count, FP8_SEEDS)


def output_shape(problem: Problem) -> tuple[int, ...]:
    """The outputs' shape: [batch,] M, N (3-D when the inputs are)."""
    s = problem.shape
    m, n = int(s.m), int(s.n)
    return (int(s.batch), m, n) if problem.op in BATCHED_OPS or s.batch != 1 else (m, n)


def matmul_input_elements(problem: Problem) -> tuple[int, int]:
    s = problem.shape
    batch, m, n, k = int(s.batch), int(s.m), int(s.n), int(s.k)
    return batch * m * k, (batch if problem.op in BATCHED_OPS else 1) * k * n


def matmul_output_specs(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> list[OutputSpec]:
    """Contiguous outputs of [batch,] M, N from the inputs' sizes (a batch of 1 broadcasts)."""
    batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
    batch = [max(batches)] if len(batches) == 2 else batches
    return contiguous_specs(problem, (*batch, a.shape[-2], b.shape[-1]))


def contiguous_specs(problem: Problem, shape: tuple[object, ...]) -> list[OutputSpec]:
    """Contiguous outputs when the tile outputs have ``shape`` (reduction outputs lack N or M)."""
    specs = []
    for o in problem.epilogue.outputs:
        sizes = o.shape(shape)
        specs.append((tuple(sizes), tuple(math.prod(sizes[i + 1 :]) for i in range(len(sizes)))))
    return specs


def empty_matmul_outputs(problem: Problem, device: torch.device) -> tuple[torch.Tensor, ...]:
    shape = output_shape(problem)
    return tuple(
        torch.empty(o.shape(shape), dtype=dtypes.torch_dtype(o.dtype), device=device)
        for o in problem.epilogue.outputs
    )


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    """The sm90 variants' own (the Triton loops need none beyond the common ones)."""
    return matmul_sm90.render_vars(problem, config) if config.variant in matmul_sm90.VARIANTS else {}


def source(config: Config) -> str | None:
    """The Jinja file of the sm90 variants (Gluon); None for the kind's own (its first file:
    kinds built on the matmul's, gemv's and the dual ones, keep theirs)."""
    return matmul_sm90.SOURCE if config.variant in matmul_sm90.VARIANTS else None


KIND = TemplateKind(
    name="matmul",
    files=FILES,
    render_vars=render_vars,
    source=source,
    ops=("mm", "addmm", "bmm", "baddbmm", "matmul"),
    library="cublas",
    input_args=("a_ptr", "b_ptr"),
    space=SPACE,
    seeds=tuple(SEEDS),
    check=config_error,
    default_config=default_matmul_config,
    kernel_shape=lambda problem: problem.shape,
    problem_of=matmul_problem_of,
    bind=bind_matmul,
    output_specs=matmul_output_specs,
    empty_outputs=empty_matmul_outputs,
    inputs=matmul_inputs,
    reference=lambda problem, a, b, operands: reference(problem.epilogue, a, b, operands),
    baseline=eager_matmul,
    input_elements=matmul_input_elements,
    search_error=matmul_search_error,
    applies=applies,
    narrow=promote_space,
    split_k_underfilled=True,
    input_dtypes=dtypes.INPUT_DTYPES,
    reductions=True,
    groups=True,
    dtype_seeds=tuple((dt, FP8_SEEDS) for dt in dtypes.FP8_DTYPES),
    device_default=device_default,
    device_error=matmul_sm90.device_error,
    output_staging=matmul_sm90.staging_copies,
    stream_k=lambda config: config.variant in STREAM_K_VARIANTS,
    spec_module="epilab.templates.gemm.gemm_spec",
)
