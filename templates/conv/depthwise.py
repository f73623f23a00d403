"""The depthwise template's Python half: a direct depthwise convolution (one input channel
per group, 1 or 2 output channels per input channel) with a fused epilogue.

    out[n, k, p, q] = epilogue(sum_{r, s} x[n, k // mult, h, w] * weight[k, 0, r, s], operands)

Its problems are conv2d problems (``ConvGeometry``, op conv2d) that the conv2d kind would
run as an implicit GEMM with a reduction of only R * S: this kind is their twin
(``twins``), and its untuned heuristic is preferred. A program walks TILE_H output rows
down a strip BLOCK_M / TILE_H pixels wide for BLOCK_N channels, one row per step, the filter
taps and the rows in flight in registers, each input pixel loaded once
(``depthwise.py.jinja``: lanes along the channels, for NHWC; the ``w_vector`` variant's
``depthwise_w_vector.py.jinja``: lanes along the strip's pixels, for NCHW); the epilogue
runs on each row of the strip and sees
the same [N, P*Q, K] GEMM view as the conv2d kind's, so its operands, outputs and statistics
(per pixel over the channels, per image and channel over the pixels) are the conv2d kind's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import triton

from epilab.ir.config import SHARED, Config, Knob, declare, extend
from epilab.ir.problem import Problem, Shape
from epilab.templates.bound import Bound
from epilab.templates.conv import conv_geometry
from epilab.templates.conv.conv2d import (
    conv_call,
    conv_input_elements,
    conv_inputs,
    conv_problem_of,
    conv_reference,
    eager_conv,
    empty_conv_outputs,
    output_specs,
)
from epilab.templates.conv.conv_geometry import ConvGeometry, conv_of
from epilab.templates.kind import TemplateKind
from epilab.templates.runtime.binding import single_launch, target_for
from epilab.templates.runtime.render import EPILOGUE_FILES, kernel_hash

FILES = ("depthwise.py.jinja", "depthwise_w_vector.py.jinja", *EPILOGUE_FILES)
MULTIPLIERS = (1, 2)  # output channels per input channel
MAX_TAPS = 9  # the largest kernel side it unrolls
MAX_STEP = 4  # the largest stride and dilation it unrolls
# the most channels a program holds: an epilogue that sums over a pixel's channels in the tile
# (``row_total``: a LayerNorm normalised in the epilogue) takes BLOCK_N >= K, up to this
MAX_ROW_CHANNELS = 512
# the channel blocks searched without row totals (wider ones only hold a LayerNorm's rows)
PLAIN_CHANNELS = 128
# num_stages: input rows are loaded this many steps ahead. 2 paid on two NCHW layers of five
# (13-16%) and on no NHWC layer; 3 was within 2% of 2 where 2 paid (the H100 sweep,
# benchmarks/RESULTS.md)
MAX_PREFETCH = 2
MIN_PIXELS = min(SHARED["BLOCK_M"])  # the fewest pixels a program (BLOCK_M) may cover
# output rows a program walks down (BLOCK_M pixels: a strip BLOCK_M / TILE_H wide)
(TILE_H,) = declare(Knob("TILE_H", (1, 2, 4, 8, 16, 32, 64), 1, "rows{}"))
extend("BLOCK_M", (512, 1024))  # a strip's pixels
extend("BLOCK_N", (512,))  # a program holding a pixel's channels (a LayerNorm's rows)
# default: lanes along the channels (NHWC), the strip's row unrolled, the window of input rows
# an output row reads sliding through registers (``plan``); in_flight: the same lanes, the output
# rows in flight rolling through registers instead (fewer registers: two channels a lane, dilated
# rows); w_vector: lanes along the strip's pixels (W contiguous: NCHW), the row one vector
VARIANTS = extend("variant", ("default", "w_vector", "in_flight"))
WIDTHS = {  # a strip's width in pixels (BLOCK_M / TILE_H)
    "default": (2, 4, 8, 16),
    "in_flight": (2, 4, 8, 16),
    "w_vector": (4, 8, 16, 32, 64, 128),
}


def geometry_error(problem: Problem) -> str | None:
    """Why a problem is not a depthwise convolution this template runs, or None."""
    g = conv_of(problem)
    if g is None:
        return "the depthwise template needs a conv2d problem"
    why = conv_geometry.problem_error(problem)
    if why is not None:
        return why
    mult = int(problem.shape.n) // g.c
    if g.c_per_group != 1 or int(problem.shape.n) % g.c or mult not in MULTIPLIERS:
        return (
            f"the depthwise template runs groups = C with {MULTIPLIERS} output channels per input "
            f"channel; this convolution has {g.groups} groups of {g.c_per_group} input and "
            f"{int(problem.shape.n) // g.groups} output channels"
        )
    if max(g.r, g.s) > MAX_TAPS or max(*g.stride, *g.dilation) > MAX_STEP:
        return (
            f"the depthwise template unrolls kernels up to {MAX_TAPS}x{MAX_TAPS} with stride and "
            f"dilation up to {MAX_STEP}; got {g.r}x{g.s}, stride {g.stride}, dilation {g.dilation}"
        )
    return None


def tile_width(config: Config) -> int:
    return config.BLOCK_M // config.TILE_H


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the depthwise template for ``problem`` (None when it does)."""
    why = geometry_error(problem)
    if why is not None:
        return why
    fixed = {"BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1}
    wrong = [f"{name}={getattr(config, name)!r}" for name, v in fixed.items() if getattr(config, name) != v]
    wrong += [f"{name}={value!r}" for name, value in config.knobs if name != TILE_H.name]  # other kinds'
    if wrong:
        return f"the depthwise template has no K blocks, groups or splits; it got {', '.join(wrong)}"
    if config.num_stages > MAX_PREFETCH:
        return (
            f"the depthwise template loads its input rows 1 to {MAX_PREFETCH} steps ahead "
            f"(num_stages); got {config.num_stages}"
        )
    if config.variant not in VARIANTS:
        return f"the depthwise template has no variant {config.variant!r}; use one of {VARIANTS}"
    k = int(problem.shape.n)
    if problem.epilogue.row_totals and k > config.BLOCK_N:
        return (
            f"the epilogue sums over each pixel's {k} channels (row_total), so one program holds "
            f"them all: BLOCK_N >= {k}; got BLOCK_N={config.BLOCK_N}"
        )
    widths = WIDTHS[config.variant]
    if config.TILE_H > config.BLOCK_M or tile_width(config) not in widths:
        return (
            f"a depthwise strip ({config.variant}) is TILE_H rows of BLOCK_M / TILE_H pixels, one of "
            f"{widths}; BLOCK_M={config.BLOCK_M}, TILE_H={config.TILE_H}"
        )
    return None


def row_error(problem: Problem) -> str | None:
    """Why a program cannot hold every channel of a pixel of ``problem``'s output, or None."""
    why = geometry_error(problem)
    if why is not None:
        return why
    if int(problem.shape.n) > MAX_ROW_CHANNELS:
        return (
            f"a depthwise program holds at most {MAX_ROW_CHANNELS} channels (its filter and rows "
            f"in flight sit in registers); this convolution has {int(problem.shape.n)}"
        )
    return None


def row_channels(problem: Problem) -> int:
    """The channel block that holds a pixel's every channel: the power of two from K, 16 at least."""
    return max(16, triton.next_power_of_2(int(problem.shape.n)))


CHANNEL_LANES = ("default", "in_flight")  # the variants of depthwise.py.jinja


def source(config: Config) -> str | None:
    """The Jinja file of ``config``'s variant (None: the kind's first, depthwise.py.jinja)."""
    return "depthwise_w_vector.py.jinja" if config.variant == "w_vector" else None


def plan(g: ConvGeometry, tile_w: int, window: bool = True) -> dict[str, object]:
    """What the template unrolls for one step down a strip ``tile_w`` pixels wide: with
    ``window`` and no H dilation (``rolled``), the window of input rows an output row reads
    (the rows carried from the step before, the ones a step loads); else the output rows in
    flight and the input rows a step loads (offsets from ``o * stride``, each with the (row in
    flight, filter row) pairs that read it); the strip's input columns; and the join tree
    that gathers a row's accumulators into one [tile_w, BLOCK_N] tile.

    The window computes each output row once: the rows in flight also run their warm-up steps
    (the rows above the strip) and the last steps' FMAs into rows below it, 27% of the FMAs of a
    16-row strip of a 7x7 kernel, and the epilogue on each warm-up step; the window holds R - 1
    input rows instead of the rows in flight (84 registers a channel against 56 for 7x7 on an
    8-pixel strip). On an H100 the window ran 0.84-1.32x the rows in flight, best config
    against best (geomean 1.09x, 23 NHWC layers), but 0.47-0.80x with two channels a lane, and
    0.76-0.93x on 11 of 95 one-a-lane configs (``benchmarks/RESULTS.md``): both are searched."""
    (sh, dh), r = (g.stride[0], g.dilation[0]), g.r
    rolled = window and dh == 1  # the window slides; dilated rows: the output rows in flight roll
    carried = max(0, r - sh)  # window rows a step keeps from the one before
    in_flight = (r - 1) * dh // sh + 1  # output rows whose windows overlap one input row
    first_row = (r - 1) * dh - sh + 1  # the first input row a step loads, after o * stride
    steps = []
    for d in range(sh):
        uses = [
            (f, (first_row + d - f * sh) // dh)
            for f in range(in_flight)
            if first_row + d - f * sh >= 0
            and (first_row + d - f * sh) % dh == 0
            and (first_row + d - f * sh) // dh < r
        ]
        if uses:
            steps.append((d, uses))
    cols = sorted({j * g.stride[1] + s * g.dilation[1] for j in range(tile_w) for s in range(g.s)})
    bits = tile_w.bit_length() - 1
    leaves = []
    for pos in range(tile_w):  # position pos holds pixel bitrev(pos) (see the template)
        j = int(f"{pos:0{bits}b}"[::-1], 2) if bits else 0
        leaves.append(f"a0_{j}")
    joins, level = [], leaves
    while len(level) > 1:
        depth = len(joins) + 1
        step = [(f"j{depth}_{n}", level[2 * n], level[2 * n + 1]) for n in range(len(level) // 2)]
        joins.append(step)
        level = [name for name, _, _ in step]
    return {
        "rolled": rolled,
        "carried": carried,
        "loaded": list(range(carried, r)),
        "in_flight": in_flight,
        "first_row": first_row,
        "steps": steps,
        "cols": cols,
        "joins": joins,
        "joined": level[0],
    }


def pair_loads(g: ConvGeometry) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """How ``w_vector`` reads a W stride of 2 (dilation 1): tap column s reads input columns
    2 q + s - padding = 2 (q + delta) + phase, so one contiguous load of 2 * tile_w columns
    from 2 (ow0 + delta), split into its even and odd halves, gives the tiles of the taps of
    that delta (one or two). Returns [(delta, [(phase, s), ...]), ...]; None where the stride
    or dilation along W is other (strided loads, one a tap column)."""
    if g.stride[1] != 2 or g.dilation[1] != 1:
        return None
    pairs: dict[int, list[tuple[int, int]]] = {}
    for s in range(g.s):
        delta, phase = divmod(s - g.padding[1], 2)
        pairs.setdefault(delta, []).append((phase, s))
    return sorted(pairs.items())


def input_strides(problem: Problem, g: ConvGeometry, variant: str = "default") -> dict[str, str]:
    """The input's strides as the template writes them (n, c, h, w): numbers where the
    problem's layout fixes them (contiguous NCHW or NHWC; ``bind_depthwise`` holds the input
    to it), so Triton knows how rows and pixels align (a 56-pixel NCHW row or a 24-channel
    NHWC pixel is 16-byte aligned, which a stride argument not divisible by 16 hides); the
    stride arguments otherwise, and for ``w_vector`` (lanes along W) where the convolution
    strides W by 3 or 4 (its loads are gathers, one a tap column): on an H200 the stride-2 3x3
    NCHW layer of issue 41 ran 1.2x slower with them, same config, before stride 2 took
    ``pair_loads`` (``benchmarks/RESULTS.md``); the channel lanes' loads run along C either way."""
    sizes = {"nchw": ("c", "h", "w"), "nhwc": ("h", "w", "c")}.get(problem.layout_a)
    if sizes is None or (variant == "w_vector" and g.stride[1] != 1 and pair_loads(g) is None):
        return {d: f"stride_x{d}" for d in "nchw"}
    extent, strides, step = {"c": g.c, "h": g.h, "w": g.w}, {}, 1
    for d in reversed(sizes):
        strides[d], step = str(step), step * extent[d]
    return {"n": str(step), **strides}


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    """The geometry and the unrolling plan the template renders as constants."""
    g = conv_of(problem)
    assert g is not None
    tile_h, tile_w = config.TILE_H, tile_width(config)
    k = int(problem.shape.n)
    return {
        "g": g,
        "k": k,
        "mult": k // g.c,
        "tile_h": tile_h,
        "tile_w": tile_w,
        "strips_h": triton.cdiv(g.p, tile_h),
        "strips_w": triton.cdiv(g.q, tile_w),
        "prefetch": config.num_stages,  # input rows loaded this many steps ahead
        "staged": ["x", "xn", *(f"xn{i}" for i in range(2, config.num_stages + 1))],
        "xs": input_strides(problem, g, config.variant),
        "pairs": pair_loads(g),
        **plan(g, tile_w, window=config.variant == "default"),
    }


def bind_depthwise(
    problem: Problem,
    config: Config,
    x: torch.Tensor,
    weight: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> Bound:
    """Everything a depthwise launch does up to the launch itself (see ``matmul.bind``)."""
    memory = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}.get(problem.layout_a)
    if memory is not None and not x.is_contiguous(memory_format=memory):
        raise ValueError(
            f"the depthwise problem is for a contiguous {problem.layout_a.upper()} input (its strides "
            f"are compiled in); got strides {tuple(x.stride())} for shape {tuple(x.shape)}"
        )
    call = conv_call(problem, x, weight, operands, out)
    if not call.args:
        return Bound(call.outs, lambda: None, lambda: None)
    n, k, p, q = call.shape
    strips = triton.cdiv(p, config.TILE_H) * triton.cdiv(q, tile_width(config))
    channel_blocks = triton.cdiv(k, config.BLOCK_N)
    grid = (channel_blocks * strips, n)
    slots = (strips, channel_blocks)  # statistics: per strip, per channel block
    target = target_for(x.device)
    return single_launch(
        KIND, problem, config, target, call.index_64, grid, call.args, call.outs, slots=slots
    )


def default_depthwise_config(problem: Problem, target: str = "cuda", *, sm_count: int = 132) -> Config:
    """The untuned config. NHWC (and strided) inputs: lanes along the channels, strips 8 pixels
    wide (narrower where the output is), 32 channels on one warp (64 on two from 256 channels,
    16 for 16 or fewer), as the first H200 sweep favoured. NCHW inputs: the w_vector variant,
    16 channels on strips 16 pixels wide (64 where the output is wider than 64); a thread's
    elements: 2 for kernels over 3x3 (with 32 rows where 16 wide), 1 for 9x9 (under
    ``W_VECTOR_SPILL``), 1 (4 when 64 wide) for 3x3, up to 8 with a W stride of 3 or 4. A W
    stride of 2 (``pair_loads``): strips as wide as the output (8 to 64 pixels), 8 rows, 4
    elements a thread (fewer where the taps would spill), the best of 20 configs on 5 of the 6
    stride-2 layers of the H100 NCHW suite. Other kernels over 3x3 on outputs 8 or fewer pixels
    wide take the channel lanes, 32 channels on one warp (1.2-1.3x faster on those 4 layers of
    the H100 NCHW suite; at 14 pixels wide 0.85-1.1x). The channel lanes: 8 rows where the
    output is over 16 tall (with the sliding window, the best of 8, 16 and 32 on 12 of 16 such
    H100 layers), else the whole height; the w_vector variant: 16 rows. Both: fewer where that
    leaves under two programs per SM (``benchmarks/RESULTS.md``). An epilogue with row totals (a
    LayerNorm over the channels): the channel lanes in either layout, every channel of a pixel
    in one program (``row_channels``), one a lane up to 512 (16 warps)."""
    g = conv_of(problem)
    assert g is not None
    rows_held = problem.epilogue.row_totals
    if target == "interpreter":
        channels = row_channels(problem) if rows_held else 16
        return Config(16, channels, 16, 1, num_warps=1, num_stages=1, TILE_H=2)
    k = int(problem.shape.n)
    rows = min(16, triton.next_power_of_2(g.p))
    taps = g.r * g.s
    pairs = pair_loads(g) is not None
    variant = "default"
    if problem.layout_a == "nchw" and (pairs or not (taps > 9 and g.q <= 8)) and not rows_held:
        variant, channels = "w_vector", 16
        width = 64 if g.q > 64 else min(16, max(4, triton.next_power_of_2(g.q)))
        per_thread = 1 if taps > W_VECTOR_SPILL // 2 else 2 if taps > 9 else 1 if width <= 16 else 4
        if pairs:
            width, rows = min(64, max(8, triton.next_power_of_2(g.q))), min(8, rows)
            per_thread = 1 << (min(4, W_VECTOR_SPILL // taps).bit_length() - 1)
        elif g.stride[1] > 1:  # strided loads: more of them in flight a thread
            per_thread = 1 << (min(8, W_VECTOR_SPILL // taps).bit_length() - 1)
        warps = min(16, max(1, channels * width // (32 * per_thread)))
        if taps > 9 and width <= 16 and not pairs:  # the halo's rows amortised over a taller strip
            rows = min(32, triton.next_power_of_2(g.p))
    if variant == "default":
        rows = 8 if g.p > 16 else rows
        width = min(8, max(2, triton.next_power_of_2(g.q)))
        channels = 16 if k <= 16 else 64 if k >= 256 and problem.layout_a != "nchw" else 32
        if rows_held:  # every channel of a pixel in one program, one or two a lane
            channels = row_channels(problem)
        warps = min(16, max(1, channels // 32))
    images = problem.shape.batch if isinstance(problem.shape.batch, int) else 1

    def programs(rows: int) -> int:
        return triton.cdiv(k, channels) * triton.cdiv(g.q, width) * triton.cdiv(g.p, rows) * images

    while rows > 4 and programs(rows) < 2 * sm_count:
        rows //= 2
    rows = max(rows, MIN_PIXELS // width)  # a tiny output (1x1, 2x2): a strip taller than it
    return Config(rows * width, channels, 16, 1, num_warps=warps, num_stages=1, TILE_H=rows, variant=variant)


def depthwise_twin(problem: Problem) -> Problem | None:
    """A depthwise convolution on the conv2d template as this template's problem, else None."""
    if problem.template != "conv2d" or geometry_error(problem) is not None:
        return None
    return on_this_template(problem)


def depthwise_twins(problem: Problem) -> tuple[Problem, ...]:
    twin = depthwise_twin(problem)
    return () if twin is None else (twin,)


def depthwise_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The problem these tensors make under ``problem``'s geometry, on this template."""
    return on_this_template(conv_problem_of(problem, a, b, operands))


def on_this_template(problem: Problem) -> Problem:
    """A conv2d problem (its geometry, op and epilogue) on this template, with its hash."""
    return dataclasses.replace(
        problem, template="depthwise", template_hash=kernel_hash(FILES, problem.epilogue)
    )


def depthwise_kernel_shape(problem: Problem) -> Shape:
    """What one program's tiles cover: pixels, every output channel, the taps."""
    return problem.shape


def depthwise_search_error(problem: Problem, config: Config) -> str | None:
    """Configs not worth a trial: lanes that hold no channel (default) or no pixel (w_vector),
    tiles wider than the output, lanes along W where W is not contiguous (NHWC)."""
    g = conv_of(problem)
    assert g is not None
    channels, lanes, k = config.BLOCK_N, 32 * config.num_warps, int(problem.shape.n)
    if problem.layout_a == "nhwc" and config.num_stages > 1:
        return "prefetching two steps ahead lost on every NHWC layer measured (0.73-0.98x)"
    if config.variant == "in_flight" and g.dilation[0] > 1:
        return "with dilated rows the default variant rolls the output rows in flight too"
    if config.variant == "w_vector":
        if problem.layout_a == "nhwc":
            return "w_vector runs its lanes along W, which NHWC strides by the channels"
        elements = channels * tile_width(config)
        if 32 * (config.num_warps - 1) >= elements:
            return f"a {channels}x{tile_width(config)} tile leaves lanes of {config.num_warps} warp(s) idle"
        if elements // (32 * config.num_warps) * g.r * g.s > W_VECTOR_SPILL:
            return (
                f"{elements // (32 * config.num_warps)} elements a thread of {g.r}x{g.s} taps spill "
                f"registers (over {W_VECTOR_SPILL} a thread)"
            )
    elif (channels < lanes and channels < k) or 32 * (config.num_warps - 1) >= channels:
        return f"{config.BLOCK_N} channels leave lanes of {config.num_warps} warp(s) idle"
    if problem.epilogue.row_totals:
        if channels != row_channels(problem):
            return f"a pixel's {k} channels fit a block of {row_channels(problem)}; BLOCK_N={channels}"
    elif channels > PLAIN_CHANNELS:
        return (
            f"channel blocks over {PLAIN_CHANNELS} are for epilogues that sum over a pixel's channels "
            f"(their filter and rows in flight take registers); BLOCK_N={channels}"
        )
    rows, wide, tall = config.TILE_H, max(2, triton.next_power_of_2(g.q)), triton.next_power_of_2(g.p)
    if tile_width(config) > max(wide, WIDTHS[config.variant][0]) or rows > tall:
        return f"a strip of {rows}x{tile_width(config)} pixels is larger than the {g.p}x{g.q} output"
    return None


def depthwise_space(problem: Problem, space: Mapping[str, tuple]) -> Mapping[str, tuple]:
    """NHWC searches the channel lanes only (both variants), on up to 4 warps, one step ahead: the rest of the
    space is w_vector's (``depthwise_search_error`` refuses it there). An epilogue with row
    totals: the channel lanes in both layouts, every channel in one block, one or two a lane."""
    if problem.epilogue.row_totals:
        channels = row_channels(problem)
        warps = tuple(w for w in space["num_warps"] if channels // 64 <= w <= max(1, channels // 32))
        space = {**space, "variant": CHANNEL_LANES, "BLOCK_N": (channels,), "num_warps": warps}
    elif problem.layout_a == "nhwc":
        space = {**space, "variant": CHANNEL_LANES, "num_warps": (1, 2, 4)}
    return {**space, "num_stages": (1,)} if problem.layout_a == "nhwc" else space


# w_vector: a thread's elements x the taps above which the H100 sweep slowed 1.3-85x (spills):
# 4 x 7x7 (196) and 32 x 3x3 (288) did, 2 x 7x7 and 16 x 3x3 (144) did not
W_VECTOR_SPILL = 160


# where the tuner searches (BLOCK_M: pixels per program; TILE_H: its rows; BLOCK_N: channels)
SPACE: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "variant": VARIANTS,
    "BLOCK_M": (16, 32, 64, 128, 256, 512, 1024),
    "TILE_H": (2, 4, 8, 16, 32, 64),
    # 16 only for 16 channels or fewer, over 128 only for row totals (``depthwise_search_error``)
    "BLOCK_N": (16, 32, 64, 128, 256, 512),
    "BLOCK_K": (16,),
    "GROUP_M": (1,),
    "num_warps": (1, 2, 4, 8, 16),  # 8 and 16: w_vector only (default: a channel a lane)
    "num_stages": (1, 2),  # the prefetch depth
}

SEEDS = (
    # NHWC: strips of 8 (or 4) pixels, 8 to 32 rows, one or two channels per lane
    Config(128, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16),
    Config(128, 64, 16, 1, num_warps=2, num_stages=1, TILE_H=16),
    Config(64, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=8),
    Config(256, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=32),
    Config(64, 64, 16, 1, num_warps=1, num_stages=1, TILE_H=16),
    Config(128, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16, variant="in_flight"),
    # NCHW: 16 channels on rows of 16 to 64 pixels, 1 to 4 elements a thread (the H100 sweep's best)
    Config(512, 16, 16, 1, num_warps=4, num_stages=1, TILE_H=32, variant="w_vector"),
    Config(256, 16, 16, 1, num_warps=8, num_stages=1, TILE_H=16, variant="w_vector"),
    Config(512, 16, 16, 1, num_warps=4, num_stages=2, TILE_H=32, variant="w_vector"),
    Config(512, 16, 16, 1, num_warps=8, num_stages=1, TILE_H=8, variant="w_vector"),
    Config(1024, 16, 16, 1, num_warps=16, num_stages=2, TILE_H=16, variant="w_vector"),
    Config(256, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=16, variant="w_vector"),  # W stride 3, 4
    # a W stride of 2 (pair loads): 32 or 64 wide, 8 rows, 4 elements a thread
    Config(256, 16, 16, 1, num_warps=4, num_stages=1, TILE_H=8, variant="w_vector"),
    Config(512, 16, 16, 1, num_warps=8, num_stages=1, TILE_H=8, variant="w_vector"),
)


KIND = TemplateKind(
    name="depthwise",
    files=FILES,
    ops=(),
    takes=("conv2d",),
    library="cudnn",
    input_args=("x_ptr", "w_ptr"),
    space=SPACE,
    seeds=SEEDS,
    check=config_error,
    default_config=default_depthwise_config,
    kernel_shape=depthwise_kernel_shape,
    problem_of=depthwise_problem_of,
    bind=bind_depthwise,
    output_specs=lambda problem, a, b: output_specs(problem, a),
    empty_outputs=empty_conv_outputs,
    inputs=conv_inputs,
    reference=conv_reference,
    baseline=eager_conv,
    input_elements=conv_input_elements,
    render_vars=render_vars,
    source=source,
    search_error=depthwise_search_error,
    narrow=depthwise_space,
    twins=depthwise_twins,
    prefer_untuned=True,
    supersedes=("conv2d",),
    reductions=True,
    row_error=row_error,
    layouts=conv_geometry.LAYOUTS,
    geometry=ConvGeometry,
    problem_error=geometry_error,
    label=conv_geometry.label,
    transfer_key=conv_geometry.transfer_key,
    spec_module="epilab.templates.conv.conv_spec",
)
