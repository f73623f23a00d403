"""The epilogue IR: the pointwise work fused after a matmul-like anchor.

An ``Epilogue`` is a small DAG in a flat, canonical node list:

- leaves: ``acc`` (the fp32 accumulator), ``acc2`` (a dual GEMM's second accumulator,
  A @ B2: templates with two accumulators only), ``operand`` (a tensor loaded per output
  element: a row vector indexed by n, a column vector indexed by m, a full tile
  with any strides, or a scalar), ``const`` (a float or bool literal);
- inner nodes: ops from the one rule table (``ir/rules.py``), and ``row_total`` (``ROW_OPS``):
  the sum of its value over every column of the output row, broadcast back along the row
  (a LayerNorm's mean and variance over a conv's channels, normalised in the epilogue). Only a
  kind whose program holds every column of its rows runs it (``TemplateKind.row_error``);
  and ``group_max`` (``GROUP_OPS``, attribute ``size``): the max of its value over its group
  of ``size`` columns (groups start at multiples of ``size``), broadcast back along the group
  (a per-token-group quantization's amax); only kinds whose tiles hold whole groups run it
  (``TemplateKind.groups``);
- outputs: one or more ``(node, dtype)`` pairs; an output may instead be a *reduction*
  of its node over the tile's columns or rows (``REDUCTIONS``: ``row_sum``, ``row_max``
  give one fp32 value per output row m, ``col_sum``, ``col_max`` one per column n), summed
  or maxed across every tile of the output (the statistics a following norm or a dynamic
  quantization needs: ``row_sum`` of ``x * x``, ``row_max`` of ``abs(x)``); or a *group
  output* (``GROUP_REDUCE``, with its ``group`` width): one fp32 value per row and group of
  ``group`` columns, the max of its node there ([..., M, ceil(N / group)]: a per-token-group
  quantization's scales), stored once by the tile that holds the group.

Build one with the expression helpers and ``Epilogue.build``::

    x = acc() + operand("bias", "row")
    ep = Epilogue.build([(ops.gelu_tanh(x) + operand("res", "tile"), "bfloat16")])

Building canonicalizes: structurally equal subtrees become one node, arguments
of commutative ops are ordered, constant subtrees are folded, bool/float
mismatches become explicit casts, and dead nodes are dropped. So two
structurally equal epilogues have the same ``text()`` (the form used in problem
keys) in any process.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from epilab.ir.dtypes import OUTPUT_DTYPES
from epilab.ir.expr import (  # the builders, public here: import them from this module
    ACCUMULATORS as ACCUMULATORS,
)
from epilab.ir.expr import (
    BROADCASTS as BROADCASTS,
)
from epilab.ir.expr import (
    GROUP_OPS as GROUP_OPS,
)
from epilab.ir.expr import (
    MAX_GROUP as MAX_GROUP,
)
from epilab.ir.expr import (
    ROW_OPS as ROW_OPS,
)
from epilab.ir.expr import (
    AttrValue as AttrValue,
)
from epilab.ir.expr import (
    Expr as Expr,
)
from epilab.ir.expr import (
    ExprLike as ExprLike,
)
from epilab.ir.expr import (
    acc as acc,
)
from epilab.ir.expr import (
    acc2 as acc2,
)
from epilab.ir.expr import (
    apply as apply,
)
from epilab.ir.expr import (
    as_expr,
    check_attrs,
    is_group_width,
)
from epilab.ir.expr import (
    check_operand_name as check_operand_name,
)
from epilab.ir.expr import (
    const as const,
)
from epilab.ir.expr import (
    group_max as group_max,
)
from epilab.ir.expr import (
    operand as operand,
)
from epilab.ir.expr import (
    ops as ops,
)
from epilab.ir.expr import (
    row_total as row_total,
)
from epilab.ir.rules import FAST_OUTPUT_DTYPES, RULES, Kind, literal, result_kind

if TYPE_CHECKING:
    import torch

LEAVES = ("acc", "acc2", "operand", "const")
GROUP_REDUCE = "group_max"  # an output of one value per row and group of columns
_WHOLE_OPS = (*ROW_OPS, *GROUP_OPS)  # not pointwise: over whole rows or groups of a row
# reduction outputs: (what, over which axis); row_* reduce over n (one value per row m),
# col_* over m (one value per column n); always float32
REDUCTIONS = {
    "row_sum": ("sum", "n"),
    "row_max": ("max", "n"),
    "col_sum": ("sum", "m"),
    "col_max": ("max", "m"),
}
# what a template appends to an operand's kernel name (op_<name>) for its parameters and
# locals: operand names that are another's plus one of these would collide
GENERATED_SUFFIXES = ("ptr", "ptrs", "stride_b", "stride_m", "stride_n", "desc", "part", "smem")
# the canonical text a database stores of an epilogue, at most: db.models.EPILOGUE_LEN (the
# templates import nothing of the database; tests/test_hardening.py checks the two agree)
MAX_TEXT_CHARS = 20_000

# What reading JSON of the wrong shape raises (a list where an object belongs, an index out
# of range, an int too large, nesting too deep): at a parser's boundary, all mean "malformed"
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[int, ...] = ()
    attrs: tuple[tuple[str, AttrValue], ...] = ()  # sorted by name

    @property
    def attr(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


@dataclass(frozen=True)
class Output:
    node: int
    dtype: str
    reduce: str = ""  # "" (a tile of the output's shape), one of REDUCTIONS, or GROUP_REDUCE
    group: int = 0  # a GROUP_REDUCE output's group width (columns per value); 0 otherwise

    def shape(self, out_shape: Sequence[Any]) -> tuple[Any, ...]:
        """This output's shape when the epilogue's tile outputs have ``out_shape`` (..., M, N)."""
        if not self.reduce:
            return tuple(out_shape)
        if self.reduce == GROUP_REDUCE:
            return (*out_shape[:-1], -(-out_shape[-1] // self.group))
        axis = REDUCTIONS[self.reduce][1]
        return (*out_shape[:-1],) if axis == "n" else (*out_shape[:-2], out_shape[-1])


# (expr, dtype), (expr, dtype, reduce) or (expr, "float32", GROUP_REDUCE, group)
OutputLike = tuple[Any, str] | tuple[Any, str, str] | tuple[Any, str, str, int]


# ------------------------------------------------------------------ canonical IR


@dataclass(frozen=True)
class Epilogue:
    nodes: tuple[Node, ...]
    outputs: tuple[Output, ...]

    def __post_init__(self) -> None:
        _validate(self)

    # -- construction
    @staticmethod
    def build(outputs: Sequence[OutputLike]) -> Epilogue:
        """Canonical epilogue computing ``outputs``, a list of (expr, dtype) or (expr,
        "float32", reduction) with a reduction of ``REDUCTIONS``, or (expr, "float32",
        GROUP_REDUCE, group width)."""
        return _Canonicalizer().run(outputs)

    @staticmethod
    def identity(dtype: str) -> Epilogue:
        """No pointwise work: store the accumulator as ``dtype``."""
        return Epilogue.build([(acc(), dtype)])

    def exprs(self) -> list[Expr]:
        """The outputs as expression trees (inverse of ``build``)."""
        built: list[Expr] = []
        for node in self.nodes:
            built.append(Expr(node.op, tuple(built[i] for i in node.args), node.attrs))
        return [built[o.node] for o in self.outputs]

    # -- facts the templates and launchers need
    @cached_property
    def operands(self) -> tuple[tuple[str, str], ...]:
        """(name, broadcast) of each operand leaf, in node order."""
        return tuple((str(n.attr["name"]), str(n.attr["broadcast"])) for n in self.nodes if n.op == "operand")

    @cached_property
    def reductions(self) -> tuple[int, ...]:
        """Indices of the outputs that are reductions (row or column statistics)."""
        return tuple(i for i, o in enumerate(self.outputs) if o.reduce in REDUCTIONS)

    @cached_property
    def group_size(self) -> int:
        """The width of the column groups its ``group_max`` nodes and group outputs take (one
        width an epilogue), 0 where it has none: a kind's tiles must hold whole groups."""
        sizes = {int(n.attr["size"]) for n in self.nodes if n.op in GROUP_OPS}
        sizes |= {o.group for o in self.outputs if o.reduce == GROUP_REDUCE}
        return max(sizes, default=0)

    @cached_property
    def group_constant(self) -> frozenset[int]:
        """The nodes constant along each group of columns (a ``group_max``, what is constant
        along whole rows, and ops of those only): a group output of one stores it as it is."""
        out: set[int] = set()
        for i, n in enumerate(self.nodes):
            if n.op == "operand":
                constant = n.attr["broadcast"] in ("col", "scalar")
            else:
                constant = n.op in ("const", *_WHOLE_OPS) or (n.op in RULES and all(a in out for a in n.args))
            if constant:
                out.add(i)
        return frozenset(out)

    @cached_property
    def row_totals(self) -> bool:
        """Whether it sums values over whole output rows (``ROW_OPS``): a kind must hold every
        column of a row in one program to run it."""
        return any(n.op in ROW_OPS for n in self.nodes)

    def rebuilt(self, exprs: Sequence[Expr]) -> Epilogue:
        """An epilogue with new expressions for this one's outputs (same dtypes, reductions)."""
        return Epilogue.build([(e, *_output_fields(o)) for e, o in zip(exprs, self.outputs, strict=True)])

    @cached_property
    def accumulators(self) -> int:
        """How many accumulators it reads: 2 when it reads ``acc2`` (a dual GEMM's), else 1."""
        return 2 if any(n.op == "acc2" for n in self.nodes) else 1

    @cached_property
    def kinds(self) -> tuple[Kind, ...]:
        return tuple(_node_kind(n) for n in self.nodes)

    @cached_property
    def fast_nodes(self) -> frozenset[int]:
        """The nodes a template renders with their rule's fast form (``rules.py``): those
        whose every value ends, through float ops only, in tile outputs of a dtype whose
        rounding dominates the fast forms' error (``FAST_OUTPUT_DTYPES``), or in a cast to such
        a dtype (what follows reads the rounded value, as the quantize step's group max and
        scales do). A node that an fp32 output, a statistic or a row total reads keeps its
        exact form up to such a cast; one a predicate reads keeps it through casts too (a
        comparison must flip no more often than torch's)."""
        exact = [False] * len(self.nodes)
        strict = [False] * len(self.nodes)  # read by a predicate: exact through casts
        for o in self.outputs:
            if o.reduce or o.dtype not in FAST_OUTPUT_DTYPES:
                exact[o.node] = True
        for i in range(len(self.nodes) - 1, -1, -1):  # users come after their arguments
            n = self.nodes[i]
            strict[i] = strict[i] or self.kinds[i] == "bool"
            rounds = n.op == "cast" and n.attr["dtype"] in FAST_OUTPUT_DTYPES
            if (exact[i] and not rounds) or strict[i] or n.op in ROW_OPS or n.op in GROUP_OPS:
                for a in n.args:
                    exact[a] = True
                    strict[a] = strict[a] or strict[i]
        return frozenset(
            i for i, n in enumerate(self.nodes) if not exact[i] and n.op in RULES and RULES[n.op].fast
        )

    # -- canonical text and JSON
    def text(self) -> str:
        """Canonical one-line text; equal for structurally equal epilogues."""
        parts = []
        for i, n in enumerate(self.nodes):
            attrs = ",".join(f"{k}={_attr_text(v)}" for k, v in n.attrs)
            head = f"{n.op}[{attrs}]" if attrs else n.op
            parts.append(" ".join([f"%{i} = {head}", *(f"%{a}" for a in n.args)]))
        for o in self.outputs:
            reduce = o.reduce + (f"[{o.group}]" if o.group else "")
            parts.append(" ".join(filter(None, ["out", f"%{o.node}", o.dtype, reduce])))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [[n.op, list(n.args), {k: _attr_json(v) for k, v in n.attrs}] for n in self.nodes],
            "outputs": [[o.node, *_output_fields(o)] for o in self.outputs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Epilogue:
        """Parse (and re-canonicalize) a dict from ``to_dict``; bad data raises ValueError."""
        try:
            raw_nodes = [
                Node(str(op), tuple(int(a) for a in args), check_attrs(str(op), _attrs_from_json(op, attrs)))
                for op, args, attrs in d["nodes"]
            ]
            if any(len(o) > 4 for o in d["outputs"]):
                raise ValueError("an output is [node, dtype] or [node, dtype, reduction[, group]]")
            raw_outputs = [
                Output(int(o[0]), str(o[1]), *(str(r) for r in o[2:3]), *(_json_int(g) for g in o[3:4]))
                for o in d["outputs"]
            ]
            return Epilogue(tuple(raw_nodes), tuple(raw_outputs)).rebuilt(
                Epilogue(tuple(raw_nodes), tuple(raw_outputs)).exprs()
            )
        except MALFORMED as e:
            raise ValueError(f"not a valid epilogue: {type(e).__name__}: {str(e)[:200]}") from e

    @staticmethod
    def from_json(text: str) -> Epilogue:
        return Epilogue.from_dict(json.loads(text))

    # -- the reference
    def evaluate(
        self,
        acc: torch.Tensor,
        operands: Mapping[str, torch.Tensor],
        acc2: torch.Tensor | None = None,
        *,
        given: Mapping[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Compute the outputs in torch at ``acc``'s dtype (float64 for references).

        Operands broadcast against ``acc``; outputs come back in the compute dtype
        (bool outputs as bool), not yet rounded to their output dtypes; a reduction output
        reduced over the last dim (row_*) or the one before it (col_*); a ``row_total`` sums
        over the last dim (the output's columns) and keeps it. ``acc2`` is a dual
        GEMM's second accumulator (needed when the epilogue reads it). ``given``: node values
        computed elsewhere (a library call that did the epilogue's first nodes).
        """
        import torch

        dtype = acc.dtype
        values: list[torch.Tensor] = []
        needed = self._needed(set(given or ()))
        for i, node in enumerate(self.nodes):
            attr = node.attr
            if i not in needed:  # below a given node only
                values.append(acc)
                continue
            if given is not None and i in given:
                v = given[i].to(dtype)
            elif node.op == "acc":
                v = acc
            elif node.op == "acc2":
                if acc2 is None:
                    raise ValueError("this epilogue reads acc2 (a dual GEMM's second accumulator); pass acc2")
                v = acc2
            elif node.op == "row_total":
                v = torch.broadcast_to(values[node.args[0]], acc.shape).sum(-1, keepdim=True)
            elif node.op == "group_max":
                size = int(attr["size"])
                groups = _group_maxima(torch.broadcast_to(values[node.args[0]], acc.shape), size)
                v = groups.unsqueeze(-1).expand(*groups.shape, size).flatten(-2)[..., : acc.shape[-1]]
            elif node.op == "operand":
                v = operands[str(attr["name"])].to(device=acc.device, dtype=dtype)
            elif node.op == "const":
                value = attr["value"]
                # a fill on the device, not a copy from the host: a baseline running this is
                # replayed in a CUDA graph (tuner/evaluate.py), which captures no host copies
                v = torch.full(
                    (), value, device=acc.device, dtype=torch.bool if isinstance(value, bool) else dtype
                )
            else:
                v = RULES[node.op].torch(*(values[a] for a in node.args), **attr)
                if result_kind(node.op, attr) == "float":
                    v = v.to(dtype)
            values.append(v)
        outs = []
        for o in self.outputs:
            v = torch.broadcast_to(values[o.node], acc.shape)
            if o.reduce == GROUP_REDUCE:
                v = _group_maxima(v, o.group)
            elif o.reduce:
                how, axis = REDUCTIONS[o.reduce]
                dim = -1 if axis == "n" else -2
                v = v.sum(dim) if how == "sum" else v.amax(dim)
            outs.append(v)
        return tuple(outs)

    def _needed(self, given: set[int]) -> set[int]:
        """The nodes the outputs read, not looking below the ``given`` ones."""
        needed: set[int] = set()
        todo = [o.node for o in self.outputs]
        while todo:
            i = todo.pop()
            if i not in needed:
                needed.add(i)
                todo.extend(() if i in given else self.nodes[i].args)
        return needed

    # -- the Triton form
    def triton_lines(
        self, leaf_vars: Mapping[str, str], *, fast: bool = True, col_mask: str = ""
    ) -> tuple[list[tuple[str, str]], list[str]]:
        """Assignments ``(var, expr)`` for the inner nodes and each output's variable.

        ``leaf_vars`` maps ``"acc"`` (and ``"acc2"`` for a dual GEMM) and each operand name
        to the kernel variable holding it (already fp32). Constants are inlined as literals.
        The ``fast_nodes`` take their rule's fast form (``fast_math.py.jinja``'s helpers) unless
        ``fast`` is off. ``col_mask``: the kernel's mask of the tile's columns inside the
        output, which a ``row_total`` needs (the tile holds the whole row; masked columns add 0)
        and a ``group_max`` (the tile holds whole groups; masked columns count as -inf).
        """
        fast_nodes = self.fast_nodes if fast else frozenset()
        names: list[str] = []
        lines: list[tuple[str, str]] = []
        for i, node in enumerate(self.nodes):
            attr = node.attr
            if node.op in ACCUMULATORS:
                if node.op not in leaf_vars:
                    raise ValueError(f"this template has no {node.op}: it computes one accumulator")
                names.append(leaf_vars[node.op])
            elif node.op == "operand":
                names.append(leaf_vars[str(attr["name"])])
            elif node.op == "const":
                names.append(literal(attr["value"]))  # type: ignore[arg-type]
            elif node.op == "row_total":
                if not col_mask:
                    raise ValueError("a row_total needs the tile's column mask (col_mask)")
                var = f"t{i}"
                total = f"tl.sum(tl.where({col_mask}[None, :], {names[node.args[0]]}, 0.0), axis=1)"
                lines.append((var, f"{total}[:, None]"))
                names.append(var)
            elif node.op == "group_max":
                if not col_mask:
                    raise ValueError("a group_max needs the tile's column mask (col_mask)")
                var = f"t{i}"  # the helper of rounding.py.jinja
                lines.append((var, f"group_max({names[node.args[0]]}, {col_mask}, {int(attr['size'])})"))
                names.append(var)
            else:
                var = f"t{i}"
                args = [names[a] for a in node.args]
                lines.append((var, RULES[node.op].render_triton(args, attr, fast=i in fast_nodes)))
                names.append(var)
        return lines, [names[o.node] for o in self.outputs]


def _node_kind(n: Node) -> Kind:
    if n.op == "const":
        return "bool" if isinstance(n.attr["value"], bool) else "float"
    if n.op in ("acc", "acc2", "operand", *ROW_OPS, *GROUP_OPS):
        return "float"
    return result_kind(n.op, n.attr)


def _attr_text(v: AttrValue) -> str:
    return v if isinstance(v, str) else literal(v)


def _attr_json(v: AttrValue) -> AttrValue | dict[str, str]:
    if isinstance(v, float) and not (v == v and abs(v) != float("inf")):
        return {"float": repr(v)}  # inf/nan: strict JSON has no literal for them
    return v


# an operand's broadcast was stored as its "kind" until revision 0009 (exports, caches and
# databases of that age still say so): read as the broadcast it is
LEGACY_BROADCAST_ATTR = "kind"


def _attrs_from_json(op: object, attrs: Mapping[str, Any]) -> dict[str, Any]:
    if (
        op == "operand"
        and isinstance(attrs, Mapping)
        and LEGACY_BROADCAST_ATTR in attrs
        and "broadcast" not in attrs
    ):
        attrs = {("broadcast" if k == LEGACY_BROADCAST_ATTR else k): v for k, v in attrs.items()}
    out = {}
    for k, v in attrs.items():
        if isinstance(v, dict):
            if set(v) != {"float"} or v["float"] not in ("inf", "-inf", "nan"):
                raise ValueError(f"attribute {k!r}: {v!r} is not a number")
            v = float(v["float"])
        out[str(k)] = v
    return out


def _validate(ep: Epilogue) -> None:
    if not ep.outputs:
        raise ValueError("an epilogue needs at least one output")
    operand_broadcasts: dict[str, str] = {}
    depends_on_acc: list[bool] = []
    for i, n in enumerate(ep.nodes):
        if n.op not in LEAVES and n.op not in RULES and n.op not in _WHOLE_OPS:
            raise ValueError(f"node %{i}: unknown op {n.op!r}; known: {sorted([*RULES, *_WHOLE_OPS])}")
        arity = 0 if n.op in LEAVES else 1 if n.op in _WHOLE_OPS else RULES[n.op].arity
        if len(n.args) != arity:
            raise ValueError(f"node %{i}: {n.op!r} takes {arity} argument(s), got {len(n.args)}")
        if any(not 0 <= a < i for a in n.args):
            raise ValueError(f"node %{i}: arguments {n.args} must name earlier nodes")
        if check_attrs(n.op, n.attr) != n.attrs:
            raise ValueError(f"node %{i}: attributes {n.attrs} are not in canonical form")
        if n.op == "operand":
            name, broadcast = str(n.attr["name"]), str(n.attr["broadcast"])
            check_operand_name(name)
            if broadcast not in BROADCASTS:
                raise ValueError(f"node %{i}: operand broadcast {broadcast!r} is not one of {BROADCASTS}")
            if operand_broadcasts.setdefault(name, broadcast) != broadcast:
                raise ValueError(
                    f"operand {name!r} is used both as {operand_broadcasts[name]} and {broadcast}"
                )
        if n.op in _WHOLE_OPS and _node_kind(ep.nodes[n.args[0]]) != "float":
            raise ValueError(f"node %{i}: {n.op!r} reduces a float value, not a predicate")
        if n.op in RULES:
            rule = RULES[n.op]
            for pos, a in enumerate(n.args):
                want, got = rule.arg_kind(pos), _node_kind(ep.nodes[a])
                if want != "any" and want != got:
                    raise ValueError(f"node %{i}: argument {pos} of {n.op!r} must be {want}, got {got}")
        depends_on_acc.append(n.op in ACCUMULATORS or any(depends_on_acc[a] for a in n.args))
    for name in operand_broadcasts:
        clash = [f"{name}_{x}" for x in GENERATED_SUFFIXES if f"{name}_{x}" in operand_broadcasts]
        if clash:
            raise ValueError(
                f"operand names {name!r} and {clash[0]!r} collide in the kernel (op_{clash[0]} "
                "would name both a parameter of the first and the values of the second); rename one"
            )
    for o in ep.outputs:
        if not 0 <= o.node < len(ep.nodes):
            raise ValueError(f"output names node %{o.node}, which does not exist")
        if o.dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output dtype {o.dtype!r} is not one of {sorted(OUTPUT_DTYPES)}")
        if not depends_on_acc[o.node]:
            raise ValueError(f"output %{o.node} does not depend on the accumulator")
        known = o.reduce in REDUCTIONS or o.reduce == GROUP_REDUCE
        if o.reduce and (not known or o.dtype != "float32" or ep.kinds[o.node] != "float"):
            raise ValueError(
                f"reduction output {o.reduce!r} of %{o.node} ({o.dtype}): a reduction is one of "
                f"{sorted([*REDUCTIONS, GROUP_REDUCE])} of a float node, stored as float32"
            )
        if (o.reduce == GROUP_REDUCE) != bool(o.group) or (o.group and not is_group_width(o.group)):
            raise ValueError(
                f"output %{o.node}: a {GROUP_REDUCE} output takes a group width (a power of two from 2 "
                f"to {MAX_GROUP}), and no other output does; got reduce={o.reduce!r}, group={o.group!r}"
            )
    widths = {int(n.attr["size"]) for n in ep.nodes if n.op in GROUP_OPS}
    if len(widths | {o.group for o in ep.outputs if o.group}) > 1:
        widths |= {o.group for o in ep.outputs if o.group}
        raise ValueError(f"an epilogue groups columns one way; it has groups of {sorted(widths)}")
    size = len(ep.text())
    if size > MAX_TEXT_CHARS:
        raise ValueError(
            f"an epilogue of {len(ep.nodes)} nodes has a canonical text of {size} characters, "
            f"over the {MAX_TEXT_CHARS} a tuning database stores"
        )


class _Canonicalizer:
    """Hash-conses expression trees into a canonical flat node list."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.index: dict[Node, int] = {}
        self.folded: dict[int, Expr] = {}
        self.sexprs: dict[int, str] = {}
        self.emitted: dict[int, int] = {}
        self.keep: list[Expr] = []  # keeps every Expr alive so that ids stay unique

    def run(self, outputs: Sequence[OutputLike]) -> Epilogue:
        if not outputs:
            raise ValueError("an epilogue needs at least one output")
        for o in outputs:
            if not isinstance(o, tuple) or len(o) not in (2, 3, 4):
                raise ValueError(
                    f"an output is (expr, dtype), (expr, dtype, reduction) or (expr, dtype, reduction, "
                    f"group), got {o!r:.80}"
                )
        roots = [(self._fold(as_expr(o[0])), *o[1:]) for o in outputs]
        indices = [self._emit(r[0]) for r in roots]
        return Epilogue(
            tuple(self.nodes),
            tuple(
                Output(i, str(r[1]), *(str(x) for x in r[2:3]), *(_json_int(g) for g in r[3:]))
                for i, r in zip(indices, roots, strict=True)
            ),
        )

    def _fold(self, e: Expr) -> Expr:
        """Fold constant subtrees, insert bool/float casts, order commutative args."""
        if id(e) in self.folded:
            return self.folded[id(e)]
        self.keep.append(e)
        out = e
        if e.op in _WHOLE_OPS:  # never folded: a constant's row total is the row's length times it
            arg = self._fold(e.args[0])
            if _expr_kind(arg) != "float":
                arg = Expr("cast", (arg,), (("dtype", "float32"),))
            out = Expr(e.op, (arg,), e.attrs)
        elif e.op not in LEAVES:
            rule = RULES[e.op]
            args = [self._fold(a) for a in e.args]
            if all(a.op == "const" for a in args):
                out = _fold_const(e.op, args, dict(e.attrs))
            else:
                for pos, a in enumerate(args):
                    want = rule.arg_kind(pos)
                    if want != "any" and want != _expr_kind(a):
                        args[pos] = Expr("cast", (a,), (("dtype", "bool" if want == "bool" else "float32"),))
                if rule.commutative:
                    args.sort(key=self._sexpr)
                out = Expr(e.op, tuple(args), e.attrs)
        self.folded[id(e)] = out
        self.keep.append(out)
        return out

    def _sexpr(self, e: Expr) -> str:
        """Canonical s-expression of a folded tree (orders commutative arguments)."""
        if id(e) not in self.sexprs:
            attrs = ",".join(f"{k}={_attr_text(v)}" for k, v in e.attrs)
            inner = " ".join(self._sexpr(a) for a in e.args)
            self.sexprs[id(e)] = f"({e.op}[{attrs}] {inner})"
            self.keep.append(e)
        return self.sexprs[id(e)]

    def _emit(self, e: Expr) -> int:
        if id(e) not in self.emitted:
            node = Node(e.op, tuple(self._emit(a) for a in e.args), e.attrs)
            if node not in self.index:
                self.index[node] = len(self.nodes)
                self.nodes.append(node)
            self.emitted[id(e)] = self.index[node]
        return self.emitted[id(e)]


def _output_fields(o: Output) -> tuple[Any, ...]:
    """An output's (dtype[, reduce[, group]]), as ``build`` and the JSON take them."""
    return (o.dtype, *([o.reduce] if o.reduce else []), *([o.group] if o.group else []))


def _json_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
        raise ValueError(f"a group width is an integer, got {v!r:.40}")
    return int(v)


def _group_maxima(v: torch.Tensor, size: int) -> torch.Tensor:
    """The max of ``v`` over each group of ``size`` columns (its last dim; a partial last
    group over the columns it has): [..., ceil(N / size)]."""
    import torch

    padded = torch.nn.functional.pad(v, (0, -v.shape[-1] % size), value=-math.inf)
    return padded.unflatten(-1, (-1, size)).amax(-1)


def _expr_kind(e: Expr) -> Kind:
    return _node_kind(Node(e.op, (), e.attrs))


def _fold_const(op: str, args: Iterable[Expr], attrs: dict[str, AttrValue]) -> Expr:
    """Evaluate an op on constants in fp32, as the kernel would."""
    import torch

    values = []
    for a in args:
        v = a.attrs[0][1]
        values.append(torch.tensor(v, dtype=torch.bool if isinstance(v, bool) else torch.float32))
    out = RULES[op].torch(*values, **attrs)
    if result_kind(op, attrs) == "bool":
        return const(bool(out))
    return const(float(out.to(torch.float32)))
