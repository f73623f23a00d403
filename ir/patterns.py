"""Decomposed activations recognised back into the rule table's named ops, and the
performance identity of an epilogue.

The compiler sees what AOTAutograd and Inductor's decompositions leave of an activation:
``F.gelu(y, approximate="tanh")`` arrives as ``0.5 * y * (1 + tanh(0.79788 * (y + 0.044715 *
y * y * y)))``, ``F.silu`` as ``y / (1 + exp(-y))``, ``F.relu6`` as two clamps. ``PATTERNS``
(one row per form, beside the rule table) rewrites each back into its op, so that equal
math gets equal IR: ``recognise`` keeps the semantics exactly (only forms that compute the
same values are rewritten, and a cast to the dtype an output is stored in is a no-op).

``identity`` goes further, for finding records: it also drops the intermediate rounding
casts (``cast(bfloat16)`` then back to fp32, as the unfused graph stores and reloads a
value) and names the operands by broadcast and position. What it keeps is what changes how
fast a kernel runs: the problem's shape, dtypes and layouts, and the epilogue's operands
(broadcast, dtype, layout: the bytes it reads), outputs (their dtypes: the bytes it writes) and
its ops. Rounding is a few ALU instructions per element and changes only the kernel
compiled, never the config that suits it: a record tuned without it serves the rounded
epilogue, and the other way round.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from epilab.ir.epilogue import Epilogue, Expr, ops
from epilab.ir.rules import RULES

_FLOAT_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Hole:
    """A place in a pattern: an expression (``X``) or a constant's value (``a``, ``b``)."""

    name: str


def _hole(name: str) -> Expr:
    return Expr("hole", attrs=(("name", name),))


X = _hole("X")
A, B = Hole("a"), Hole("b")
_GELU_TANH_K = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Pattern:
    name: str  # what it recognises
    form: Expr  # the decomposed form, over X and constant holes
    named: Callable[[Expr, dict[str, float]], Expr]  # the named op, from X's expression and the constants
    when: Callable[[dict[str, float]], bool] = lambda c: True


def _const_hole(h: Hole) -> Expr:
    return Expr("hole_const", attrs=(("name", h.name),))


# fmt: off
PATTERNS: list[Pattern] = [
    # GELU, tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    Pattern("gelu_tanh", (1.0 + ops.tanh((X + 0.044715 * (X * (X * X))) * _GELU_TANH_K)) * (X * 0.5),
            lambda x, c: ops.gelu_tanh(x)),
    Pattern("gelu_tanh", (1.0 + ops.tanh((X + 0.044715 * ops.pow(X, exponent=3.0)) * _GELU_TANH_K)) * (X * 0.5),  # noqa: E501
            lambda x, c: ops.gelu_tanh(x)),
    # GELU, erf form: 0.5 * x * (1 + erf(x / sqrt(2)))
    Pattern("gelu", (1.0 + ops.erf(X * 0.7071067811865476)) * (X * 0.5), lambda x, c: ops.gelu(x)),
    # SiLU and sigmoid
    Pattern("silu", X / (1.0 + ops.exp(-X)), lambda x, c: ops.silu(x)),
    Pattern("silu", X * ops.sigmoid(X), lambda x, c: ops.silu(x)),
    Pattern("sigmoid", 1.0 / (1.0 + ops.exp(-X)), lambda x, c: ops.sigmoid(x)),
    Pattern("sigmoid", ops.reciprocal(1.0 + ops.exp(-X)), lambda x, c: ops.sigmoid(x)),
    # ReLU, ReLU6, hardtanh, clamps: one clamp op (NaN passes through all of them)
    Pattern("relu", Expr("clamp_min", (X,), (("min", 0.0),)), lambda x, c: ops.relu(x)),
    Pattern("clamp", Expr("clamp_max", (Expr("clamp_min", (X,), (("min", A),)),), (("max", B),)),
            lambda x, c: ops.clamp(x, min=c["a"], max=c["b"]), when=lambda c: c["a"] <= c["b"]),
    Pattern("clamp", Expr("clamp_min", (Expr("clamp_max", (X,), (("max", B),)),), (("min", A),)),
            lambda x, c: ops.clamp(x, min=c["a"], max=c["b"]), when=lambda c: c["a"] <= c["b"]),
    Pattern("clamp", Expr("hardtanh", (X,), (("max_val", B), ("min_val", A))),
            lambda x, c: ops.clamp(x, min=c["a"], max=c["b"])),
    # leaky ReLU: where(x > 0, x, x * a)
    Pattern("leaky_relu", ops.where(ops.gt(X, 0.0), X, X * _const_hole(A)),
            lambda x, c: ops.leaky_relu(x, negative_slope=c["a"])),
]
# fmt: on

# Activations the rule table has no op for, written as the ops PyTorch's decompositions
# leave of them in post-grad graphs: a shapes file may name them (``epilogue_text``) and
# gets the identity of the compiler's form. They render as those ops: no template changes.
COMPOSITES: dict[str, Callable[[Expr], Expr]] = {
    "relu6": lambda x: ops.clamp(x, min=0.0, max=6.0),
    "hardsigmoid": lambda x: ops.clamp(x + 3.0, min=0.0, max=6.0) / 6.0,
    "hardswish": lambda x: x * ops.clamp(x + 3.0, min=0.0, max=6.0) / 6.0,
    "softplus": lambda x: ops.where(ops.gt(x, 20.0), x, ops.log1p(ops.exp(x))),
    "mish": lambda x: x * ops.tanh(ops.where(ops.gt(x, 20.0), x, ops.log1p(ops.exp(x)))),
}


def _close(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-7 * max(abs(a), abs(b)))


class _Matcher:
    def __init__(self, ep: Epilogue) -> None:
        self.nodes = ep.nodes

    def match(self, pattern: Expr, index: int, bound: dict[str, object]) -> bool:
        node = self.nodes[index]
        if pattern.op == "hole":
            name = str(pattern.attrs[0][1])
            if name in bound:
                return bound[name] == index
            bound[name] = index
            return True
        if pattern.op == "hole_const":
            return node.op == "const" and self._bind(str(pattern.attrs[0][1]), node.attrs[0][1], bound)
        if pattern.op != node.op or len(pattern.args) != len(node.args):
            return False
        if pattern.op == "const":
            v = node.attrs[0][1]
            return isinstance(v, float) and _close(float(pattern.attrs[0][1]), v)  # type: ignore[arg-type]
        if not self._attrs(pattern.attrs, node.attrs, bound):
            return False
        orders = [node.args]
        if pattern.op in RULES and RULES[pattern.op].commutative:
            orders.append(tuple(reversed(node.args)))
        for args in orders:
            trial = dict(bound)
            if all(self.match(p, a, trial) for p, a in zip(pattern.args, args, strict=True)):
                bound.update(trial)
                return True
        return False

    def _attrs(self, want: tuple, have: tuple, bound: dict[str, object]) -> bool:
        if [k for k, _ in want] != [k for k, _ in have]:
            return False
        for (_, w), (_, h) in zip(want, have, strict=True):
            if isinstance(w, Hole):
                if not self._bind(w.name, h, bound):
                    return False
            elif isinstance(w, float) and isinstance(h, float):
                if not _close(w, h):
                    return False
            elif w != h:
                return False
        return True

    @staticmethod
    def _bind(name: str, value: object, bound: dict[str, object]) -> bool:
        key = "const:" + name
        if key in bound:
            return bound[key] == value
        bound[key] = value
        return True


def _rewrite(ep: Epilogue, drop_rounding: bool) -> Epilogue:
    """One pass: every node that a pattern matches becomes its named op; with
    ``drop_rounding`` intermediate float-to-float casts go. Output casts to the output's own
    dtype go always (storing rounds to it anyway)."""
    matcher = _Matcher(ep)
    built: list[Expr] = []
    kinds = ep.kinds
    for i, node in enumerate(ep.nodes):
        args = [built[a] for a in node.args]
        expr = None
        for p in PATTERNS:
            bound: dict[str, object] = {}
            if matcher.match(p.form, i, bound):
                consts = {k[6:]: float(v) for k, v in bound.items() if k.startswith("const:")}  # type: ignore[arg-type]
                if p.when(consts):
                    expr = p.named(built[bound["X"]], consts)  # type: ignore[index]
                    break
        if expr is None:
            if (
                drop_rounding
                and node.op == "cast"
                and node.attr["dtype"] in _FLOAT_DTYPES
                and kinds[node.args[0]] == "float"
            ):
                expr = args[0]
            else:
                expr = Expr(node.op, tuple(args), node.attrs)
        built.append(expr)
    outputs = []
    for o in ep.outputs:
        node, e = ep.nodes[o.node], built[o.node]
        if (
            node.op == "cast"
            and node.attr["dtype"] == o.dtype
            and o.dtype in _FLOAT_DTYPES
            and kinds[node.args[0]] == "float"
        ):
            e = built[node.args[0]]  # storing as that dtype rounds to it anyway
        outputs.append(e)
    return ep.rebuilt(outputs)


def _fixpoint(ep: Epilogue, drop_rounding: bool) -> Epilogue:
    for _ in range(16):  # each pass only shrinks the graph
        after = _rewrite(ep, drop_rounding)
        if after == ep:
            return ep
        ep = after
    return ep


def recognise(ep: Epilogue) -> Epilogue:
    """``ep`` with decomposed activations as their named ops, computing the same values."""
    return _fixpoint(ep, drop_rounding=False)


def readable_form(ep: Epilogue) -> Epilogue:
    """``identity`` with the operands' own names: what ``ir/epilogue_print.py`` prints."""
    return _fixpoint(ep, drop_rounding=True)


def identity(ep: Epilogue) -> Epilogue:
    """The epilogue as far as performance goes (see the module doc): named ops, no
    intermediate rounding, operands named by broadcast and position."""
    return identity_with_names(ep)[0]


def identity_with_names(ep: Epilogue) -> tuple[Epilogue, dict[str, str]]:
    """``identity`` and the new name of each operand of ``ep``."""
    ep = _fixpoint(ep, drop_rounding=True)
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    for name, broadcast in ep.operands:
        names[name] = f"{broadcast}{counts.get(broadcast, 0)}"
        counts[broadcast] = counts.get(broadcast, 0) + 1
    if all(k == v for k, v in names.items()):
        return ep, names
    built: list[Expr] = []
    for node in ep.nodes:
        attrs = node.attrs
        if node.op == "operand":
            attrs = tuple((k, names[str(v)] if k == "name" else v) for k, v in attrs)
        built.append(Expr(node.op, tuple(built[a] for a in node.args), attrs))
    return ep.rebuilt([built[o.node] for o in ep.outputs]), names


# -- a dual GEMM's two accumulators (acc = A @ B, acc2 = A @ B2)


def swap_accumulators(ep: Epilogue) -> Epilogue:
    """``ep`` with ``acc`` and ``acc2`` exchanged (B and B2 passed the other way round)."""
    swapped = {"acc": "acc2", "acc2": "acc"}
    nodes = tuple(dataclasses.replace(n, op=swapped.get(n.op, n.op)) for n in ep.nodes)
    exprs = Epilogue(nodes, ep.outputs).exprs()
    return ep.rebuilt(exprs)


def identity_text(ep: Epilogue) -> str:
    return identity_with_names(ep)[0].text()


def canonical_order(ep: Epilogue) -> bool:
    """Whether ``ep`` names its accumulators in the canonical order: of it and its swap,
    the one whose identity (``patterns``) has the smaller text. The compiler and the suites
    both pick that order, so ``silu(gate) * up`` is one problem whichever projection comes
    first in a graph (``silu(acc) * acc2``)."""
    return identity_text(ep) <= identity_text(swap_accumulators(ep))
