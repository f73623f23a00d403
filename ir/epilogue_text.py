"""Epilogues written as text: ``"gelu_tanh(acc + bias[n]) + residual"`` -> the IR.

A small recursive-descent parser of our own (nothing is evaluated). The language:

- ``acc``: the fp32 accumulator of the anchor (A @ B, or the convolution); ``acc2``: a dual
  GEMM's second accumulator (A @ B2: ``silu(acc) * acc2``);
- operands, by how they are read: ``bias[n]`` one value per output column (a row
  vector; a convolution's output channel), ``scale[m]`` one per output row (a column
  vector), ``residual`` or ``residual[m, n]`` a tensor of the output's shape, ``s[]`` a
  scalar. A name is an operand of one broadcast only;
- numbers (``0.5``, ``1e-3``, ``inf``, ``nan``), ``+ - * /``, unary ``-``, ``x ** c`` with a
  constant ``c``, comparisons ``< <= > >= == !=`` (predicates) and parentheses;
- every op of the rule table as a call, its attributes as trailing numbers or keywords:
  ``relu(x)``, ``leaky_relu(x, 0.01)``, ``clamp(x, min=0, max=6)``, ``cast(x, float16)``,
  ``where(x > 0, x, 0)``; and ``max``/``min`` for ``maximum``/``minimum``;
- activations without an op of their own (``relu6``, ``hardsigmoid``, ``hardswish``,
  ``softplus``, ``mish``: ``patterns.COMPOSITES``) as the ops PyTorch decomposes them into;
- ``row_total(x)``: ``x`` summed over every column of its output row (a LayerNorm's mean is
  ``row_total(x) / C``), for the kinds whose programs hold whole rows; ``group_max(x, 128)``:
  the max of ``x`` over its group of 128 columns, broadcast back.

A whole epilogue (``parse_text``, what ``ir/epilogue_print.readable`` writes) is its outputs
separated by ``;``, each an expression, stored in the problem's dtype unless ``-> dtype``
follows it, or a reduction of it: ``-> row_sum`` (``row_max``, ``col_sum``, ``col_max``) or
``-> group_max[128]``: ``acc + bias[n] ; gelu(acc + bias[n])``, ``acc -> float32``.

Errors are ValueErrors that name the column and show it under the text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epilab.ir.dtypes import OUTPUT_DTYPES
from epilab.ir.epilogue import (
    GROUP_OPS,
    GROUP_REDUCE,
    REDUCTIONS,
    ROW_OPS,
    Epilogue,
    Expr,
    OutputLike,
    acc,
    acc2,
    apply,
    check_operand_name,
    const,
    group_max,
    operand,
    row_total,
)
from epilab.ir.patterns import COMPOSITES
from epilab.ir.rules import RULES, STRING_ATTRS

MAX_TEXT = 4000  # characters of one epilogue expression
MAX_DEPTH = 64  # nesting of parentheses and calls
_TOKEN = re.compile(
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|<=|>=|==|!=|[-+*/()\[\],=<>])|(?P<string>\"[^\"]*\"|'[^']*'))"
)
_ALIASES = {"max": "maximum", "min": "minimum"}
_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
_INDEX_BROADCASTS = {("n",): "row", ("m",): "col", ("m", "n"): "tile", (): "scalar"}
_CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi}
SEPARATOR = " ; "  # between the outputs of a whole epilogue's text
ARROW = " -> "  # before an output's dtype or reduction
_GROUP_OUTPUT = re.compile(rf"{GROUP_REDUCE}\[(\d+)\]")


@dataclass(frozen=True)
class _Token:
    kind: str  # number, name, op, string, end
    text: str
    col: int  # 1-based column of its first character


class EpilogueSyntaxError(ValueError):
    """What is wrong, at which column of the text."""

    def __init__(self, text: str, col: int, message: str) -> None:
        self.text, self.col = text, col
        shown = text if len(text) <= 120 else text[:117] + "..."
        caret = " " * (min(col, 120) - 1) + "^"
        super().__init__(f"epilogue {text!r}, column {col}: {message}\n    {shown}\n    {caret}")


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise EpilogueSyntaxError(text, col, f"unexpected character {text[col - 1]!r}")
        kind = m.lastgroup or "op"
        start = m.start(kind)
        out.append(_Token(kind, m.group(kind), start + 1))
        pos = m.end()
    out.append(_Token("end", "", len(text) + 1))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"an epilogue must be a string, got {type(text).__name__}")
        if len(text) > MAX_TEXT:
            raise ValueError(f"an epilogue of {len(text)} characters is longer than {MAX_TEXT}")
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.broadcasts: dict[str, str] = {}

    # -- tokens
    @property
    def tok(self) -> _Token:
        return self.toks[self.i]

    def error(self, message: str, tok: _Token | None = None) -> EpilogueSyntaxError:
        return EpilogueSyntaxError(self.text, (tok or self.tok).col, message)

    def take(self, *texts: str) -> _Token | None:
        if self.tok.kind == "op" and self.tok.text in texts:
            self.i += 1
            return self.toks[self.i - 1]
        return None

    def expect(self, text: str, what: str) -> None:
        if self.take(text) is None:
            found = "the end" if self.tok.kind == "end" else repr(self.tok.text)
            raise self.error(f"expected {text!r} {what}, found {found}")

    # -- grammar
    def parse(self) -> Expr:
        if self.tok.kind == "end":
            raise self.error("empty epilogue (write `acc` for none)")
        e = self.compare()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.text!r} after a complete expression")
        return e

    def compare(self) -> Expr:
        e = self.sum()
        tok = self.take(*_COMPARE)
        if tok is not None:
            e = apply(_COMPARE[tok.text], e, self.sum())
            if self.tok.kind == "op" and self.tok.text in _COMPARE:
                raise self.error("comparisons do not chain; use logical_and(a, b)")
        return e

    def sum(self) -> Expr:
        e = self.product()
        while (tok := self.take("+", "-")) is not None:
            e = e + self.product() if tok.text == "+" else e - self.product()
        return e

    def product(self) -> Expr:
        e = self.unary()
        while (tok := self.take("*", "/")) is not None:
            e = e * self.unary() if tok.text == "*" else e / self.unary()
        return e

    def unary(self) -> Expr:
        if self.take("-") is not None:
            return -self.unary()
        if self.take("+") is not None:
            return self.unary()
        return self.power()

    def power(self) -> Expr:
        base = self.primary()
        tok = self.take("**")
        if tok is None:
            return base
        exponent = self.constant_of(self.unary(), tok, "an exponent")
        return apply("pow", base, exponent=exponent)

    def primary(self) -> Expr:
        tok = self.tok
        if tok.kind == "number":
            self.i += 1
            value = float(tok.text)
            if math.isinf(value):  # 1e400: a typo, not a way to write infinity
                raise self.error(f"{tok.text} is beyond the range of a float; write inf for infinity", tok)
            if value == 0.0 and re.search(r"[1-9]", re.split(r"[eE]", tok.text)[0]):
                raise self.error(f"{tok.text} is below the smallest float (about 5e-324); write 0", tok)
            return const(value)
        if tok.kind == "op" and tok.text == "(":
            self.i += 1
            with self.nested(tok):
                e = self.compare()
            self.expect(")", "to close the '('")
            return e
        if tok.kind != "name":
            found = "the end" if tok.kind == "end" else repr(tok.text)
            raise self.error(f"expected a value (a number, acc, acc2, an operand or a call), found {found}")
        self.i += 1
        if self.tok.kind == "op" and self.tok.text == "(":
            return self.call(tok)
        if tok.text in ("acc", "acc2"):
            if self.tok.kind == "op" and self.tok.text == "[":
                raise self.error(f"{tok.text} takes no index")
            return acc() if tok.text == "acc" else acc2()
        if tok.text in _CONSTANTS and not (self.tok.kind == "op" and self.tok.text == "["):
            return const(_CONSTANTS[tok.text])
        return self.operand(tok)

    def operand(self, tok: _Token) -> Expr:
        index: tuple[str, ...] = ("m", "n")
        if self.take("[") is not None:
            names = []
            while self.tok.kind == "name" or (self.tok.kind == "number" and self.tok.text == "1"):
                names.append(self.tok.text)
                self.i += 1
                if self.take(",") is None:
                    break
            self.expect("]", "to close the operand's index")
            index = () if names in ([], ["1"]) else tuple(names)
        broadcast = _INDEX_BROADCASTS.get(index)
        if broadcast is None:
            raise self.error(
                f"operand {tok.text}[{', '.join(index)}]: index it by [n] (per column), [m] (per row), "
                "[m, n] (the whole output) or [] (a scalar)",
                tok,
            )
        try:
            check_operand_name(tok.text)
        except ValueError as e:
            raise self.error(str(e), tok) from None
        if tok.text in RULES or tok.text in _ALIASES or tok.text in COMPOSITES or tok.text in ROW_OPS:
            raise self.error(f"{tok.text!r} is an op; call it: {tok.text}(...)", tok)
        seen = self.broadcasts.setdefault(tok.text, broadcast)
        if seen != broadcast:
            raise self.error(f"operand {tok.text!r} is read as {seen} and as {broadcast}", tok)
        return operand(tok.text, broadcast)

    def call(self, name: _Token) -> Expr:
        op = _ALIASES.get(name.text, name.text)
        if op in COMPOSITES and op not in RULES:
            return self.composite(name, COMPOSITES[op])
        if op in ROW_OPS:
            return self.composite(name, row_total)
        if op in GROUP_OPS:
            return self.group(name)
        rule = RULES.get(op)
        if rule is None:
            known = ", ".join(sorted([*RULES, *COMPOSITES, *ROW_OPS, *GROUP_OPS]))
            raise self.error(f"unknown op {name.text!r}; known: {known}", name)
        open_tok = self.tok
        self.expect("(", "")
        args: list[Expr] = []
        attrs: dict[str, object] = {}
        with self.nested(open_tok):
            while not (self.tok.kind == "op" and self.tok.text == ")"):
                if self.tok.kind == "name" and self.toks[self.i + 1].text == "=":
                    key = self.tok
                    self.i += 2
                    if key.text not in rule.attrs:
                        known = list(rule.attrs)
                        raise self.error(f"{op} has no attribute {key.text!r}; it takes {known}", key)
                    if key.text in attrs:
                        raise self.error(f"{op} is given {key.text!r} twice", key)
                    attrs[key.text] = self.attribute(op, key.text)
                elif len(args) < rule.arity:
                    args.append(self.compare())
                else:
                    missing = [a for a in rule.attrs if a not in attrs]
                    if not missing:
                        known = list(rule.attrs)
                        raise self.error(f"{op} takes {rule.arity} argument(s) and the attributes {known}")
                    attrs[missing[0]] = self.attribute(op, missing[0])
                if self.take(",") is None:
                    break
            self.expect(")", f"to close the call of {name.text}")
        if len(args) != rule.arity:
            raise self.error(f"{op} takes {rule.arity} argument(s), got {len(args)}", name)
        missing = [a for a in rule.attrs if a not in attrs]
        if missing:
            raise self.error(f"{op} needs the attribute(s) {missing}", name)
        try:
            return apply(op, *args, **attrs)
        except ValueError as e:
            raise self.error(str(e), name) from None

    def composite(self, name: _Token, build: Callable[[Expr], Expr]) -> Expr:
        """A call of one argument and no attributes, built by ``build``."""
        open_tok = self.tok
        self.expect("(", "")
        with self.nested(open_tok):
            arg = self.compare()
            if self.take(",") is not None and not (self.tok.kind == "op" and self.tok.text == ")"):
                raise self.error(f"{name.text} takes 1 argument and no attributes", name)
            self.expect(")", f"to close the call of {name.text}")
        return build(arg)

    def group(self, name: _Token) -> Expr:
        """``group_max(x, size)`` (or ``size=``): a power of two from 2 to 1024."""
        open_tok = self.tok
        self.expect("(", "")
        with self.nested(open_tok):
            arg = self.compare()
            self.expect(",", f"and the group's size after {name.text}'s argument")
            if self.tok.kind == "name" and self.tok.text == "size" and self.toks[self.i + 1].text == "=":
                self.i += 2
            size = self.constant_of(self.unary(), name, f"{name.text}'s size")
            self.expect(")", f"to close the call of {name.text}")
        try:
            return group_max(arg, int(size) if size == int(size) else size)  # type: ignore[arg-type]
        except ValueError as e:
            raise self.error(str(e), name) from None

    def attribute(self, op: str, key: str) -> object:
        tok = self.tok
        if key in STRING_ATTRS:
            if tok.kind not in ("name", "string"):
                raise self.error(f"{op}'s {key} is a name such as float16")
            self.i += 1
            return tok.text.strip("\"'")
        return self.constant_of(self.unary(), tok, f"{op}'s {key}")

    def constant_of(self, e: Expr, tok: _Token, what: str) -> float:
        if e.op == "const":
            return float(e.attrs[0][1])  # type: ignore[arg-type]
        if e.op == "neg" and e.args[0].op == "const":
            return -float(e.args[0].attrs[0][1])  # type: ignore[arg-type]
        raise self.error(f"{what} must be a number", tok)

    def nested(self, tok: _Token) -> _Depth:
        return _Depth(self, tok)


class _Depth:
    def __init__(self, parser: _Parser, tok: _Token) -> None:
        self.parser, self.tok = parser, tok

    def __enter__(self) -> None:
        self.parser.depth += 1
        if self.parser.depth > MAX_DEPTH:
            raise self.parser.error(f"nested more than {MAX_DEPTH} deep", self.tok)

    def __exit__(self, *exc: object) -> None:
        self.parser.depth -= 1


def parse_text(text: str, dtype: str) -> Epilogue:
    """A whole epilogue from its one-line text (the module's text; ``readable``'s form):
    outputs separated by ``;``, each stored in ``dtype`` unless ``-> dtype`` or ``-> reduction``
    follows it."""
    if not isinstance(text, str):
        raise ValueError(f"an epilogue must be a string, got {type(text).__name__}")
    outputs: list[OutputLike] = []
    broadcasts: dict[str, str] = {}
    for part in text.split(";"):
        expr_text, arrow, how = part.partition("->")
        parser = _Parser(expr_text.strip())
        parser.broadcasts = broadcasts
        outputs.append((parser.parse(), *_output_of(how.strip() if arrow else "", dtype, part)))
    try:
        return Epilogue.build(outputs)
    except ValueError as e:
        raise ValueError(f"epilogue {text[:200]!r}: {e}") from None


def _output_of(how: str, dtype: str, part: str) -> tuple[str] | tuple[str, str] | tuple[str, str, int]:
    """An output's (dtype[, reduction[, group]]) from what follows its ``->``."""
    if not how:
        return (dtype,)
    if how in OUTPUT_DTYPES:
        return (how,)
    if how in REDUCTIONS:
        return ("float32", how)
    group = _GROUP_OUTPUT.fullmatch(how)
    if group is not None:
        return ("float32", GROUP_REDUCE, int(group.group(1)))
    raise ValueError(
        f"epilogue output {part.strip()[:120]!r}: after '->' write a dtype "
        f"({', '.join(sorted(OUTPUT_DTYPES))}), a reduction ({', '.join(REDUCTIONS)}) "
        f"or {GROUP_REDUCE}[size]; got {how!r}"
    )


def parse_epilogue(outputs: Sequence[tuple[str, str | None]], dtype: str) -> Epilogue:
    """An epilogue from its outputs' texts and dtypes (None: ``dtype``, the inputs'); an
    operand keeps one broadcast across the outputs."""
    if not outputs:
        raise ValueError("an epilogue needs at least one output")
    broadcasts: dict[str, str] = {}
    exprs = []
    for text, out_dtype in outputs:
        parser = _Parser(text)
        parser.broadcasts = broadcasts
        exprs.append((parser.parse(), out_dtype or dtype))
    try:
        return Epilogue.build(exprs)
    except ValueError as e:
        texts = " ; ".join(text for text, _ in outputs)
        raise ValueError(f"epilogue {texts[:200]!r}: {e}") from None
