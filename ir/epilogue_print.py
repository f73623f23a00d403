"""Epilogues as the text a user reads: the inverse of ``ir/epilogue_text.py``.

``readable(ep, dtype)`` is the shortest text of the epilogue language that parses back to
``ep`` as far as performance goes (``patterns.identity``): ``gelu_tanh(acc + bias[n])``,
``silu(acc) * acc2``, ``relu(acc * scale[n] + shift[n]) + residual``. Decomposed activations
print as their named ops (``patterns.recognise``), the composites PyTorch has no op for
(``hardswish``, ``relu6``, ...) as their names, intermediate rounding casts not at all; the
operands keep their names. Several outputs are separated by `` ; ``; an output stored in
another dtype than ``dtype`` (the problem's) says so after ``->``, a reduction output by its
kind (``-> row_sum``, ``-> group_max[128]``). Every progress line, table, report and error
that shows an epilogue shows this text; ``parse_readable`` reads it back (shapes files take it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

from epilab.ir.epilogue import ACCUMULATORS, GROUP_REDUCE, Epilogue, Expr, acc
from epilab.ir.epilogue_text import ARROW, SEPARATOR
from epilab.ir.patterns import COMPOSITES, readable_form
from epilab.ir.rules import RULES

# binding strength of each form, as the grammar of ``epilogue_text`` climbs it
COMPARE, SUM, PRODUCT, UNARY, POWER, PRIMARY = range(6)
_INFIX = {"add": ("+", SUM), "sub": ("-", SUM), "mul": ("*", PRODUCT), "div": ("/", PRODUCT)}
_COMPARES = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_CALL_NAMES = {"maximum": "max", "minimum": "min"}
_INDEX = {"row": "[n]", "col": "[m]", "tile": "", "scalar": "[]"}


def readable(ep: Epilogue, dtype: str | None = None) -> str:
    """``ep`` as one line (see the module's text); outputs stored in ``dtype`` (None: every
    output's dtype is said) carry no ``->``."""
    ep = readable_form(ep)
    exprs = ep.exprs()
    printer = _Printer()
    parts = []
    for o, e in zip(ep.outputs, exprs, strict=True):
        text = printer.text(e)
        if o.reduce == GROUP_REDUCE:
            text += f"{ARROW}{o.reduce}[{o.group}]"
        elif o.reduce:
            text += f"{ARROW}{o.reduce}"
        elif o.dtype != dtype:
            text += f"{ARROW}{o.dtype}"
        parts.append(text)
    return SEPARATOR.join(parts)


def number(v: float | bool) -> str:
    """A constant as the shortest text that parses back to it."""
    if isinstance(v, bool):
        return "(0 == 0)" if v else "(0 != 0)"  # the language has no bool literal
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e16:
        return str(int(v)) if v or math.copysign(1.0, v) > 0 else "-0.0"
    return repr(v)


class _Printer:
    def __init__(self) -> None:
        self.composites = _CompositeFinder()
        self.done: dict[int, tuple[str, int]] = {}  # by node: a shared subexpression is read once

    def text(self, e: Expr) -> str:
        return self.form(e)[0]

    def form(self, e: Expr) -> tuple[str, int]:
        """``e``'s text and how strongly it binds."""
        if id(e) not in self.done:
            self.done[id(e)] = self._form(e)
        return self.done[id(e)]

    def _form(self, e: Expr) -> tuple[str, int]:
        found = self.composites.find(e)
        if found is not None:
            name, x = found
            return f"{name}({self.text(x)})", PRIMARY
        op = e.op
        if op in ACCUMULATORS:
            return op, PRIMARY
        if op == "operand":
            attrs = dict(e.attrs)
            return f"{attrs['name']}{_INDEX[str(attrs['broadcast'])]}", PRIMARY
        if op == "const":
            text = number(e.attrs[0][1])  # type: ignore[arg-type]
            return text, UNARY if text.startswith("-") else PRIMARY
        if op in _INFIX:
            sign, level = _INFIX[op]
            a, b = _display_order(op, e.args)
            return f"{self.at(a, level)} {sign} {self.at(b, level + 1)}", level
        if op in _COMPARES:
            return f"{self.at(e.args[0], SUM)} {_COMPARES[op]} {self.at(e.args[1], SUM)}", COMPARE
        if op == "neg":
            return f"-{self.at(e.args[0], UNARY)}", UNARY
        if op == "pow":
            return f"{self.at(e.args[0], PRIMARY)} ** {number(e.attrs[0][1])}", POWER  # type: ignore[arg-type]
        args = [self.text(a) for a in _display_order(op, e.args)]
        attrs = dict(e.attrs)
        if len(attrs) == 1:
            args.append(_attr(next(iter(attrs.values()))))
        else:
            named = sorted(attrs.items(), key=lambda kv: _attr_order(op, kv[0]))
            args += [f"{k}={_attr(v)}" for k, v in named]
        return f"{_CALL_NAMES.get(op, op)}({', '.join(args)})", PRIMARY

    def at(self, e: Expr, level: int) -> str:
        """``e``'s text where the grammar needs a form binding at least as strongly as ``level``."""
        text, binds = self.form(e)
        return text if binds >= level else f"({text})"


def _attr(v: object) -> str:
    return v if isinstance(v, str) else number(v)  # type: ignore[arg-type]


def _attr_order(op: str, key: str) -> int:
    attrs = RULES[op].attrs if op in RULES else ()
    return attrs.index(key) if key in attrs else len(attrs)


def _reads(e: Expr, leaf: str) -> bool:
    return e.op == leaf or any(_reads(a, leaf) for a in e.args)


def _reads_late(e: Expr) -> int:
    """0 for what reads ``acc``, 1 for what reads only ``acc2``, 2 for the rest."""
    return next((i for i, leaf in enumerate(ACCUMULATORS) if _reads(e, leaf)), len(ACCUMULATORS))


def _display_order(op: str, args: Sequence[Expr]) -> Sequence[Expr]:
    """A commutative op's arguments in the order a person writes them: what reads the
    accumulator first (``acc + bias[n]``, ``silu(acc) * acc2``), a constant factor before
    (``0.5 * x``), a constant term after (``x + 1``). Its canonical order is by structure,
    so either parses the same."""
    if op not in RULES or not RULES[op].commutative or len(args) != 2:
        return args
    consts = [a.op == "const" for a in args]
    if any(consts) and not all(consts):
        first_const = op == "mul"
        return sorted(args, key=lambda a: (a.op == "const") != first_const)
    return sorted(args, key=_reads_late)


class _CompositeFinder:
    """The activations without an op of their own (``patterns.COMPOSITES``) found in an
    expression: ``e`` is ``name(x)`` where building ``name`` over ``x`` gives ``e``'s
    canonical structure (``x`` one of ``e``'s subexpressions a few levels down)."""

    DEPTH = 4

    def __init__(self) -> None:
        self.tops = _composite_tops()

    def find(self, e: Expr) -> tuple[str, Expr] | None:
        names = [n for n, top in self.tops.items() if top == e.op]
        if not names or e.op in ACCUMULATORS:
            return None
        whole = _canonical(e)
        for x in _below(e, self.DEPTH):
            for name in names:
                if _canonical(COMPOSITES[name](x)) == whole:
                    return name, x
        return None


@cache
def _composite_tops() -> dict[str, str]:
    """Each composite's canonical top op: the only nodes worth trying it at."""
    built = {name: Epilogue.build([(build(acc()), "float32")]) for name, build in COMPOSITES.items()}
    return {name: ep.exprs()[0].op for name, ep in built.items()}


def _canonical(e: Expr) -> str:
    """``e``'s canonical structure (beside the accumulator: an output must read it)."""
    return Epilogue.build([(e + acc(), "float32")]).text()


def _below(e: Expr, depth: int) -> list[Expr]:
    """``e``'s subexpressions down to ``depth`` levels (not ``e`` itself), nearest first."""
    out: list[Expr] = []
    level = list(e.args)
    for _ in range(depth):
        out += [x for x in level if x.op != "const" and x not in out]
        level = [a for x in level for a in x.args]
    return out


__all__ = ["number", "readable"]
