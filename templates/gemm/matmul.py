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
from typing import NamedTuple

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import (
    BATCHED_OPS,
    WEIGHT_ONLY_OPS,
    Config,
    Geometry,
    Problem,
    Shape,
    applied_precision,
)
from epilab.ir.rules import RULES
from epilab.templates.bound import Bound, Described, Workspace
from epilab.templates.gemm import matmul_sm90
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
# tma: operand tiles through tensor descriptors (Hopper); persistent: one program per SM
# looping over the tiles; tma_persistent: both; stream_k (and tma_stream_k): one program per SM,
# whole waves of tiles and then the tail's K iterations shared evenly across tile boundaries;
# sm90_persistent and sm90_pingpong: Gluon kernels for Hopper whose epilogue overlaps the
# tensor cores' work (matmul_sm90.py)
TRITON_VARIANTS = ("default", "tma", "persistent", "tma_persistent", "stream_k", "tma_stream_k")
VARIANTS = (*TRITON_VARIANTS, *matmul_sm90.VARIANTS)
TMA_VARIANTS = ("tma", "tma_persistent", "tma_stream_k")
PERSISTENT_VARIANTS = ("persistent", "tma_persistent")
STREAM_K_VARIANTS = ("stream_k", "tma_stream_k")
SPLIT_K_VARIANTS = ("default", "tma")  # two-pass split-K (templates/split_k.py.jinja)
# the matmul's own knobs (the other kinds leave them at their defaults)
HOPPER_KNOBS = (
    "EPILOGUE_SUBTILE",
    "PROGRAMS_PER_SM",
    "FLATTEN",
    "WARP_SPECIALIZE",
    "TMA_STORE",
    "PROMOTE",
    "SWAP_AB",
)
PERSISTENT_KNOBS = ("PROGRAMS_PER_SM", "FLATTEN", "WARP_SPECIALIZE")
TMA_ALIGN_BYTES = 16  # TMA needs 16-byte aligned strides (and base addresses)
FP8_MIN_BLOCK_K = 32  # an fp8 MMA instruction takes 32 K elements
# fp8 exact accumulation (precision "ieee", use_fast_accum=False): the tensor cores sum at most
# this many K elements before the sum is added in fp32 (PROMOTE x BLOCK_K). Measured against
# float64 on an H100 (benchmarks/RESULTS.md): an interval of 128 gives exactly
# cuBLASLt's use_fast_accum=False error; 256 gives 1.7x it on signed data and 3.4x on same-sign
# data, still 15-100x below the whole-K accumulation of use_fast_accum=True at K = 16384
EXACT_PROMOTION_MAX_K = 256
PROMOTE_VARIANTS = ("default", "tma", "persistent", "tma_persistent")  # K loops over the whole of K


def hopper_knobs_error(config: Config) -> str | None:
    """For the other templates: the matmul's Hopper knobs must keep their defaults."""
    if any(getattr(config, k) != getattr(Config(16, 16, 16), k) for k in HOPPER_KNOBS):
        return f"only the matmul template has the knobs {sorted(HOPPER_KNOBS)}; leave them at their defaults"
    return None


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the matmul template for ``problem`` (None when it does)."""
    return loop_error(problem, config)


def loop_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the matmul template's main loops for ``problem``."""
    if config.variant not in VARIANTS:
        return f"the matmul template has no variant {config.variant!r}; use one of {VARIANTS}"
    why = group_error(problem, config)
    if why is not None:
        return why
    if config.SWAP_AB and problem.op not in WEIGHT_ONLY_OPS:
        return (
            f"SWAP_AB swaps a weight-only problem's dot (its fp8 weight converted in registers); "
            f"a {problem.op} problem leaves it at 0"
        )
    if config.SWAP_AB and config.variant in STREAM_K_VARIANTS:
        return (
            "SWAP_AB runs on the classic, TMA and persistent loops (split-K too), not stream-K: "
            "tma_stream_k swapped computed wrong sums on an H200 (RESULTS.md, 2026-11-30)"
        )
    if config.variant in matmul_sm90.VARIANTS:
        if (config.PROGRAMS_PER_SM, config.FLATTEN, config.WARP_SPECIALIZE) != (1, 0, 0):
            return "PROGRAMS_PER_SM, FLATTEN and WARP_SPECIALIZE apply to the persistent variants only"
        return matmul_sm90.config_error(problem, config)
    if problem.dtype in dtypes.FP8_DTYPES and config.BLOCK_K < FP8_MIN_BLOCK_K:
        return f"fp8 dots take K blocks of {FP8_MIN_BLOCK_K} or more, not BLOCK_K={config.BLOCK_K}"
    why = promote_error(problem, config)
    if why is not None:
        return why
    if config.SPLIT_K > 1:
        if config.variant not in SPLIT_K_VARIANTS:
            return f"split-K runs on the {' and '.join(SPLIT_K_VARIANTS)} loops, not {config.variant!r}"
        if config.EPILOGUE_SUBTILE != 1 or config.TMA_STORE:
            return "with split-K the reduction runs the epilogue: leave EPILOGUE_SUBTILE=1, TMA_STORE=0"
    if config.BLOCK_N // config.EPILOGUE_SUBTILE < 16:
        return f"EPILOGUE_SUBTILE={config.EPILOGUE_SUBTILE} slices BLOCK_N={config.BLOCK_N} below 16 columns"
    persistent = config.variant in PERSISTENT_VARIANTS
    if not persistent and (config.PROGRAMS_PER_SM, config.FLATTEN, config.WARP_SPECIALIZE) != (1, 0, 0):
        return "PROGRAMS_PER_SM, FLATTEN and WARP_SPECIALIZE apply to the persistent variants only"
    if specialized(config) and config.BLOCK_M > 64:
        return (
            f"WARP_SPECIALIZE with BLOCK_M={config.BLOCK_M}: Triton 3.6 splits a tile of over 64 rows "
            "over two consumer warp groups, and that kernel hangs on Hopper; take BLOCK_M <= 64, "
            "8 warps, or WARP_SPECIALIZE=0"
        )
    if config.variant not in TMA_VARIANTS:
        return "TMA_STORE needs a tma variant" if config.TMA_STORE else None
    s = problem.shape
    if s.batch != 1 or problem.op in BATCHED_OPS or "strided" in (problem.layout_a, problem.layout_b):
        return "the tma variants take 2-D problems with row- or column-major A and B"
    # The leading stride of each operand as stored (contiguous): TMA needs it 16-byte aligned
    leading = {"a": s.k if problem.layout_a == "row" else s.m, "b": s.n if problem.layout_b == "row" else s.k}
    for name, dim in leading.items():
        if isinstance(dim, int) and dim * dtypes.itemsize(problem.dtype) % TMA_ALIGN_BYTES:
            return (
                f"the tma variants need 16-byte aligned rows; {name.upper()}'s rows of {dim} "
                f"{problem.dtype} elements are not"
            )
    if config.TMA_STORE:
        if problem.epilogue.reductions:
            return "TMA_STORE stores tiles: an epilogue with reduction outputs stores by pointers"
        for out in problem.epilogue.outputs:
            if out.dtype == "bool":
                return "TMA_STORE cannot store bool outputs"
            if isinstance(s.n, int) and s.n * dtypes.itemsize(out.dtype) % TMA_ALIGN_BYTES:
                return f"TMA_STORE needs 16-byte aligned output rows; rows of {s.n} {out.dtype} are not"
    return None


def group_error(problem: Problem, config: Config) -> str | None:
    """What column groups (``Epilogue.group_size``) ask of a config: each epilogue slice holds
    whole groups (BLOCK_N / EPILOGUE_SUBTILE a multiple of the width; on the Gluon kernels one
    group: BLOCK_N the width). The Triton loops store every output by pointers; the Gluon
    kernels stage their tile outputs for TMA (``matmul_sm90.staged_outputs``) and store the
    group outputs by pointers."""
    width = problem.epilogue.group_size
    if not width:
        return None
    if config.variant in matmul_sm90.VARIANTS and width != config.BLOCK_N:
        return (
            f"the {config.variant} variant takes column groups one a tile: BLOCK_N = {width}, the "
            f"group's width (its MMA layout does not take the reshape of wider tiles), not {config.BLOCK_N}"
        )
    if config.TMA_STORE and config.variant not in matmul_sm90.VARIANTS:
        return "TMA_STORE stores tiles: an epilogue with group outputs stores by pointers"
    if config.BLOCK_N // config.EPILOGUE_SUBTILE % width:
        return (
            f"groups of {width} columns: BLOCK_N / EPILOGUE_SUBTILE must be a multiple of {width}, "
            f"got {config.BLOCK_N} / {config.EPILOGUE_SUBTILE}"
        )
    return None


def promotes(problem: Problem) -> bool:
    """Whether ``problem``'s dots promote partial sums (fp8 inputs, exact accumulation)."""
    return problem.dtype in dtypes.FP8_DTYPES and problem.precision == "ieee"


def promote_error(problem: Problem, config: Config) -> str | None:
    """Why ``config``'s promotion interval does not fit ``problem`` (None when it does): PROMOTE
    > 1 is for exact fp8 accumulation on the loops over the whole of K, within the bound."""
    if config.PROMOTE == 1:
        return None
    if not promotes(problem):
        inputs = f"{problem.dtype} ({problem.precision})"
        return f"PROMOTE applies to fp8 inputs with exact accumulation, not {inputs}"
    if config.variant not in PROMOTE_VARIANTS or config.SPLIT_K > 1:
        return f"PROMOTE > 1 runs on the {', '.join(PROMOTE_VARIANTS)} loops without split-K"
    return None


def exact_promotion_error(problem: Problem, config: Config) -> str | None:
    """The tuner's rule for exact fp8 accumulation: the tensor cores sum at most
    ``EXACT_PROMOTION_MAX_K`` elements of K before the fp32 add (the documented error bound)."""
    if promotes(problem) and config.PROMOTE * config.BLOCK_K > EXACT_PROMOTION_MAX_K:
        return (
            f"exact fp8 accumulation promotes every {EXACT_PROMOTION_MAX_K} elements of K at most; "
            f"PROMOTE={config.PROMOTE} x BLOCK_K={config.BLOCK_K} is {config.PROMOTE * config.BLOCK_K}"
        )
    return None


def promote_space(problem: Problem, space: Mapping[str, tuple]) -> Mapping[str, tuple]:
    """The matmul's space for ``problem``: PROMOTE, and BLOCK_M 192 (sm90_cooperative's three
    warp groups), only where the dots promote; elsewhere the search draws from the space it had
    before them (a value no config can take skews TPE: the landscape test measured it)."""
    if promotes(problem):
        return space
    narrowed = {k: v for k, v in space.items() if k != "PROMOTE"}
    if "BLOCK_M" in narrowed:
        narrowed["BLOCK_M"] = tuple(v for v in narrowed["BLOCK_M"] if v not in WARP_GROUP_ROWS)
    return narrowed


def applies(name: str, chosen: Mapping[str, object]) -> bool:
    """Whether search dimension ``name`` means anything given the values chosen before it:
    the persistent loop's knobs for the persistent variants, TMA_STORE for the tma ones, and
    WARP_SPECIALIZE only where Triton 3.6 specializes the loop without aborting or hanging (the
    rules of ``warp_specialize_error`` and ``loop_error``, so the sampler never draws a config
    they reject)."""
    variant = chosen.get("variant", "default")
    if name == "WARP_SPECIALIZE":
        return (
            variant == "tma_persistent"
            and chosen.get("num_warps") == 4
            and not chosen.get("FLATTEN")
            and chosen.get("BLOCK_M", 0) <= 64
        )
    if name in PERSISTENT_KNOBS:
        return variant in PERSISTENT_VARIANTS
    if name == "TMA_STORE":
        stores = (*TMA_VARIANTS, *matmul_sm90.SAME_DTYPE_VARIANTS)
        return variant in stores and chosen.get("SPLIT_K", 1) == 1
    if name == "EPILOGUE_SUBTILE":
        return chosen.get("SPLIT_K", 1) == 1 and variant not in matmul_sm90.VARIANTS
    if name == "SPLIT_K":
        return variant in SPLIT_K_VARIANTS
    if name == "PROMOTE":
        return variant in PROMOTE_VARIANTS and chosen.get("SPLIT_K", 1) == 1
    if name == "SWAP_AB":  # the Triton loops' (the weight-only Gluon kernel is swapped always)
        return variant not in (*STREAM_K_VARIANTS, *matmul_sm90.VARIANTS)
    return True


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
    tensors = [a, b, *extra.values(), *outs, *operands.values()]
    index_64 = any(extent(t) > INT32_MAX for t in tensors) or batch * m * n > INT32_MAX
    grid = (triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N), batch)
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
        sms = sm_count(a.device)
        if config.variant in STREAM_K_VARIANTS:
            grid = (min(sms, stream_k_programs(grid[0] * batch, triton.cdiv(k, config.BLOCK_K))),)
            workspace = Workspace(grid[0], kind.accumulators * config.BLOCK_M * config.BLOCK_N)
        else:
            grid = (min(sms * config.PROGRAMS_PER_SM, grid[0] * batch),)
        args.update(BATCH=batch, NUM_SMS=grid[0])
    if config.variant in TMA_VARIANTS:
        described = tma_descriptors(problem, config, a, b, extra)
        if described is None:  # these tensors' strides or addresses do not suit TMA: no descriptors
            plain = {"tma": "default", "tma_persistent": "persistent"}.get(config.variant, "stream_k")
            config = dataclasses.replace(config, variant=plain)
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


def reference(
    epilogue: Epilogue, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs computed in float64 (on the inputs' device), before output rounding."""
    acc64 = torch.matmul(a.double(), b.double())
    return epilogue.evaluate(acc64, {k: v.double() for k, v in operands.items()})


def random_tensor(
    rows: int,
    cols: int,
    batch: int | None,
    layout: str,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> torch.Tensor:
    """Random values of ``dtype`` [batch,] rows x cols in ``layout`` (col: a transposed
    view; strided: every other column of a twice-as-wide tensor)."""
    lead = () if batch is None else (batch,)
    if dtype == torch.bool:
        return torch.rand((*lead, rows, cols), generator=gen, device=device) > 0.5
    stored = {"col": (*lead, cols, rows), "strided": (*lead, rows, 2 * cols)}.get(layout, (*lead, rows, cols))
    t = torch.randn(stored, generator=gen, device=device).to(dtype)
    if layout == "col":
        return t.transpose(-1, -2)
    return t[..., ::2] if layout == "strided" else t


def matmul_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator, *, b_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, B and operands with exactly the problem's shapes, dtypes and layouts (B of
    ``b_dtype`` where given: a weight-only problem's)."""
    s = problem.shape
    dtype = dtypes.torch_dtype(problem.dtype)
    batch = int(s.batch) if problem.op in BATCHED_OPS or s.batch != 1 else None
    m, n, k = int(s.m), int(s.n), int(s.k)
    a = random_tensor(m, k, batch, problem.layout_a, dtype, device, gen)
    b = random_tensor(k, n, batch, problem.layout_b, b_dtype or dtype, device, gen)
    broadcasts = dict(problem.epilogue.operands)
    operands = {}
    for spec in problem.operands:
        odt, broadcast = dtypes.torch_dtype(spec.dtype), broadcasts[spec.name]
        if broadcast == "row":
            operands[spec.name] = random_tensor(1, n, None, "row", odt, device, gen)[0]
        elif broadcast == "col":
            operands[spec.name] = random_tensor(m, 1, None, "row", odt, device, gen)
        elif broadcast == "scalar":
            operands[spec.name] = random_tensor(1, 1, None, "row", odt, device, gen)[0]
        else:
            operands[spec.name] = random_tensor(m, n, batch, spec.layout, odt, device, gen)
    return a, b, operands


# ------------------------------------------------------------------ the kind

WARP_GROUP_ROWS = (192,)  # BLOCK_M of three 64-row warp groups: sm90_cooperative's only
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


MIN_ACC_PER_THREAD = 4  # fewer accumulator elements per thread wastes warps


def idle_threads_error(config: Config) -> str | None:
    """A tiled template's search rule: each thread holds at least 4 accumulator elements."""
    if config.BLOCK_M * config.BLOCK_N // (32 * config.num_warps) < MIN_ACC_PER_THREAD:
        return f"{config.num_warps} warps for a {config.BLOCK_M}x{config.BLOCK_N} tile leave threads idle"
    return None


def specialized(config: Config) -> bool:
    """Whether Triton 3.6 warp-specializes the config's loop on Hopper (found by compiling every
    persistent config for sm_90a, docs/design.md): WARP_SPECIALIZE on the tma_persistent loop
    with 4 warps, not flattened. With 8 warps, or flattened, the pass leaves the kernel as it is."""
    return (
        bool(config.WARP_SPECIALIZE)
        and config.variant == "tma_persistent"
        and config.num_warps == 4
        and not config.FLATTEN
    )


def warp_specialize_error(config: Config) -> str | None:
    """The search's rule: WARP_SPECIALIZE only where Triton specializes (``specialized``);
    over pointer loads (persistent) it asserts (WSLowerToken). A tile of over 64 rows,
    split over two consumer warp groups, is refused by ``loop_error``: it hung on an H100 on
    every mm tried (and aborted at compile with epilogue slices or a TMA store)."""
    if config.WARP_SPECIALIZE and not specialized(config):
        return "WARP_SPECIALIZE: Triton 3.6 specializes only tma_persistent with 4 warps, not flattened"
    return None


def matmul_search_error(problem: Problem, config: Config) -> str | None:
    """The tuner's rules for the matmul kinds: idle threads, warp specialization only where
    Triton does it, and exact fp8 accumulation within its error bound."""
    return (
        idle_threads_error(config) or warp_specialize_error(config) or exact_promotion_error(problem, config)
    )


def output_shape(problem: Problem) -> tuple[int, ...]:
    """The outputs' shape: [batch,] M, N (3-D when the inputs are)."""
    s = problem.shape
    m, n = int(s.m), int(s.n)
    return (int(s.batch), m, n) if problem.op in BATCHED_OPS or s.batch != 1 else (m, n)


def matmul_input_elements(problem: Problem) -> tuple[int, int]:
    s = problem.shape
    batch, m, n, k = int(s.batch), int(s.m), int(s.n), int(s.k)
    return batch * m * k, (batch if problem.op in BATCHED_OPS else 1) * k * n


def eager_matmul(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """cuBLAS (torch.matmul; fp8: cuBLASLt's torch._scaled_mm) then the epilogue in eager torch."""
    if problem.dtype in dtypes.FP8_DTYPES:
        return eager_scaled_mm(problem, a, b, operands)
    return tuple(problem.epilogue.evaluate(torch.matmul(a, b), dict(operands)))


class ScaledPrefix(NamedTuple):
    """What an fp8 epilogue starts with that ``torch._scaled_mm`` does itself."""

    scale_a: str | None  # operand of one element or one per row (None: no scale)
    scale_b: str | None  # operand of one element or one per column
    bias: str | None  # operand of one per column, added after the scales
    scaled: int  # the node of ``acc * scale_a * scale_b``
    node: int  # the node of ``acc * scale_a * scale_b + bias``


def scaled_mm_prefix(epilogue: Epilogue) -> ScaledPrefix:
    """The scales and bias an fp8 epilogue starts with (``acc * scale_a * scale_b + bias``,
    any of them missing), as ``torch._scaled_mm`` takes them."""
    users: dict[int, list[int]] = {}
    for i, n in enumerate(epilogue.nodes):
        for arg in n.args:
            users.setdefault(arg, []).append(i)
    found: dict[str, str] = {}
    node = next(i for i, n in enumerate(epilogue.nodes) if n.op == "acc")
    scaled = node
    for side, op, broadcasts in (
        ("a", "mul", ("scalar", "col")),
        ("b", "mul", ("scalar", "row")),
        ("bias", "add", ("row",)),
    ):
        after = users.get(node, [])
        if len(after) != 1 or epilogue.nodes[after[0]].op != op:
            break
        other = [epilogue.nodes[x] for x in epilogue.nodes[after[0]].args if x != node]
        if len(other) != 1 or other[0].op != "operand" or other[0].attr["broadcast"] not in broadcasts:
            break
        found[side], node = str(other[0].attr["name"]), after[0]
        scaled = node if side != "bias" else scaled
    return ScaledPrefix(found.get("a"), found.get("b"), found.get("bias"), scaled, node)


def eager_scaled_mm(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """``torch._scaled_mm`` (cuBLASLt; A row-major and B column-major, as it needs) with the
    epilogue's leading scales and bias, out in bfloat16, then the rest of the epilogue in eager
    torch. Where cuBLASLt has no algorithm for the bias (rowwise scales at M = 16, K = 14336
    on an H100 with torch 2.11), the bias is added in eager torch too."""
    prefix = scaled_mm_prefix(problem.epilogue)
    one = torch.ones((), dtype=torch.float32, device=a.device)
    sa = one if prefix.scale_a is None else operands[prefix.scale_a].float()
    sb = one if prefix.scale_b is None else operands[prefix.scale_b].float()
    sa = sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(())
    sb = sb.reshape(1, -1) if sb.numel() > 1 else sb.reshape(())

    def scaled_mm(bias: str | None) -> torch.Tensor:
        return torch._scaled_mm(
            a.contiguous(),
            b.t().contiguous().t(),
            sa,
            sb,
            bias=None if bias is None else operands[bias].to(torch.bfloat16).reshape(-1),
            out_dtype=torch.bfloat16,
            use_fast_accum=problem.precision == "fast",
        )

    node = prefix.node
    try:
        out = scaled_mm(prefix.bias)
    except RuntimeError:
        if prefix.bias is None:
            raise
        out, node = scaled_mm(None), prefix.scaled
    return tuple(problem.epilogue.evaluate(out, dict(operands), given={node: out}))


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
