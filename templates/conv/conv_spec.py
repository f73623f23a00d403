"""The conv2d kind's spec format: a convolution written as ``{"n", "c", "h", "w", "k", "r",
"s"}`` (input [n, c, h, w], weight [k, c / groups, r, s]) plus optional ``stride``,
``padding``, ``dilation``, ``groups``, ``dtype``, ``layout`` (nhwc, the default, or nchw: the
memory of input and weight) and ``epilogue`` (``ir/spec.py``; per-channel operands are
``x[n]``, a folded batch norm's shift is a bias); and its built-in suite:

- ``conv``: ResNet-50's convolutions at batch 32, bf16 channels_last: the 7x7 stride-2
  stem, the 3x3 layers at 56/28/14/7 with C = K = 64/128/256/512, and the 1x1
  expansions (with the block's residual add) and reductions, each with its folded
  batch norm as a per-channel bias and ReLU.
- ``depthwise``: the depthwise convolutions (groups = channels) of MobileNetV2/V3,
  EfficientNet-B0 and ConvNeXt-T's 7x7 stages at batch 1, 32 and 128, bf16 channels_last,
  each with its model's folded batch norm and activation (ConvNeXt: a bias).
"""

from __future__ import annotations

from dataclasses import dataclass

from epilab.ir.dtypes import INPUT_DTYPES
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.ir.spec import OPERAND_LAYOUTS, EpilogueSpec, SpecFormat, epilogue_label, int_in, spec_epilogue
from epilab.templates.conv.conv_geometry import ConvGeometry, layout_for
from epilab.templates.registry import default_template, template_hash

MEMORY = ("nhwc", "nchw")
KEYS = frozenset(
    {
        "n",
        "c",
        "h",
        "w",
        "k",
        "r",
        "s",
        "stride",
        "padding",
        "dilation",
        "groups",
        "dtype",
        "layout",
        "epilogue",
    }
)


@dataclass(frozen=True)
class ConvSpec:
    """A conv2d problem: input [n, c, h, w], weight [k, c / groups, r, s], bf16 channels_last
    by default; the epilogue's bias is per output channel (a folded batch norm's shift)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    dtype: str = "bfloat16"
    layout: str = "nhwc"
    epilogue: EpilogueSpec = "bias_relu"

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s"):
            int_in(name, getattr(self, name), 1, 1 << 16)
        int_in("stride", self.stride, 1, 64)
        int_in("padding", self.padding, 0, 64)
        int_in("dilation", self.dilation, 1, 64)
        int_in("groups", self.groups, 1, 1 << 16)
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {INPUT_DTYPES}")
        if self.layout not in MEMORY:
            raise ValueError(f"layout {self.layout!r} is not one of {MEMORY} (memory of input and weight)")
        self.problem()  # the geometry and the epilogue's operands are checked here

    def geometry(self) -> ConvGeometry:
        return ConvGeometry(
            self.h,
            self.w,
            self.c,
            self.r,
            self.s,
            (self.stride,) * 2,
            (self.padding,) * 2,
            (self.dilation,) * 2,
            self.groups,
        )

    def problem(self) -> Problem:
        g = self.geometry()
        ep = spec_epilogue(self.epilogue, self.dtype)
        if any(broadcast == "col" for _, broadcast in ep.operands):
            raise ValueError("a convolution's operands are per channel ([n]), scalars ([]) or whole tensors")
        out = (self.n, self.k, g.p, g.q)
        operands = tuple(
            OperandSpec(name, self.dtype, OPERAND_LAYOUTS.get(broadcast) or layout_for(out, self.layout))
            for name, broadcast in ep.operands
        )
        return Problem(
            op="conv2d",
            template=default_template("conv2d"),
            template_hash=template_hash(default_template("conv2d"), ep),
            dtype=self.dtype,
            layout_a=layout_for((self.n, self.c, self.h, self.w), self.layout),
            layout_b=layout_for((self.k, g.c_per_group, self.r, self.s), self.layout),
            operands=operands,
            epilogue=ep,
            shape=Shape(self.n, g.p * g.q, self.k, self.r * self.s * g.c_per_group),
            geometry=g,
        )

    def label(self) -> str:
        g = self.geometry()
        extra = "".join(
            f" {name}{v}"
            for name, v, default in (("s", self.stride, 1), ("d", self.dilation, 1), ("g", self.groups, 1))
            if v != default
        )
        return (
            f"conv {self.n}x{self.c}x{self.h}x{self.w} -> {self.k}x{g.p}x{g.q} {self.r}x{self.s}{extra} "
            f"{self.dtype} {self.layout} {epilogue_label(self.epilogue, self.dtype)}"
        )

    def flops(self) -> int:
        return self.problem().shape.flops()


_RESNET50 = [  # (c, hw, k, r, stride, padding, epilogue): the distinct layers of ResNet-50 at batch 32
    (3, 224, 64, 7, 2, 3, "bias_relu"),  # the stem
    *((ch, hw, ch, 3, 1, 1, "bias_relu") for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))),
    *(
        (ch, hw, 4 * ch, 1, 1, 0, "bias_residual_relu")
        for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))
    ),
    *((4 * ch, hw, ch, 1, 1, 0, "bias_relu") for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))),
]
# (channels, input size, kernel, stride, epilogue): the distinct depthwise layers of
# MobileNetV2 (3x3, BN + ReLU6), MobileNetV3-Large (3x3 and 5x5, BN + ReLU or hardswish),
# EfficientNet-B0 (3x3 and 5x5, BN + SiLU) and ConvNeXt-T's 7x7 stages (bias; a LayerNorm follows)
_DEPTHWISE = [
    (32, 112, 3, 1, "bn_relu6"),
    (96, 112, 3, 2, "bn_relu6"),
    (144, 56, 3, 1, "bn_relu6"),
    (192, 28, 3, 1, "bn_relu6"),
    (384, 14, 3, 1, "bn_relu6"),
    (576, 14, 3, 2, "bn_relu6"),
    (960, 7, 3, 1, "bn_relu6"),
    (72, 56, 5, 2, "bn_relu"),
    (120, 28, 5, 1, "bn_relu"),
    (480, 14, 3, 1, "bn_hardswish"),
    (672, 14, 5, 2, "bn_hardswish"),
    (960, 7, 5, 1, "bn_hardswish"),
    (144, 56, 5, 2, "bn_silu"),
    (240, 28, 5, 1, "bn_silu"),
    (480, 14, 5, 1, "bn_silu"),
    (672, 14, 5, 1, "bn_silu"),
    (1152, 7, 5, 1, "bn_silu"),
    (1152, 7, 3, 1, "bn_silu"),
    (96, 56, 7, 1, "bias"),
    (192, 28, 7, 1, "bias"),
    (384, 14, 7, 1, "bias"),
    (768, 7, 7, 1, "bias"),
]
SUITES = {
    "conv": [
        ConvSpec(32, c, hw, hw, k, r, r, stride, pad, epilogue=ep)
        for c, hw, k, r, stride, pad, ep in _RESNET50
    ],
    "depthwise": [
        ConvSpec(n, c, hw, hw, c, r, r, stride, r // 2, groups=c, epilogue=ep)
        for n in (1, 32, 128)
        for c, hw, r, stride, ep in _DEPTHWISE
    ],
}


FORMAT = SpecFormat(
    what="a conv2d problem",
    keys=KEYS,
    required=frozenset({"n", "c", "h", "w", "k", "r", "s"}),
    marks=frozenset({"c", "h", "w", "r", "s"}),
    make=ConvSpec,
    suites=SUITES,
)
