"""The pointwise rule table: every op an epilogue may contain, one row each.

A row renders its op twice: to a Triton expression over fp32 values (what the
templates emit) and to a torch function (the float64 reference). Adding an op is
adding a row. Triton forms are ``str.format`` patterns over ``{0}``, ``{1}``...
(argument variables) and ``{attr}`` (attributes, rendered as literals); the few
ops whose form depends on an attribute's value use a small function instead.

Every value inside an epilogue is fp32 (``kind="float"``) or a predicate
(``kind="bool"``); a cast rounds through its dtype and comes back as fp32, which
is what the unfused graph's intermediate rounding does.

Forms avoid ``libdevice`` (Triton's interpreter cannot run it): tanh and
gelu(tanh) go through sigmoid, log1p uses the compensated ``log(1+x)`` form.

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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Kind = Literal["float", "bool"]
ArgKind = Literal["float", "bool", "any"]

# dtypes an epilogue may cast to or store, by canonical name
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
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


def _pow_triton(x: str, exponent: float) -> str:
    """x ** exponent for a constant exponent, specialised on its value."""
    if exponent == 0.0:
        return f"tl.full({x}.shape, 1.0, tl.float32)"
    if exponent == 1.0:
        return x
    if exponent == 2.0:
        return f"{x} * {x}"
    if exponent == 3.0:
        return f"{x} * {x} * {x}"
    if exponent == 0.5:
        return f"tl.sqrt_rn({x})"
    if exponent == -0.5:
        return f"tl.rsqrt({x})"
    if exponent == -1.0:
        return f"1.0 / {x}"
    magnitude = f"tl.exp2({literal(exponent)} * tl.log2(tl.abs({x})))"
    if exponent.is_integer():  # defined for negative x: sign follows the parity
        odd = int(exponent) % 2 == 1
        return f"tl.where({x} < 0.0, -{magnitude}, {magnitude})" if odd else magnitude
    return f"tl.where({x} < 0.0, float('nan'), {magnitude})"


def rounded(x: str, dtype: str) -> str:
    """Triton expression of fp32 ``x`` rounded to the float ``dtype`` (to nearest, ties to
    even; fp8 saturating). bfloat16 and fp8 go through the kernel module's ``to_bf16``,
    ``to_fp8e4nv`` and ``to_fp8e5`` (rounding.py.jinja), which also round that way in
    Triton's interpreter; its own casts truncate."""
    fn = _ROUND_FN.get(dtype)
    return f"{fn}({x})" if fn else f"{x}.to({TRITON_DTYPES[dtype]})"


def _cast_triton(x: str, dtype: str) -> str:
    """Round through ``dtype`` (any kind in, fp32 or a predicate out)."""
    if dtype == "bool":
        return f"{x} != 0"
    if dtype == "float32":
        return f"{x}.to(tl.float32)"
    return f"{rounded(x, dtype)}.to(tl.float32)"


def _cast_torch(x: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype in FP8_MAX:  # saturating (torch's own fp8 casts saturate on some builds only)
        x = torch.clamp(x, -FP8_MAX[dtype], FP8_MAX[dtype])
    return x != 0 if dtype == "bool" else x.to(DTYPES[dtype])  # evaluator restores its dtype


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


_GELU_TANH_K = 2.0 * math.sqrt(2.0 / math.pi)  # gelu_tanh(x) == x * sigmoid(K (x + 0.044715 x^3))

# fmt: off
RULES: dict[str, Rule] = {r.name: r for r in [
    # arithmetic
    Rule("add", 2, "{0} + {1}", torch.add, commutative=True),
    Rule("sub", 2, "{0} - {1}", torch.sub),
    Rule("mul", 2, "{0} * {1}", torch.mul, commutative=True),
    Rule("div", 2, "{0} / {1}", torch.div),
    Rule("neg", 1, "-{0}", torch.neg),
    Rule("abs", 1, "tl.abs({0})", torch.abs),
    Rule("maximum", 2, "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", torch.maximum, commutative=True),  # noqa: E501
    Rule("minimum", 2, "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", torch.minimum, commutative=True),  # noqa: E501
    Rule("reciprocal", 1, "1.0 / {0}", torch.reciprocal),
    Rule("pow", 1, _pow_triton, lambda x, exponent: torch.pow(x, exponent), attrs=("exponent",)),
    # comparisons and selection
    Rule("gt", 2, "{0} > {1}", torch.gt, kind="bool"),
    Rule("ge", 2, "{0} >= {1}", torch.ge, kind="bool"),
    Rule("lt", 2, "{0} < {1}", torch.lt, kind="bool"),
    Rule("le", 2, "{0} <= {1}", torch.le, kind="bool"),
    Rule("eq", 2, "{0} == {1}", torch.eq, kind="bool", commutative=True),
    Rule("ne", 2, "{0} != {1}", torch.ne, kind="bool", commutative=True),
    Rule("logical_and", 2, "{0} & {1}", torch.logical_and, kind="bool", arg_kinds=("bool", "bool"), commutative=True),  # noqa: E501
    Rule("logical_or", 2, "{0} | {1}", torch.logical_or, kind="bool", arg_kinds=("bool", "bool"), commutative=True),  # noqa: E501
    Rule("logical_not", 1, "{0} == 0", torch.logical_not, kind="bool", arg_kinds=("bool",)),
    Rule("where", 3, "tl.where({0}, {1}, {2})", torch.where, arg_kinds=("bool", "float", "float")),
    # transcendental
    Rule("exp", 1, "tl.exp({0})", torch.exp),
    Rule("exp2", 1, "tl.exp2({0})", torch.exp2),
    Rule("log", 1, "tl.log({0})", torch.log),
    Rule("log1p", 1, "tl.where(1.0 + {0} == 1.0, {0}, tl.log(1.0 + {0}) * {0} / ((1.0 + {0}) - 1.0))", torch.log1p),  # noqa: E501
    Rule("sqrt", 1, "tl.sqrt_rn({0})", torch.sqrt),
    Rule("rsqrt", 1, "tl.rsqrt({0})", torch.rsqrt),
    Rule("sigmoid", 1, "tl.sigmoid({0})", torch.sigmoid, fast="fast_sigmoid({0})"),
    Rule("tanh", 1, "2.0 * tl.sigmoid(2.0 * {0}) - 1.0", torch.tanh, fast="approx_tanh({0})"),
    Rule("erf", 1, "tl.erf({0})", torch.erf),
    # activations
    Rule("relu", 1, "tl.where({0} < 0.0, 0.0, {0})", torch.relu),
    Rule("gelu", 1, "0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476))", F.gelu, fast="fast_gelu({0})"),
    Rule("gelu_tanh", 1, "{0} * tl.sigmoid(" + repr(_GELU_TANH_K) + " * ({0} + 0.044715 * {0} * {0} * {0}))", lambda x: F.gelu(x, approximate="tanh"), fast="fast_gelu_tanh({0})"),  # noqa: E501
    Rule("silu", 1, "{0} * tl.sigmoid({0})", F.silu, fast="fast_silu({0})"),
    Rule("leaky_relu", 1, "tl.where({0} > 0.0, {0}, {0} * {negative_slope})", lambda x, negative_slope: F.leaky_relu(x, negative_slope), attrs=("negative_slope",)),  # noqa: E501
    Rule("clamp", 1, "tl.where({0} < {min}, {min}, tl.where({0} > {max}, {max}, {0}))", lambda x, min, max: torch.clamp(x, min, max), attrs=("min", "max")),  # noqa: E501
    Rule("clamp_min", 1, "tl.where({0} < {min}, {min}, {0})", lambda x, min: torch.clamp(x, min=min), attrs=("min",)),  # noqa: E501
    Rule("clamp_max", 1, "tl.where({0} > {max}, {max}, {0})", lambda x, max: torch.clamp(x, max=max), attrs=("max",)),  # noqa: E501
    Rule("hardtanh", 1, "tl.where({0} < {min_val}, {min_val}, tl.where({0} > {max_val}, {max_val}, {0}))", lambda x, min_val, max_val: F.hardtanh(x, min_val, max_val), attrs=("min_val", "max_val")),  # noqa: E501
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
