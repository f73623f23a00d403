"""The conv2d template's Python half: problems, binding and the float64 reference.

    out[n, k, p, q] = epilogue(conv2d(x, weight)[n, k, p, q], operands)

x is [N, C, H, W] and weight [K, C / groups, R, S] with any strides: channels_last
(NHWC memory, what the kernel streams best) and contiguous NCHW alike, no copy.
The kernel sees each image as a GEMM (rows: the P*Q output pixels, columns: the
output channels), so the epilogue and its operands use the matmul IR unchanged:
a per-output-channel vector (bias, a folded batch norm's scale and shift) is a
``row`` operand of shape [K]; a tensor of the output's shape (a residual) is a
``tile`` operand; ``col`` (per pixel) operands are not accepted. Outputs are
allocated in the input's memory format (as torch's conv2d does); ``out=`` tensors may
have any strides in which an output row (P, Q) is evenly strided (NCHW and NHWC both are).
Reduction outputs (``epilogue.REDUCTIONS``) are in the GEMM's terms too: a row statistic is
per output pixel over the channels, [N, P, Q]; a column statistic per image and channel
over the pixels, [N, K] (a global average pool's sums, a batch norm's per-image sums); both
fp32, contiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import REDUCTIONS, Epilogue, Output
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.templates.bound import Bound
from epilab.templates.conv import conv_geometry
from epilab.templates.conv.conv_geometry import ConvGeometry, conv_layout, conv_of, conv_problem
from epilab.templates.gemm.knobs import hopper_knobs_error
from epilab.templates.gemm.matmul import FILES as MATMUL_FILES
from epilab.templates.gemm.matmul_config import idle_threads_error
from epilab.templates.kind import OutputSpec, TemplateKind, TwinCall
from epilab.templates.runtime.binding import (
    INT32_MAX,
    epilogue_args,
    extent,
    single_launch,
    split_k_bound,
    target_for,
)
from epilab.templates.runtime.render import EPILOGUE_FILES, kernel_hash

_Pair = int | tuple[int, int]
FILES = ("conv2d.py.jinja", "tile_order.py.jinja", "split_k.py.jinja", *EPILOGUE_FILES)


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the conv2d template for ``problem`` (None when it does)."""
    why = hopper_knobs_error(config)
    if why is not None:
        return why
    if conv_of(problem) is None:
        return "the conv2d template needs a conv2d problem"
    if config.variant != "default":
        return "the conv2d template has no variants; use variant 'default'"
    if config.SPLIT_K > 1 and conv_of(problem).c_per_group == 1:
        return "a depthwise convolution has no channel reduction to split; use SPLIT_K=1"
    return None


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    """The geometry the conv2d template renders as constants."""
    g = conv_of(problem)
    assert g is not None
    return {
        "g": g,
        "groups": g.groups,
        "c_g": g.c_per_group,
        "k_g": int(problem.shape.n) // g.groups,
        "depthwise": g.c_per_group == 1,
        "even_c": g.c_per_group % config.BLOCK_K == 0,
        "c_blocks": g.c_per_group // config.BLOCK_K,  # channel blocks per (r, s) when even_c
    }


def _pair(v: _Pair, name: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
    return t  # type: ignore[return-value]


def gemm_view(t: torch.Tensor, p: int, q: int) -> torch.Tensor:
    """A [N, K, P, Q] tensor as the [N, P*Q, K] matrix the kernel indexes (a view)."""
    v = t.permute(0, 2, 3, 1)
    if p > 1 and q > 1 and v.stride(1) != q * v.stride(2):
        raise ValueError(
            f"a tensor of shape {tuple(t.shape)} with strides {t.stride()} has output rows that are "
            "not evenly strided; use a contiguous or channels_last tensor"
        )
    return v.as_strided((t.shape[0], p * q, t.shape[1]), (v.stride(0), v.stride(2), v.stride(3)))


def operands_3d(
    epilogue: Epilogue, operands: Mapping[str, torch.Tensor], out_shape: tuple[int, int, int, int]
) -> dict[str, torch.Tensor]:
    """Operands in the kernel's [N, P*Q, K] terms (views); clear errors for shapes it cannot take."""
    _, k, p, q = out_shape
    out: dict[str, torch.Tensor] = {}
    for name, broadcast in epilogue.operands:
        t = operands[name]
        if broadcast == "row":
            if t.numel() != k or (t.dim() > 1 and [d for d in t.shape if d != 1] != [k]):
                raise ValueError(
                    f"operand {name!r} is per output channel: give {k} values ([K] or [1, K, 1, 1])"
                )
            out[name] = t.reshape(k)
        elif broadcast == "tile":
            if tuple(t.shape) != out_shape:
                raise ValueError(
                    f"operand {name!r} must have the output's shape {out_shape}, got {tuple(t.shape)}"
                )
            if p > 1 and q > 1 and t.stride(2) != q * t.stride(3):
                t = t.contiguous(memory_format=torch.channels_last)
            out[name] = gemm_view(t, p, q)
        elif broadcast == "scalar":
            if t.numel() != 1:
                raise ValueError(
                    f"operand {name!r} is a scalar: give one element, got shape {tuple(t.shape)}"
                )
            out[name] = t.reshape(())
        else:
            raise ValueError(
                f"operand {name!r}: the conv2d template takes row, tile and scalar operands, not {broadcast}"
            )
    return out


def make_conv_problem(
    x: torch.Tensor,
    weight: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
    *,
    stride: _Pair = 1,
    padding: _Pair = 0,
    dilation: _Pair = 1,
    groups: int = 1,
    precision: str = "ieee",
) -> Problem:
    """The Problem that ``bind_conv`` would run for these tensors (checks them all)."""
    for name, t in (("input", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"conv2d {name} must be a 4-D tensor, got {getattr(t, 'shape', type(t))}")
    if x.dtype != weight.dtype or dtypes.name_or_none(x.dtype) not in dtypes.INPUT_DTYPES:
        raise TypeError(
            f"input and weight must share a float16/bfloat16/float32 dtype, got {x.dtype}, {weight.dtype}"
        )
    if x.device != weight.device:
        raise ValueError(f"input is on {x.device}, weight on {weight.device}")
    target_for(x.device)
    n, c, h, w = x.shape
    k, cg, r, s = weight.shape
    geometry = ConvGeometry(
        h, w, c, r, s, _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation"), groups
    )
    if cg != geometry.c_per_group or k % groups:
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit {c} input channels in {groups} groups "
            f"(want [K, {geometry.c_per_group}, R, S] with K a multiple of {groups})"
        )
    declared = dict(epilogue.operands)
    if sorted(declared) != sorted(operands):
        raise ValueError(f"operands {sorted(operands)} do not match the epilogue's {sorted(declared)}")
    operands_3d(epilogue, operands, (n, k, geometry.p, geometry.q))
    for name, t in operands.items():
        if t.device != x.device or dtypes.name_or_none(t.dtype) not in dtypes.OPERAND_DTYPES:
            raise ValueError(
                f"operand {name!r} must be on {x.device} with a dtype in {dtypes.OPERAND_DTYPES}"
            )
    return conv_problem(
        x,
        weight,
        geometry,
        epilogue,
        [(name, broadcast, operands[name]) for name, broadcast in declared.items()],
        precision,
        kernel_hash(FILES, epilogue),
    )


def out_shape_of(problem: Problem, n: object = None) -> tuple[object, int, int, int]:
    """[N, K, P, Q]: N is ``n`` (a call's batch, an int or a SymInt) where given, else the
    problem's own (which must then be static)."""
    g = conv_of(problem)
    assert g is not None
    return (int(problem.shape.batch) if n is None else n, int(problem.shape.n), g.p, g.q)


def output_shape(problem: Problem, out: Output, n: object = None) -> tuple[object, ...]:
    """Output ``out``'s shape: [N, K, P, Q]; a row statistic (over the channels) [N, P, Q], a
    column statistic (over the pixels) [N, K]; N as in ``out_shape_of``."""
    n, k, p, q = out_shape_of(problem, n)
    if not out.reduce:
        return (n, k, p, q)
    return (n, p, q) if REDUCTIONS[out.reduce][1] == "n" else (n, k)


def output_specs(problem: Problem, x: torch.Tensor) -> list[OutputSpec]:
    """Every output's shape and the strides ``bind_conv`` gives it (statistics contiguous)
    for a call with input ``x`` (its batch may be symbolic: a dynamic batch)."""
    _, k, p, q = out_shape_of(problem, x.shape[0])
    specs = []
    for o in problem.epilogue.outputs:
        shape = output_shape(problem, o, x.shape[0])
        if not o.reduce:
            strides: tuple[int, ...] = out_strides_of(problem)
        else:
            strides = (p * q, q, 1) if len(shape) == 3 else (k, 1)
        specs.append((shape, strides))
    return specs


def out_strides_of(problem: Problem) -> tuple[int, int, int, int]:
    """The strides ``bind_conv`` gives its outputs: channels_last for an nhwc input, else contiguous."""
    g = conv_of(problem)
    assert g is not None
    k, p, q = int(problem.shape.n), g.p, g.q
    if problem.layout_a == "nhwc":
        return (k * p * q, 1, q * k, k)
    return (k * p * q, p * q, q, 1)


@dataclass(frozen=True)
class ConvCall:
    """A convolution call checked against its problem: its outputs (``out``, or new ones) and,
    for a batch of images, the kernel arguments every conv kind passes (input and weight with
    their strides, the epilogue's operands and outputs in [N, P*Q, K] terms)."""

    outs: tuple[torch.Tensor, ...]
    shape: tuple[int, int, int, int]  # the call's [N, K, P, Q]
    args: dict[str, object]  # empty for an empty batch (nothing to launch)
    epilogue_args: dict[str, object]
    index_64: bool  # a tensor spans 2**31 elements or more


def conv_call(
    problem: Problem,
    x: torch.Tensor,
    weight: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None,
) -> ConvCall:
    """Check the tensors' sizes against ``problem`` (whose batch may be symbolic) and gather a
    conv kind's launch arguments."""
    g = conv_of(problem)
    if g is None:
        raise ValueError(f"a {problem.template} launch needs a conv2d problem")
    n, k, p, q = shape = out_shape_of(problem, x.shape[0] if x.dim() == 4 else -1)
    batch = problem.shape.batch
    if (
        tuple(x.shape) != (n, g.c, g.h, g.w)
        or tuple(weight.shape) != (k, g.c_per_group, g.r, g.s)
        or (isinstance(batch, int) and n != batch)
    ):
        raise ValueError(f"input {tuple(x.shape)} / weight {tuple(weight.shape)} do not match the problem")
    outs = conv_outputs(problem, x, out)
    if n == 0:
        return ConvCall(outs, shape, {}, {}, False)
    if n > 65535:
        raise ValueError(f"batch {n} is over the 65535 images a convolution kernel launches")
    specs = problem.epilogue.outputs
    ops3 = operands_3d(problem.epilogue, operands, shape)
    outs3 = tuple(kernel_view(o, spec, p, q) for o, spec in zip(outs, specs, strict=True))
    ep_args = epilogue_args(problem.epilogue, ops3, outs3, (n, p * q, k), (n, p * q, k))
    strides = dict(zip(("stride_xn", "stride_xc", "stride_xh", "stride_xw"), x.stride(), strict=True))
    strides |= dict(zip(("stride_wk", "stride_wc", "stride_wr", "stride_ws"), weight.stride(), strict=True))
    index_64 = any(extent(t) > INT32_MAX for t in (x, weight, *outs, *operands.values()))
    return ConvCall(outs, shape, {"x_ptr": x, "w_ptr": weight, **ep_args, **strides}, ep_args, index_64)


def bind_conv(
    problem: Problem,
    config: Config,
    x: torch.Tensor,
    weight: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> Bound:
    """Everything a conv2d launch does up to the launch itself (see ``matmul.bind``)."""
    call = conv_call(problem, x, weight, operands, out)
    outs, args, ep_args, index_64 = call.outs, call.args, call.epilogue_args, call.index_64
    if not args:
        return Bound(outs, lambda: None, lambda: None)
    g = conv_of(problem)
    assert g is not None
    n, k, p, q = call.shape
    target = target_for(x.device)
    k_g = k // g.groups
    split = config.SPLIT_K
    grid = (triton.cdiv(p * q, config.BLOCK_M) * triton.cdiv(k_g, config.BLOCK_N), n, g.groups * split)
    if g.groups * split > 65535:
        raise ValueError(f"groups {g.groups} x SPLIT_K {split} is over the 65535 this template launches")
    if split > 1:
        out3 = (n, p * q, k)
        return split_k_bound(KIND, problem, config, target, index_64, grid, args, ep_args, outs, out3)
    # statistics slots: the pixel tiles, and the channel tiles of every group
    slots = (triton.cdiv(p * q, config.BLOCK_M), g.groups * triton.cdiv(k_g, config.BLOCK_N))
    return single_launch(KIND, problem, config, target, index_64, grid, args, outs, slots=slots)


def conv_outputs(
    problem: Problem, x: torch.Tensor, out: tuple[torch.Tensor, ...] | None
) -> tuple[torch.Tensor, ...]:
    """A launch's outputs: ``out`` checked against the problem's shapes and dtypes, or new ones
    in the input's memory format, as torch's conv2d allocates them (statistics contiguous)."""
    specs = problem.epilogue.outputs
    out_dtypes = [dtypes.torch_dtype(o.dtype) for o in specs]
    shapes = [output_shape(problem, o, x.shape[0]) for o in specs]
    if out is None:
        nhwc = conv_layout(x) == "nhwc"
        return tuple(
            torch.empty(s, dtype=dt, device=x.device, memory_format=memory_format(len(s) == 4 and nhwc))
            for s, dt in zip(shapes, out_dtypes, strict=True)
        )
    if len(out) != len(out_dtypes) or any(
        tuple(o.shape) != shape or o.dtype != dt or o.device != x.device
        for o, shape, dt in zip(out, shapes, out_dtypes, strict=False)
    ):
        raise ValueError(
            f"out must be {len(out_dtypes)} tensor(s) of shapes {shapes} with dtypes {out_dtypes}"
        )
    return tuple(out)


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def kernel_view(o: torch.Tensor, spec: Output, p: int, q: int) -> torch.Tensor:
    """An output as the kernel indexes it: [N, P*Q, K], a row statistic [N, P*Q]."""
    if not spec.reduce:
        return gemm_view(o, p, q)
    if REDUCTIONS[spec.reduce][1] == "m":
        return o
    if p > 1 and q > 1 and o.stride(1) != q * o.stride(2):
        raise ValueError(
            f"a per-pixel statistic with strides {o.stride()} is not a [N, P*Q] matrix; give a contiguous one"
        )
    return o.as_strided((o.shape[0], p * q), (o.stride(0), o.stride(2) if q > 1 else o.stride(1)))


def conv_epilogue(
    problem: Problem, acc: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The epilogue in eager torch on a [N, K, P, Q] conv output (per-channel operands
    broadcast as [K, 1, 1]): the float64 reference, and the cuDNN + eager baseline. With
    reduction outputs or row totals (over the channels) it runs on the [N, P*Q, K] GEMM view
    (a copy where acc is NCHW)."""
    n, k, p, q = acc.shape
    broadcasts = dict(problem.epilogue.operands)
    if not problem.epilogue.reductions and not problem.epilogue.row_totals:
        shaped = {
            name: t.reshape(k, 1, 1) if broadcasts[name] == "row" else t for name, t in operands.items()
        }
        return problem.epilogue.evaluate(acc, shaped)

    def gemm(t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1).reshape(n, p * q, k)

    flat = {name: gemm(t) if broadcasts[name] == "tile" else t.reshape(-1) for name, t in operands.items()}
    outs = problem.epilogue.evaluate(gemm(acc), flat)
    return tuple(
        v.reshape(n, p, q, k).permute(0, 3, 1, 2) if not o.reduce else v.reshape(output_shape(problem, o, n))
        for v, o in zip(outs, problem.epilogue.outputs, strict=True)
    )


def conv_reference(
    problem: Problem, x: torch.Tensor, weight: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs computed in float64 (torch's conv2d, then the epilogue), before rounding."""
    g = conv_of(problem)
    assert g is not None
    acc = F.conv2d(x.double(), weight.double(), None, g.stride, g.padding, g.dilation, g.groups)
    return conv_epilogue(problem, acc, {name: t.double() for name, t in operands.items()})


def conv_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random input, weight and operands with the problem's shapes, dtypes and layouts."""
    g = conv_of(problem)
    assert g is not None
    n, k, p, q = out_shape_of(problem)
    dtype = dtypes.torch_dtype(problem.dtype)

    def make(shape: tuple[int, ...], layout: str, dt: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        t = (torch.randn(shape, generator=gen, device=device) * scale).to(dt)
        return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t

    x = make((n, g.c, g.h, g.w), problem.layout_a, dtype)
    weight = make((k, g.c_per_group, g.r, g.s), problem.layout_b, dtype, (g.r * g.s * g.c_per_group) ** -0.5)
    broadcasts = dict(problem.epilogue.operands)
    operands = {}
    for spec in problem.operands:
        odt = dtypes.torch_dtype(spec.dtype)
        shape = {"row": (k,), "scalar": ()}.get(broadcasts[spec.name], (n, k, p, q))
        operands[spec.name] = make(shape, spec.layout, odt)
    return x, weight, operands


def default_conv_config(problem: Problem, target: str = "cuda") -> Config:
    """The untuned conv config: 128-pixel tiles, as many output channels of a group as fit
    in 128 (at least 16), channel steps that divide the group's channels where they can."""
    g = conv_of(problem)
    assert g is not None
    if target == "interpreter":
        return Config(16, 16, 16, 1, num_warps=4, num_stages=1)
    k_g = int(problem.shape.n) // g.groups
    block_n = min(128, max(16, triton.next_power_of_2(k_g)))
    block_k = next((b for b in (64, 32, 16) if g.c_per_group % b == 0), 32 if g.c_per_group >= 32 else 16)
    if g.c_per_group == 1:
        return Config(64, block_n if block_n <= 64 else 64, 16, 8, num_warps=4, num_stages=2)
    return Config(128, block_n, block_k, 8, num_warps=8 if block_n >= 128 else 4, num_stages=3)


# -------------------------------------------------- 1x1 convolutions as matmuls


def matmul_twin(problem: Problem) -> Problem | None:
    """A 1x1, stride-1, unpadded, ungrouped NHWC convolution is the matmul
    [N*H*W, C] @ [C, K] on the same memory: that problem for the matmul template (the
    compiler runs whichever template's record is faster), else None."""
    g = conv_of(problem)
    if g is None or problem.epilogue.reductions:  # the twin's statistics would span the images
        return None
    if (g.r, g.s, g.stride, g.padding, g.dilation, g.groups) != (
        1,
        1,
        (1, 1),
        (0, 0),
        (1, 1),
        1,
    ):
        return None
    if problem.layout_a != "nhwc" or any(
        o.layout not in ("vector", "scalar", "nhwc") for o in problem.operands
    ):
        return None
    s = problem.shape
    return Problem(
        op="mm",
        template="matmul",
        template_hash=kernel_hash(MATMUL_FILES, problem.epilogue),
        dtype=problem.dtype,
        layout_a="row",
        layout_b="col",  # B[c, k] = weight[k, c]: C-contiguous in both weight layouts
        operands=tuple(
            OperandSpec(o.name, o.dtype, "row" if o.layout == "nhwc" else o.layout) for o in problem.operands
        ),
        epilogue=problem.epilogue,
        shape=Shape(1, int(s.batch) * int(s.m), s.n, s.k),
        precision=problem.precision,
    )


def as_matmul(
    x: torch.Tensor, weight: torch.Tensor, operands: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """A 1x1 convolution's tensors as its matmul twin's: views, no copies (channels_last x)."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    a = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
    b = weight.reshape(k, c).t()
    ops = [t.permute(0, 2, 3, 1).reshape(n * h * w, k) if t.dim() == 4 else t for t in operands]
    return a, b, ops


def as_matmul_output(out: torch.Tensor) -> torch.Tensor:
    """A channels_last [N, K, H, W] output as the [N*H*W, K] matrix the matmul twin writes
    (a view: the kernel's stores land in ``out``; any other layout is refused)."""
    n, k, h, w = out.shape
    return out.permute(0, 2, 3, 1).view(n * h * w, k)


def as_conv_outputs(outs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
    """The matmul twin's [N*H*W, K] outputs as the convolution's [N, K, H, W] (channels_last views)."""
    n, _, h, w = x.shape
    return [o.view(n, h, w, o.shape[-1]).permute(0, 3, 1, 2) for o in outs]


def matmul_twin_call(problem: Problem, x: torch.Tensor, weight: torch.Tensor) -> TwinCall | None:
    """A matmul twin (``matmul_twin``) called with its 1x1 convolution's 4-D tensors: its
    outputs are channels_last [N, K, H, W], its tensors and outputs are matrix views."""
    if conv_of(problem) is not None or x.dim() != 4:
        return None
    n, _, h, w = x.shape
    k = weight.shape[0]
    spec = ((n, k, h, w), (k * h * w, 1, w * k, k))
    return TwinCall([spec for _ in problem.epilogue.outputs], as_matmul, as_matmul_output, as_conv_outputs)


# ------------------------------------------------------------------ the kind

# where the tuner searches (block sizes are capped at the kernel shape when a study starts)
SPACE: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "BLOCK_M": (16, 32, 64, 128, 256),
    "BLOCK_N": (16, 32, 64, 128, 256),
    "BLOCK_K": (16, 32, 64, 128),
    "GROUP_M": (1, 4, 8),
    "SPLIT_K": (1, 2, 4, 8),  # over the (r, s, c) reduction, where the output tiles are few
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3, 4, 5),
}

SEEDS = [  # for the conv2d template: wide pixel tiles, channel blocks of 64 or 32
    Config(128, 64, 64, 8, num_warps=4, num_stages=3),
    Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    Config(64, 64, 64, 8, num_warps=4, num_stages=4),
    Config(256, 64, 32, 8, num_warps=8, num_stages=3),
    Config(64, 128, 32, 8, num_warps=4, num_stages=4),
]


def conv_kernel_shape(problem: Problem) -> Shape:
    """What one program's tiles cover: one group's output channels."""
    s = problem.shape
    assert conv_of(problem) is not None
    return Shape(s.batch, s.m, int(s.n) // conv_of(problem).groups, s.k)


def conv_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The problem these tensors make under ``problem``'s geometry and precision."""
    g = conv_of(problem)
    if g is None:
        raise ValueError("a conv2d template problem needs its convolution geometry")
    return make_conv_problem(
        a,
        b,
        problem.epilogue,
        operands,
        stride=g.stride,
        padding=g.padding,
        dilation=g.dilation,
        groups=g.groups,
        precision=problem.precision,
    )


def empty_conv_outputs(problem: Problem, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Outputs of the problem's [N, K, P, Q] shape in the layout a call allocates them
    (``out_strides_of``: channels_last for an nhwc input, else contiguous; statistics
    contiguous), so that the tuner checks and times the stores a compiled model runs (all
    were channels_last: an NCHW candidate was timed on other stores than it runs, and
    compiled again at its first launch, the compile pool having bound the other layout)."""
    outs = []
    for o in problem.epilogue.outputs:
        shape, dtype = output_shape(problem, o), dtypes.torch_dtype(o.dtype)
        if len(shape) == 4:
            outs.append(torch.empty_strided(shape, out_strides_of(problem), dtype=dtype, device=device))
        else:
            outs.append(torch.empty(shape, dtype=dtype, device=device))
    return tuple(outs)


def eager_conv(
    problem: Problem, x: torch.Tensor, weight: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """cuDNN (torch's conv2d) then the epilogue in eager torch."""
    g = conv_of(problem)
    assert g is not None
    acc = F.conv2d(x, weight, None, g.stride, g.padding, g.dilation, g.groups)
    return tuple(conv_epilogue(problem, acc, operands))


def conv_input_elements(problem: Problem) -> tuple[int, int]:
    g = conv_of(problem)
    assert g is not None
    s = problem.shape
    return int(s.batch) * g.c * g.h * g.w, int(s.n) * int(s.k)


def conv_twins(problem: Problem) -> tuple[Problem, ...]:
    twin = matmul_twin(problem)
    return () if twin is None else (twin,)


KIND = TemplateKind(
    name="conv2d",
    files=FILES,
    ops=("conv2d",),
    library="cudnn",
    input_args=("x_ptr", "w_ptr"),
    space=SPACE,
    seeds=tuple(SEEDS),
    check=config_error,
    default_config=lambda problem, target, *, sm_count=0: default_conv_config(problem, target),
    kernel_shape=conv_kernel_shape,
    problem_of=conv_problem_of,
    bind=bind_conv,
    output_specs=lambda problem, a, b: output_specs(problem, a),
    empty_outputs=empty_conv_outputs,
    inputs=conv_inputs,
    reference=conv_reference,
    baseline=eager_conv,
    input_elements=conv_input_elements,
    render_vars=render_vars,
    search_error=lambda problem, config: idle_threads_error(config),
    twins=conv_twins,
    twin_call=matmul_twin_call,
    split_k_underfilled=True,
    reductions=True,
    layouts=conv_geometry.LAYOUTS,
    geometry=ConvGeometry,
    problem_error=conv_geometry.problem_error,
    label=conv_geometry.label,
    transfer_key=conv_geometry.transfer_key,
    spec_module="epilab.templates.conv.conv_spec",
)
