"""The pointwise rule table: every op an epilogue may contain, one row each.

A row renders its op twice: to a Triton expression over fp32 values (what the
templates emit) and to a torch function (the float64 reference). Adding an op is
adding a row. Triton forms are ``str.format`` patterns over ``{0}``, ``{1}``...
(argument variables) and ``{attr}`` (attributes, rendered as literals); the few
ops whose form depends on an attribute's value use a small function instead.

Every value inside an epilogue is fp32 (``kind="float"``) or a predicate
(``kind="bool"``); a cast rounds through its dtype and comes back as fp32, which
is what the unfused graph's intermediate rounding does.

Forms avoid ``libdevice`` (Triton's interpreter cannot run it): gelu(tanh) goes through
sigmoid, tanh is Cephes' tanhf (a polynomial near 0), log1p the compensated ``log(1+x)``
form. Special values (+-0, +-inf, NaN, subnormals, huge) come out as torch's, attributes
included: ``tests/test_special_values.py`` runs every row. A NaN clamp bound gives NaN, as
torch.clamp with both bounds and Inductor's lowering do (eager clamp_min and clamp_max of torch
2.11 ignore a NaN bound, 2.13's CPU kernels do not: torch disagrees with itself there).

Fast forms (the ``fast`` column: sigmoid, silu, gelu, gelu_tanh, tanh) call the helpers of
``fast_math.py.jinja``: the GPU's approximate ex2, rcp and tanh through inline PTX. A template
renders them for the nodes whose every value ends in an output of a dtype in
``FAST_OUTPUT_DTYPES`` (``Epilogue.fast_nodes``); fp32 outputs, statistics and predicates keep
the exact forms. The bound, tested over every bfloat16 and float16 input against float64
(``tests/test_fast_math.py``; on the GPU with the real instructions): rounded to the output
dtype, a fast form is never more than one unit in the last place of that dtype
(``FAST_ULPS``) further from the float64 value than torch's own fp32 computation rounded the
same way, plus ``FAST_ABS_FLOOR`` absolutely (sigmoid factors below 2^-126, for x < -87.3,
flush to zero; torch's own fp32 exp overflows there too from x < -88.7); special values
(+-0, +-inf, NaN) as torch.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Kind = Literal["float", "bool"]
ArgKind = Literal["float", "bool", "any"]

# dtypes an epilogue may cast to or store, by canonical name (torch's own name for each: its
# torch dtype is ``DTYPES[name]``), with its element size in bytes
DTYPE_SIZES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
TRITON_DTYPES: dict[str, str] = {
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "float32": "tl.float32",
    "bool": "tl.int1",
    "float8_e4m3fn": "tl.float8e4nv",
    "float8_e5m2": "tl.float8e5",
}
# fp8 casts saturate: values beyond the largest finite fp8 value (inf too) become it, NaN
# stays NaN, as cuBLASLt's fp8 outputs and the quantize step of fp8 recipes do
FP8_MAX: dict[str, float] = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
_ROUND_FN = {"bfloat16": "to_bf16", "float8_e4m3fn": "to_fp8e4nv", "float8_e5m2": "to_fp8e5"}
# outputs whose rounding dominates the fast forms' errors, and the bound the fast forms keep
FAST_OUTPUT_DTYPES = frozenset({"bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"})
FAST_ULPS = 1.0
FAST_ABS_FLOOR = 2.0**-100


class _Deferred:
    """A module's functions, imported at their first call: the table's torch column names
    ``torch.add`` without importing torch, so that reading the table (the problems, their
    epilogues, the work list of ``epilab tune``) does not."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Callable[..., Any]:
        module = self._module

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(importlib.import_module(module), name)(*args, **kwargs)

        call.__name__ = call.__qualname__ = f"{module}.{name}"
        return call


_torch, _F = _Deferred("torch"), _Deferred("torch.nn.functional")


@cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    import torch

    return {name: getattr(torch, name) for name in DTYPE_SIZES}


def __getattr__(name: str) -> Any:  # DTYPES: name -> torch dtype, torch imported on first use
    if name == "DTYPES":
        return _torch_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def literal(value: float | bool) -> str:
    """A Python/Triton literal for a constant: exact, and stable across processes."""
    if isinstance(value, bool):
        return "True" if value else "False"
    v = float(value)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


# the GPU's rsqrt.approx flushes subnormal inputs to 0 (giving inf): scale them into the
# normal range first, by 2^64, and the result back by 2^32
_RSQRT = (
    "tl.where(tl.abs({0}) < 1.1754943508222875e-38, tl.rsqrt({0} * 1.8446744073709552e19)"
    " * 4294967296.0, tl.rsqrt({0}))"
)
# exponents small enough to multiply out (exact to a few ulp where exp2(e * log2|x|) loses
# |e * log2 x| ulp, and it keeps the sign of -0 and the overflow of torch's own forms)
_POW_BY_MULTIPLYING = 16


def _power_product(x: str, n: int) -> str:
    """x ** n for an integer 1 <= n, by squaring: at most 2 log2(n) multiplies."""
    if n == 1:
        return x
    half = _power_product(x, n // 2)
    square = f"({half} * {half})"
    return f"({square} * {x})" if n % 2 else square


def _pow_triton(x: str, exponent: float) -> str:
    """x ** exponent for a constant exponent, specialised on its value; special values as C's
    (and so torch's) pow: pow(x, 0) = 1 (NaN too), pow(1, y) = 1, pow(-inf, 1.5) = inf,
    pow(x < 0, non-integer) = NaN."""
    if math.isnan(exponent):
        return f"tl.where({x} == 1.0, 1.0, float('nan'))"
    if math.isinf(exponent):  # |x| < 1 goes to 0 (or inf for -inf), |x| > 1 the other way
        small, large = ("0.0", 'float("inf")') if exponent > 0 else ('float("inf")', "0.0")
        return (
            f"tl.where({x} != {x}, {x}, tl.where(tl.abs({x}) == 1.0, 1.0, "
            f"tl.where(tl.abs({x}) < 1.0, {small}, {large})))"
        )
    if exponent == 0.0:
        return f"tl.full({x}.shape, 1.0, tl.float32)"
    if exponent == 0.5:
        return f"tl.sqrt_rn({x})"
    if exponent == -0.5:
        return _RSQRT.format(x)
    if exponent.is_integer() and abs(exponent) <= _POW_BY_MULTIPLYING:
        product = _power_product(x, int(abs(exponent)))
        return product if exponent > 0 else f"1.0 / {product}"
    magnitude = f"tl.exp2({literal(exponent)} * tl.log2(tl.abs({x})))"
    if exponent.is_integer():  # defined for negative x: the sign follows the parity (-0 too)
        odd = int(exponent) % 2 == 1
        negative = f"({x}.to(tl.int32, bitcast=True) < 0)"
        return f"tl.where({negative}, -{magnitude}, {magnitude})" if odd else magnitude
    return f"tl.where(({x} < 0.0) & ({x} > float('-inf')), float('nan'), {magnitude})"


def rounded(x: str, dtype: str) -> str:
    """Triton expression of fp32 ``x`` rounded to the float ``dtype`` (to nearest, ties to
    even; fp8 saturating). bfloat16 and fp8 go through the kernel module's ``to_bf16``,
    ``to_fp8e4nv`` and ``to_fp8e5`` (rounding.py.jinja), which also round that way in
    Triton's interpreter; its own casts truncate."""
    fn = _ROUND_FN.get(dtype)
    return f"{fn}({x})" if fn else f"{x}.to({TRITON_DTYPES[dtype]})"


def _cast_triton(x: str, dtype: str) -> str:
    """Round through ``dtype`` (a float or a predicate in, fp32 or a predicate out)."""
    if dtype == "bool":
        return f"{x} != 0"
    f = f"{x}.to(tl.float32)"  # a predicate becomes 0.0 / 1.0 (the rounding helpers bit-cast fp32)
    if dtype == "float32":
        return f
    back = f"{rounded(f, dtype)}.to(tl.float32)"
    if dtype in FP8_MAX:  # NaN stays NaN (the interpreter reads fp8 NaN bits back as numbers)
        return f"tl.where({f} != {f}, {f}, {back})"
    return back


def _cast_torch(x: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype in FP8_MAX:  # saturating (torch's own fp8 casts saturate on some builds only)
        x = _torch.clamp(x, -FP8_MAX[dtype], FP8_MAX[dtype])
    return x != 0 if dtype == "bool" else x.to(_torch_dtypes()[dtype])  # evaluator restores its dtype


@dataclass(frozen=True)
class Rule:
    name: str
    arity: int
    triton: str | Callable[..., str]
    torch: Callable[..., torch.Tensor]
    attrs: tuple[str, ...] = ()
    kind: Kind = "float"  # kind of the result
    arg_kinds: tuple[ArgKind, ...] | None = None  # what each argument is coerced to; None: all float
    commutative: bool = False
    fast: str | None = None  # the form over fast_math.py.jinja's approximations (Epilogue.fast_nodes)

    def arg_kind(self, i: int) -> ArgKind:
        return "float" if self.arg_kinds is None else self.arg_kinds[i]

    def render_triton(self, args: list[str], attrs: dict[str, object], *, fast: bool = False) -> str:
        if fast and self.fast is not None:
            return self.fast.format(*args)
        if callable(self.triton):
            return self.triton(*args, **attrs)
        return self.triton.format(*args, **{k: _attr_literal(v) for k, v in attrs.items()})


def _attr_literal(v: object) -> str:
    return literal(v) if isinstance(v, (int, float)) else str(v)


def _bounded(low: str | None, high: str | None) -> str:
    """min(max(x, low), high) as torch.clamp computes it: a NaN argument or bound gives NaN,
    a low bound above the high one gives the high one."""
    form = "{0}"
    if low is not None:
        form = f"tl.maximum({form}, {low}, propagate_nan=tl.PropagateNan.ALL)"
    if high is not None:
        form = f"tl.minimum({form}, {high}, propagate_nan=tl.PropagateNan.ALL)"
    return form


# tanh as Cephes' tanhf: an odd polynomial below |x| = 0.625 (where 1 - 2 / (e^2x + 1) cancels:
# it turned 1e-8 into 0), that form above it (e^2x overflowing to inf gives 1 exactly)
_TANH = (
    "tl.where(tl.abs({0}) < 0.625, {0} + {0} * ({0} * {0}) * (((((-5.70498872745e-3 * ({0} * {0})"
    " + 2.06390887954e-2) * ({0} * {0}) - 5.37397155531e-2) * ({0} * {0}) + 1.33314422036e-1)"
    " * ({0} * {0}) - 3.33332819422e-1)), tl.where({0} < 0.0, -1.0, 1.0)"
    " * (1.0 - 2.0 / (tl.exp(2.0 * tl.abs({0})) + 1.0)))"
)
_GELU_TANH_K = 2.0 * math.sqrt(2.0 / math.pi)  # gelu_tanh(x) == x * sigmoid(K (x + 0.044715 x^3))

# fmt: off
RULES: dict[str, Rule] = {r.name: r for r in [
    # arithmetic
    Rule("add", 2, "{0} + {1}", _torch.add, commutative=True),
    Rule("sub", 2, "{0} - {1}", _torch.sub),
    Rule("mul", 2, "{0} * {1}", _torch.mul, commutative=True),
    Rule("div", 2, "{0} / {1}", _torch.div),
    Rule("neg", 1, "-{0}", _torch.neg),
    Rule("abs", 1, "tl.abs({0})", _torch.abs),
    Rule("maximum", 2, "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", _torch.maximum, commutative=True),  # noqa: E501
    Rule("minimum", 2, "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", _torch.minimum, commutative=True),  # noqa: E501
    Rule("reciprocal", 1, "1.0 / {0}", _torch.reciprocal),
    Rule("pow", 1, _pow_triton, lambda x, exponent: _torch.pow(x, exponent), attrs=("exponent",)),
    # comparisons and selection
    Rule("gt", 2, "{0} > {1}", _torch.gt, kind="bool"),
    Rule("ge", 2, "{0} >= {1}", _torch.ge, kind="bool"),
    Rule("lt", 2, "{0} < {1}", _torch.lt, kind="bool"),
    Rule("le", 2, "{0} <= {1}", _torch.le, kind="bool"),
    Rule("eq", 2, "{0} == {1}", _torch.eq, kind="bool", commutative=True),
    Rule("ne", 2, "{0} != {1}", _torch.ne, kind="bool", commutative=True),
    Rule("logical_and", 2, "{0} & {1}", _torch.logical_and, kind="bool", arg_kinds=("bool", "bool"), commutative=True),  # noqa: E501
    Rule("logical_or", 2, "{0} | {1}", _torch.logical_or, kind="bool", arg_kinds=("bool", "bool"), commutative=True),  # noqa: E501
    Rule("logical_not", 1, "{0} == 0", _torch.logical_not, kind="bool", arg_kinds=("bool",)),
    Rule("where", 3, "tl.where({0}, {1}, {2})", _torch.where, arg_kinds=("bool", "float", "float")),
    # transcendental
    Rule("exp", 1, "tl.exp({0})", _torch.exp),
    Rule("exp2", 1, "tl.exp2({0})", _torch.exp2),
    Rule("log", 1, "tl.log({0})", _torch.log),
    Rule("log1p", 1, "tl.where((1.0 + {0} == 1.0) | ({0} == float('inf')), {0}, tl.log(1.0 + {0}) * ({0} / ((1.0 + {0}) - 1.0)))", _torch.log1p),  # noqa: E501
    Rule("sqrt", 1, "tl.sqrt_rn({0})", _torch.sqrt),
    Rule("rsqrt", 1, _RSQRT.format("{0}"), _torch.rsqrt),
    Rule("sigmoid", 1, "tl.sigmoid({0})", _torch.sigmoid, fast="fast_sigmoid({0})"),
    Rule("tanh", 1, _TANH, _torch.tanh, fast="approx_tanh({0})"),
    Rule("erf", 1, "tl.erf({0})", _torch.erf),
    # activations
    Rule("relu", 1, "tl.where({0} < 0.0, 0.0, {0})", _torch.relu),
    Rule("gelu", 1, "0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476))", _F.gelu, fast="fast_gelu({0})"),
    Rule("gelu_tanh", 1, "{0} * tl.sigmoid(" + repr(_GELU_TANH_K) + " * ({0} + 0.044715 * {0} * {0} * {0}))", lambda x: _F.gelu(x, approximate="tanh"), fast="fast_gelu_tanh({0})"),  # noqa: E501
    Rule("silu", 1, "{0} * tl.sigmoid({0})", _F.silu, fast="fast_silu({0})"),
    Rule("leaky_relu", 1, "tl.where({0} > 0.0, {0}, {0} * {negative_slope})", lambda x, negative_slope: _F.leaky_relu(x, negative_slope), attrs=("negative_slope",)),  # noqa: E501
    Rule("clamp", 1, _bounded("{min}", "{max}"), lambda x, min, max: _torch.clamp(x, min, max), attrs=("min", "max")),  # noqa: E501
    Rule("clamp_min", 1, _bounded("{min}", None), lambda x, min: _torch.clamp(x, min=min), attrs=("min",)),
    Rule("clamp_max", 1, _bounded(None, "{max}"), lambda x, max: _torch.clamp(x, max=max), attrs=("max",)),
    Rule("hardtanh", 1, _bounded("{min_val}", "{max_val}"), lambda x, min_val, max_val: _F.hardtanh(x, min_val, max_val), attrs=("min_val", "max_val")),  # noqa: E501
    # dtype casts: round through the dtype, continue in fp32 (or as a predicate)
    Rule("cast", 1, _cast_triton, _cast_torch, attrs=("dtype",), arg_kinds=("any",)),
]}
# fmt: on

STRING_ATTRS = frozenset({"dtype"})  # every other attribute is a float


def result_kind(op: str, attrs: dict[str, object]) -> Kind:
    """Kind of an op's result (a cast to bool gives a predicate)."""
    if op == "cast":
        return "bool" if attrs["dtype"] == "bool" else "float"
    return RULES[op].kind
