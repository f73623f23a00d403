"""Which configs the matmul kinds take: the variants and knobs, the rules a config must meet for a
problem (loops, column groups, fp8 promotion), which knobs apply to a variant, and the search's
rules (idle threads, warp specialization); the matmul family's kinds build on them.
"""

from __future__ import annotations

from collections.abc import Mapping

from epilab.ir import dtypes
from epilab.ir.config import Config, extend
from epilab.ir.problem import BATCHED_OPS, Problem
from epilab.templates.gemm import matmul_sm90
from epilab.templates.gemm.knobs import PERSISTENT_KNOBS
from epilab.templates.gemm.ops import WEIGHT_ONLY_OPS

# tma: operand tiles through tensor descriptors (Hopper); persistent: one program per SM
# looping over the tiles; tma_persistent: both; stream_k (and tma_stream_k): one program per SM,
# whole waves of tiles and then the tail's K iterations shared evenly across tile boundaries;
# sm90_persistent and sm90_pingpong: Gluon kernels for Hopper whose epilogue overlaps the
# tensor cores' work (matmul_sm90.py)
TRITON_VARIANTS = ("default", "tma", "persistent", "tma_persistent", "stream_k", "tma_stream_k")


VARIANTS = extend("variant", (*TRITON_VARIANTS, *matmul_sm90.VARIANTS))


TMA_VARIANTS = ("tma", "tma_persistent", "tma_stream_k")


PERSISTENT_VARIANTS = ("persistent", "tma_persistent")


STREAM_K_VARIANTS = ("stream_k", "tma_stream_k")


SPLIT_K_VARIANTS = ("default", "tma")  # two-pass split-K (templates/split_k.py.jinja)


TMA_ALIGN_BYTES = 16  # TMA needs 16-byte aligned strides (and base addresses)


FP8_MIN_BLOCK_K = 32  # an fp8 MMA instruction takes 32 K elements


# fp8 exact accumulation (precision "ieee", use_fast_accum=False): the tensor cores sum at most
# this many K elements before the sum is added in fp32 (PROMOTE x BLOCK_K). Measured against
# float64 on an H100 (benchmarks/RESULTS.md): an interval of 128 gives exactly
# cuBLASLt's use_fast_accum=False error; 256 gives 1.7x it on signed data and 3.4x on same-sign
# data, still 15-100x below the whole-K accumulation of use_fast_accum=True at K = 16384
EXACT_PROMOTION_MAX_K = 256


PROMOTE_VARIANTS = ("default", "tma", "persistent", "tma_persistent")  # K loops over the whole of K


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


WARP_GROUP_ROWS = (192,)  # BLOCK_M of three 64-row warp groups: sm90_cooperative's only


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
