"""Building epilogues: ``Expr`` nodes under construction, the leaves (``acc``, ``acc2``,
``operand``, ``const``), ``apply`` and ``ops.<rule>`` for the rule table's ops, ``row_total``
and ``group_max``, and the checks every node's op and attributes pass. ``Epilogue.build``
(``ir/epilogue.py``) makes the canonical IR of what these build; import them from there.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epilab.ir.dtypes import OUTPUT_DTYPES
from epilab.ir.rules import RULES, STRING_ATTRS

AttrValue = float | bool | str

# ops over a whole output row, not pointwise: the value summed over the row's columns, one fp32
# value per row broadcast back along it (the tile must hold the row: masked columns add 0)
ROW_OPS = ("row_total",)
# ops over aligned groups of ``size`` columns of a row: the max over the group, broadcast back
# (the tile must hold whole groups: masked columns count as -inf)
GROUP_OPS = ("group_max",)
MAX_GROUP = 1024  # group widths are powers of two up to this (Triton reshapes the tile by them)
ACCUMULATORS = ("acc", "acc2")  # the leaves a template computes: A @ B, and A @ B2 (dual GEMMs)
BROADCASTS = ("row", "col", "tile", "scalar")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")  # fullmatch: no trailing newline


def check_operand_name(name: object) -> str:
    """Operand names become kernel parameter names: plain identifiers only."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ValueError(
            f"operand name {name!r} is not allowed; use a Python identifier of at most "
            "32 characters (letters, digits, underscore)"
        )
    return name


@dataclass(frozen=True, eq=False)
class Expr:
    """A node under construction; arithmetic operators build rule nodes."""

    op: str
    args: tuple[Expr, ...] = ()
    attrs: tuple[tuple[str, AttrValue], ...] = ()

    def __add__(self, o: ExprLike) -> Expr:
        return apply("add", self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return apply("add", o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return apply("sub", self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return apply("sub", o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return apply("mul", self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return apply("mul", o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        return apply("div", self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        return apply("div", o, self)

    def __neg__(self) -> Expr:
        return apply("neg", self)

    def __abs__(self) -> Expr:
        return apply("abs", self)


ExprLike = Expr | float | int | bool


def acc() -> Expr:
    """The fp32 accumulator of the anchor (A @ B)."""
    return Expr("acc")


def acc2() -> Expr:
    """The second fp32 accumulator of a dual GEMM (A @ B2; ``acc`` is A @ B)."""
    return Expr("acc2")


def operand(name: str, broadcast: str) -> Expr:
    """A tensor loaded per output element; ``broadcast`` is row, col, tile or scalar."""
    check_operand_name(name)
    if broadcast not in BROADCASTS:
        raise ValueError(f"operand broadcast {broadcast!r} is not one of {BROADCASTS}")
    return Expr("operand", attrs=(("broadcast", broadcast), ("name", name)))


def const(value: float | int | bool) -> Expr:
    if isinstance(value, bool):
        return Expr("const", attrs=(("value", value),))
    if not isinstance(value, (int, float)):
        raise TypeError(f"a constant must be a float, int or bool, got {type(value).__name__}")
    return Expr("const", attrs=(("value", ir_float(value)),))


def ir_float(v: float) -> float:
    """Floats as stored in the IR: NaN is always the one ``math.nan`` object, so
    that equal epilogues compare and hash equal (containers compare by identity first)."""
    return math.nan if v != v else float(v)


def as_expr(x: ExprLike) -> Expr:
    return x if isinstance(x, Expr) else const(x)


def apply(op: str, *args: ExprLike, **attrs: Any) -> Expr:
    """Apply rule ``op`` to arguments (Exprs or numbers) with its attributes."""
    rule = RULES.get(op)
    if rule is None:
        raise ValueError(f"unknown epilogue op {op!r}; known ops: {sorted(RULES)}")
    if len(args) != rule.arity:
        raise ValueError(f"op {op!r} takes {rule.arity} argument(s), got {len(args)}")
    return Expr(op, tuple(as_expr(a) for a in args), check_attrs(op, attrs))


def row_total(x: ExprLike) -> Expr:
    """The sum of ``x`` over every column of its output row, broadcast along the row."""
    return Expr("row_total", (as_expr(x),), ())


def group_max(x: ExprLike, size: int) -> Expr:
    """The max of ``x`` over its group of ``size`` columns, broadcast along the group."""
    return Expr("group_max", (as_expr(x),), check_attrs("group_max", {"size": size}))


class _Ops:
    """``ops.gelu(x)``, ``ops.clamp(x, min=0.0, max=6.0)``: one builder per rule."""

    def __getattr__(self, op: str) -> Callable[..., Expr]:
        if op not in RULES:
            raise AttributeError(f"no epilogue op {op!r}; known ops: {sorted(RULES)}")
        return lambda *args, **attrs: apply(op, *args, **attrs)

    def __dir__(self) -> list[str]:
        return sorted(RULES)


ops = _Ops()


def check_attrs(op: str, attrs: Mapping[str, Any]) -> tuple[tuple[str, AttrValue], ...]:
    if op == "operand":
        expected: tuple[str, ...] = ("broadcast", "name")
    elif op == "const":
        expected = ("value",)
    elif op in ACCUMULATORS or op in ROW_OPS:
        expected = ()
    elif op in GROUP_OPS:
        expected = ("size",)
    elif op in RULES:
        expected = RULES[op].attrs
    else:
        raise ValueError(f"unknown epilogue op {op!r}; known ops: {sorted(RULES)}")
    if set(attrs) != set(expected):
        raise ValueError(f"op {op!r} takes attributes {list(expected)}, got {sorted(attrs)}")
    out: list[tuple[str, AttrValue]] = []
    for key in sorted(attrs):
        v = attrs[key]
        if op in ("operand",) or key in STRING_ATTRS:
            if not isinstance(v, str):
                raise ValueError(f"attribute {key!r} of {op!r} must be a string, got {v!r}")
            if key == "dtype" and v not in OUTPUT_DTYPES:
                raise ValueError(f"cast to {v!r}: dtype must be one of {sorted(OUTPUT_DTYPES)}")
        elif op == "const" and isinstance(v, bool):
            pass
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            v = ir_float(v)
            if op in GROUP_OPS and not is_group_width(v):
                raise ValueError(f"group_max's size must be a power of two from 2 to {MAX_GROUP}, got {v!r}")
        else:
            raise ValueError(f"attribute {key!r} of {op!r} must be a number, got {v!r}")
        out.append((key, v))
    return tuple(out)


def is_group_width(v: object) -> bool:
    """Whether ``v`` is a group width: a power of two from 2 to ``MAX_GROUP``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
        return False
    return 2 <= v <= MAX_GROUP and not int(v) & (int(v) - 1)
