"""The conv2d kind's geometry: what a convolution has beyond its GEMM view (``Shape``), how
its problems are checked against it, labelled, and which of them share configs.

The kind (``conv2d.py``) declares it; the problem (``ir/problem.py``) keeps it in its
``geometry`` slot and its JSON under ``ConvGeometry.KEY`` without knowing what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from epilab.ir import dtypes
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Dim, OperandSpec, Problem, Shape

LAYOUTS = ("nhwc", "nchw", "strided")  # conv2d input (A) and weight (B: KRSC = nhwc, KCRS = nchw)


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-D convolution's geometry: input H x W with C channels, an R x S kernel, K output
    channels in ``groups`` groups, stride, padding and dilation per axis. Its GEMM view
    (``Problem.shape``): batch = N images, m = P * Q output pixels, n = K, k = R * S * C / groups."""

    KEY: ClassVar[str] = "conv"  # its place in the problem's JSON

    h: int
    w: int
    c: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        for name in ("h", "w", "c", "r", "s", "groups"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"conv {name} must be a positive int, got {v!r}")
        for name, low in (("stride", 1), ("padding", 0), ("dilation", 1)):
            v = tuple(getattr(self, name))
            if len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < low for x in v):
                raise ValueError(f"conv {name} must be two ints >= {low}, got {v!r}")
            object.__setattr__(self, name, v)
        if self.c % self.groups:
            raise ValueError(f"{self.c} input channels do not split into {self.groups} groups")
        if self.p < 1 or self.q < 1:
            raise ValueError(f"the {self.r}x{self.s} kernel does not fit the padded {self.h}x{self.w} input")

    @property
    def p(self) -> int:
        return (self.h + 2 * self.padding[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.padding[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    def to_dict(self) -> dict[str, Any]:
        return {
            "h": self.h,
            "w": self.w,
            "c": self.c,
            "r": self.r,
            "s": self.s,
            "stride": list(self.stride),
            "padding": list(self.padding),
            "dilation": list(self.dilation),
            "groups": self.groups,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConvGeometry:
        try:
            return cls(
                **{k: d[k] for k in ("h", "w", "c", "r", "s", "groups")},
                **{k: tuple(d[k]) for k in ("stride", "padding", "dilation")},
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a valid conv geometry: missing or malformed {e}") from e


def conv_of(problem: Problem) -> ConvGeometry | None:
    """A problem's convolution geometry, or None (a problem of another kind)."""
    g = problem.geometry
    return g if isinstance(g, ConvGeometry) else None


def _geometry(problem: Problem) -> ConvGeometry:
    g = conv_of(problem)
    assert g is not None, "a conv2d problem carries its ConvGeometry (Problem checks)"
    return g


def problem_error(problem: Problem) -> str | None:
    """Why a conv2d problem's shape is not its geometry's GEMM view, or None."""
    g, s = _geometry(problem), problem.shape
    want = (g.p * g.q, g.r * g.s * g.c_per_group)
    if (s.m, s.k) != want or not isinstance(s.n, int) or s.n % g.groups:
        return f"conv shape {s} does not match its geometry (m, k) = {want}"
    return None


def label(problem: Problem) -> str:
    """A convolution in its own terms, N x C x H x W -> K x P x Q, the kernel, and
    stride/dilation/groups where not 1 (as ``ConvSpec.label``), not its GEMM view."""
    g, s = _geometry(problem), problem.shape
    extra = "".join(
        f" {name}{v[0] if v[0] == v[1] else v}"
        for name, v in (("s", g.stride), ("d", g.dilation))
        if v != (1, 1)
    ) + (f" g{g.groups}" if g.groups != 1 else "")
    return f"{s.batch}x{g.c}x{g.h}x{g.w} -> {s.n}x{g.p}x{g.q} {g.r}x{g.s}{extra}"


def transfer_key(problem: Problem) -> tuple[object, ...]:
    """Convolutions share configs across input sizes alone: the same kernel, channels,
    stride, padding, dilation and groups."""
    d = _geometry(problem).to_dict()
    return tuple(sorted((k, str(v)) for k, v in d.items() if k not in ("h", "w")))


def conv_problem(
    x: torch.Tensor,
    weight: torch.Tensor,
    geometry: ConvGeometry,
    epilogue: Epilogue,
    operands: list[tuple[str, str, torch.Tensor]],
    precision: str,
    template_hash: str,
    batch: Dim | None = None,
) -> Problem:
    """The conv2d Problem of checked tensors (real or fake): (name, broadcast, tensor) per operand;
    ``template_hash`` is the registry's for the epilogue (``registry.template_hash``); ``batch``:
    the images as a symbolic dim (a dynamic batch), else the input's."""
    specs = [
        OperandSpec(
            name,
            dtypes.name_of(t.dtype),
            {"row": "vector", "scalar": "scalar"}.get(broadcast) or conv_layout(t),
        )
        for name, broadcast, t in operands
    ]
    n, k = x.shape[0], weight.shape[0]
    return Problem(
        op="conv2d",
        template="conv2d",
        template_hash=template_hash,
        dtype=dtypes.name_of(x.dtype),
        layout_a=conv_layout(x),
        layout_b=conv_layout(weight),
        operands=tuple(specs),
        epilogue=epilogue,
        shape=Shape(
            int(n) if batch is None else batch,
            geometry.p * geometry.q,
            int(k),
            geometry.r * geometry.s * geometry.c_per_group,
        ),
        precision=precision if x.dtype == torch.float32 else "ieee",
        geometry=geometry,
    )


def conv_layout(t: torch.Tensor) -> str:
    """nhwc for channels_last memory, else nchw for contiguous memory (a tensor that is both,
    such as a 1x1 weight, is nhwc), else strided."""
    if t.is_contiguous(memory_format=torch.channels_last):
        return "nhwc"
    return "nchw" if t.is_contiguous() else "strided"


def layout_for(shape: tuple[int, ...], memory: str) -> str:
    """The layout name ``conv_layout`` gives a fresh tensor of ``shape`` in ``memory``
    (nhwc: channels_last, nchw: contiguous)."""
    t = torch.empty(shape, device="meta")
    return conv_layout(t.contiguous(memory_format=torch.channels_last) if memory == "nhwc" else t)
