"""ATen pointwise ops the compiler folds into epilogues: one row each.

Each row turns the op's arguments (already epilogue expressions: group values,
operands or constants) and its keyword arguments into an expression of the
epilogue IR's rule table, or raises ``Unsupported`` for argument values the rule
table cannot express (a rounding mode, an integer dtype). Ops absent from this
table end an epilogue group. Activations arrive decomposed in the post-grad graph
(gelu as mul/erf/add, silu as mul/sigmoid), so most rows are plain arithmetic.

Views and copies that keep every element where it is (``VIEWS``, ``IDENTITY``)
are not in this table: the matcher handles them, because they change shapes,
not values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from epilab.ir import dtypes
from epilab.ir.epilogue import Expr, ops

aten = torch.ops.aten
prims = torch.ops.prims


class Unsupported(ValueError):
    """An op or argument that an epilogue cannot express (ends the group)."""


def _scaled(x: Expr, alpha: object) -> Expr:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise Unsupported(f"alpha={alpha!r} is not a number")
    return x if alpha == 1 else x * float(alpha)


def _number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Unsupported(f"{name}={v!r} is not a number")
    return float(v)


def _cast(x: Expr, dtype: object) -> Expr:
    try:
        name = dtypes.name_of(dtype) if isinstance(dtype, torch.dtype) else None
    except TypeError:
        name = None
    if name is None and dtype is not torch.bool:
        raise Unsupported(f"a cast to {dtype} (epilogues hold float16, bfloat16, float32 and bool)")
    return ops.cast(x, dtype=name or "bool")


def _to_copy(x: Expr, dtype: object = None, **kw: Any) -> Expr:
    moved = {k: v for k, v in kw.items() if v is not None and k not in ("non_blocking", "memory_format")}
    if moved:
        raise Unsupported(f"_to_copy with {sorted(moved)}")
    return x if dtype is None else _cast(x, dtype)


def _div(a: Expr, b: Expr, rounding_mode: object = None) -> Expr:
    if rounding_mode is not None:
        raise Unsupported(f"division with rounding_mode={rounding_mode!r}")
    return a / b


def _gelu(x: Expr, approximate: str = "none") -> Expr:
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"gelu approximate={approximate!r}")
    return ops.gelu(x) if approximate == "none" else ops.gelu_tanh(x)


def _clamp(x: Expr, min: object = None, max: object = None) -> Expr:
    if min is None and max is None:
        return x
    if min is None:
        return ops.clamp_max(x, max=_number("max", max))
    if max is None:
        return ops.clamp_min(x, min=_number("min", min))
    return ops.clamp(x, min=_number("min", min), max=_number("max", max))


def _unary(name: str) -> Callable[[Expr], Expr]:
    return lambda x: getattr(ops, name)(x)


def _binary(name: str) -> Callable[[Expr, Expr], Expr]:
    return lambda a, b: getattr(ops, name)(a, b)


# fmt: off
POINTWISE: dict[Any, Callable[..., Expr]] = {
    aten.add.Tensor: lambda a, b, alpha=1: a + _scaled(b, alpha),
    aten.add.Scalar: lambda a, b, alpha=1: a + _scaled(b, alpha),
    aten.sub.Tensor: lambda a, b, alpha=1: a - _scaled(b, alpha),
    aten.sub.Scalar: lambda a, b, alpha=1: a - _scaled(b, alpha),
    aten.rsub.Scalar: lambda a, b, alpha=1: b - _scaled(a, alpha),
    aten.mul.Tensor: lambda a, b: a * b,
    aten.mul.Scalar: lambda a, b: a * b,
    aten.div.Tensor: _div,
    aten.div.Scalar: _div,
    aten.div.Tensor_mode: _div,
    aten.neg.default: lambda x: -x,
    aten.abs.default: abs,
    aten.maximum.default: _binary("maximum"),
    aten.minimum.default: _binary("minimum"),
    aten.reciprocal.default: _unary("reciprocal"),
    aten.pow.Tensor_Scalar: lambda x, e: ops.pow(x, exponent=_number("exponent", e)),
    aten.gt.Tensor: _binary("gt"), aten.gt.Scalar: _binary("gt"),
    aten.ge.Tensor: _binary("ge"), aten.ge.Scalar: _binary("ge"),
    aten.lt.Tensor: _binary("lt"), aten.lt.Scalar: _binary("lt"),
    aten.le.Tensor: _binary("le"), aten.le.Scalar: _binary("le"),
    aten.eq.Tensor: _binary("eq"), aten.eq.Scalar: _binary("eq"),
    aten.ne.Tensor: _binary("ne"), aten.ne.Scalar: _binary("ne"),
    aten.logical_and.default: _binary("logical_and"),
    aten.logical_or.default: _binary("logical_or"),
    aten.logical_not.default: _unary("logical_not"),
    aten.where.self: lambda c, a, b: ops.where(c, a, b),
    aten.exp.default: _unary("exp"),
    aten.exp2.default: _unary("exp2"),
    aten.log.default: _unary("log"),
    aten.log1p.default: _unary("log1p"),
    aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.tanh.default: _unary("tanh"),
    aten.erf.default: _unary("erf"),
    aten.relu.default: _unary("relu"),
    aten.gelu.default: _gelu,
    aten.silu.default: _unary("silu"),
    aten.leaky_relu.default: lambda x, negative_slope=0.01: ops.leaky_relu(x, negative_slope=_number("negative_slope", negative_slope)),  # noqa: E501
    aten.clamp.default: _clamp,
    aten.clamp_min.default: lambda x, min: _clamp(x, min=min),
    aten.clamp_max.default: lambda x, max: _clamp(x, max=max),
    aten.hardtanh.default: lambda x, min_val=-1.0, max_val=1.0: ops.hardtanh(x, min_val=_number("min_val", min_val), max_val=_number("max_val", max_val)),  # noqa: E501
    prims.convert_element_type.default: _cast,
    aten._to_copy.default: _to_copy,
}
# fmt: on

# Reductions over the last dim that a matmul group's epilogue can compute as a reduction output
# (row statistics, ``epilogue.REDUCTIONS``): the op, and what it reduces with
ROW_REDUCTIONS = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "max"}
# Ops that only reshape: the matcher follows them when they split or merge rows.
VIEWS = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default})
# Ops that copy values unchanged into a tensor of the same shape.
IDENTITY = frozenset({aten.clone.default, aten.alias.default})
# The anchors: matmul-like ops the templates implement.
ANCHORS = {
    aten.mm.default: "mm",
    aten.addmm.default: "addmm",
    aten.bmm.default: "bmm",
    aten.baddbmm.default: "baddbmm",
    aten.convolution.default: "conv2d",
    aten._scaled_mm.default: "scaled_mm",  # fp8 (cuBLASLt): an mm whose scales are epilogue operands
    aten._grouped_mm.default: "grouped_mm",  # a mixture of experts' projections (A [T, K], B [E, K, N])
}
SCALED_MM_ARGS = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
GROUPED_MM_ARGS = ("self", "mat2", "offs", "bias", "out_dtype")
