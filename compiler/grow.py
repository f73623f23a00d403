"""Growing an epilogue group from an anchor: the group's parts (``Operand``, ``Use``,
``Group``) and ``Grower``, what every anchor family shares (``match`` says how a group
grows; a family's grower says how its anchor starts the group, how an operand of its output
is read, whether views may join and which problem the group makes)."""

from __future__ import annotations

import dataclasses
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import sympy
import torch
import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS, IDENTITY, POINTWISE, ROW_REDUCTIONS, VIEWS, Unsupported
from epilab.ir import dtypes
from epilab.ir.epilogue import MAX_GROUP, Epilogue, Expr, group_max, operand, row_total
from epilab.ir.problem import Dim, Problem
from epilab.templates.gemm.ops import DUAL_OP, MATRIX_OPS
from epilab.templates.grouped.grouped_geometry import GroupedGeometry

# meta flag of an anchor whose only users read it in fp32 (a folded norm's projection): the
# kernel keeps its accumulator unrounded (the aten op, where it stays, rounds as ATen does)
UNROUNDED = "epilab_unrounded"
GROUPED_OPS = ("grouped_mm", "dual_grouped_mm")  # the problem ops of torch._grouped_mm's groups
PAIRED = {"mm": DUAL_OP, "addmm": DUAL_OP, "grouped_mm": "dual_grouped_mm"}  # anchor op -> its dual's
ANCHOR_DTYPES = tuple(dtypes.torch_dtype(d) for d in dtypes.WIDE_INPUT_DTYPES)
FP8_DTYPES = tuple(dtypes.torch_dtype(d) for d in dtypes.FP8_DTYPES)
OPERAND_DTYPES = tuple(dtypes.torch_dtype(d) for d in dtypes.OPERAND_DTYPES)
aten = torch.ops.aten
CONVERT = torch.ops.prims.convert_element_type.default
# How the kernel's input is made of a graph node: ("reshape", shape) and ("permute", dims) steps
ViewSteps = tuple[tuple[str, list[object]], ...]


@dataclass(frozen=True)
class Operand:
    """A tensor the epilogue loads: its graph node, and how it is passed to the kernel."""

    name: str
    node: fx.Node
    broadcast: str  # row, col, tile, scalar
    reshape: tuple[int, ...] | None  # passed through aten.reshape with this shape (may hold -1)


@dataclass(frozen=True)
class Use:
    """A group member used outside the group: the kernel output that replaces it."""

    node: fx.Node
    output: int
    reshape: list[object] | None  # reshape args giving the output the member's shape
    cast: torch.dtype | None = None  # then converted to this dtype (a max taken in fp32)
    permute: tuple[int, ...] | None = None  # first permuted so (a conv output's channels-last view)


@dataclass
class Group:
    """An anchor with the pointwise nodes fused after it."""

    anchor: fx.Node
    op: str
    a: fx.Node
    b: fx.Node
    nodes: list[fx.Node]  # members in graph order, anchor first
    operands: list[Operand]
    uses: list[Use]  # members used outside the group, and which kernel output replaces each
    problem: Problem
    extra: list[fx.Node] = dataclasses.field(default_factory=list)  # the kind's extra inputs (B2)
    b_permute: tuple[int, ...] | None = None  # the kernel's B is ``b`` permuted so (an fp8 weight's [N, K])
    a_reshape: list[object] | None = None  # the kernel's A is ``a`` reshaped so (an fp8 activation's rows)
    extra_views: dict[int, ViewSteps] = dataclasses.field(default_factory=dict)  # extra[i] viewed so
    # the aten path dequantizes fp8 inputs and runs a 16-bit GEMM (the graph's own ops): the
    # fp8 library baselines recorded for the problem do not time it (``decide``)
    aten_dequantizes: bool = False

    @property
    def shape_text(self) -> str:
        s = self.problem.shape
        dims = [s.m, s.n, s.k] if self.op in (*MATRIX_OPS, *GROUPED_OPS) else [s.batch, s.m, s.n, s.k]
        g = self.problem.geometry
        routing = ""
        if isinstance(g, GroupedGeometry) and g.routed:  # the rows moved in the kernel
            routing = (" gathered" if g.gather else "") + (f" top-{g.topk} added back" if g.scatter else "")
        return "x".join(str(d) for d in dims) + routing


class NoGroup(ValueError):
    """The anchor cannot become a template call (the reason is the message)."""


def expr_of(d: object) -> sympy.Expr:
    """A size as a sympy expression (SymInts through their symbolic node)."""
    if isinstance(d, torch.SymInt):
        return sympy.sympify(d.node.expr)
    if isinstance(d, sympy.Expr):
        return d
    return sympy.Integer(int(d))  # type: ignore[call-overload]


def dim_of(d: object) -> Dim:
    e = expr_of(d)
    return int(e) if e.is_Integer else e


def same(a: object, b: object) -> bool:
    return bool(sympy.expand(expr_of(a) - expr_of(b)) == 0)


def same_shape(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def val(node: object) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def is_static(shape: Sequence[object]) -> bool:
    return all(expr_of(d).is_Integer for d in shape)


class Grower(ABC):
    """Grows an epilogue group from an anchor; a subclass per anchor family (``GROWERS``)
    says how its anchor starts the group, how an operand of its output is read, whether
    views may join and which problem the group makes."""

    takes_views = True  # views that split or merge the output's rows may join
    takes_rows = False  # a var_mean over the rows may join (``row_total``s)
    takes_groups = False  # a view splitting the columns into groups may join (``group_max``)

    def __init__(self, anchor: fx.Node, *, whole_rows: bool = True, gather: bool = True) -> None:
        self.whole_rows = whole_rows and self.takes_rows
        self.gather = gather  # a grouped group may read its A as rows gathered by an index
        self.anchor = anchor
        self.op = ANCHORS[anchor.target]  # type: ignore[index]
        out = val(anchor)
        if out is None:
            raise NoGroup("the anchor has no shape information")
        self.out = out
        self.O = tuple(out.shape)
        self.values: dict[fx.Node, Expr] = {}
        self.shape_src: dict[fx.Node, list[object] | None] = {}  # reshape args that give its shape
        self.desc: set[fx.Node] = {anchor}
        self.operands: dict[tuple[fx.Node, tuple[int, ...] | None], Operand] = {}
        self.order: list[fx.Node] = []
        self.precision: str | None = None  # the anchor's own (a scaled mm's fast accumulation)
        self.block_scaled = False  # a scaled mm of block scales: its scales are the extra inputs
        # fp8 inputs read through the graph's dequantize ops (both A and B): without the
        # template the graph runs those ops and a 16-bit GEMM, not an fp8 library GEMM
        self.aten_dequantizes = False
        self.reduced: dict[fx.Node, tuple[Expr, str]] = {}  # statistics: (value, reduction)
        # a value whose dims are the output's permuted (dim i is the output's dim perm[i]):
        # a conv output's channels-last view; absent: the output's own order
        self.perm: dict[fx.Node, tuple[int, ...]] = {}
        # row values: constant along the output's rows (a norm's mean and variance over them),
        # each with the dim (in its own order) its shape has as 1 where the output has N
        self.row_dim: dict[fx.Node, int] = {}
        # values of the output's columns split into groups ([..., N / G, G]: a per-token-group
        # quantization), by their group width G; those with a last dim of 1 (a group's amax) are
        # also row values (``row_dim``): constant along each group, a group output when used
        self.grouped: dict[fx.Node, int] = {}
        self.pairs: dict[fx.Node, tuple[Expr, Expr]] = {}  # a var_mean's (variance, mean)
        self.extra: list[fx.Node] = []  # the kind's extra inputs, in its order (offsets, B2)
        self.routing: dict[str, object] = {}  # a grouped group's routing (``route``)
        self.b_permute: tuple[int, ...] | None = None  # B is the node ``b`` permuted so
        self.a_reshape: list[object] | None = None  # A is the node ``a`` reshaped so
        self.extra_views: dict[int, ViewSteps] = {}  # extra[i] is viewed so (a block scale's shape)
        self.rows: object = None  # its grouped rows T where A's rows are gathered

    # -- the anchor family's part
    @abstractmethod
    def start(self) -> tuple[fx.Node, fx.Node]:
        """Take the anchor in: its value, its operands; returns its A and B nodes."""

    @abstractmethod
    def operand_broadcast(
        self, node: fx.Node, pad: list[object], S: Sequence[object]
    ) -> tuple[str, tuple[int, ...] | None]:
        """How tensor ``node`` (its shape padded to ``S``'s rank: ``pad``) is read at
        positions of shape ``S``: its operand broadcast, and the reshape it is passed through."""

    @abstractmethod
    def problem(
        self, a: fx.Node, b: fx.Node, operands: list[Operand], epilogue: Epilogue, precision: str
    ) -> Problem:
        """The group's problem, from its A and B nodes, operands and epilogue."""

    # -- operands
    def operand(self, node: object, S: Sequence[object], name: str | None = None) -> Expr:
        """The operand expression for tensor ``node`` read at positions of shape ``S``."""
        if not isinstance(node, fx.Node):
            raise Unsupported(f"argument {node!r} is not a tensor")
        if node in self.desc:
            raise Unsupported(f"{node.name} is computed from the anchor outside the group")
        tv = val(node)
        if tv is None:
            raise Unsupported(f"{node.name} has no shape information")
        if tv.dtype not in OPERAND_DTYPES or tv.device != self.out.device:
            raise Unsupported(f"operand {node.name} is {tv.dtype} on {tv.device}")
        shape = list(tv.shape)
        if len(shape) > len(S):
            raise Unsupported(f"operand {node.name} has more dims than the output")
        pad = [1] * (len(S) - len(shape)) + shape
        if not all(same(p, 1) or same(p, s) for p, s in zip(pad, S, strict=True)):
            raise Unsupported(f"operand {node.name} of shape {tuple(shape)} does not broadcast to {tuple(S)}")
        broadcast, reshape = self.operand_broadcast(node, pad, S)
        key = (node, reshape)
        if key not in self.operands:
            count = sum(1 for o in self.operands.values() if o.name.startswith("op"))
            self.operands[key] = Operand(name or f"op{count}", node, broadcast, reshape)
        found = self.operands[key]
        if found.broadcast != broadcast:
            raise Unsupported(f"operand {node.name} is read two ways")
        return operand(found.name, broadcast)

    # -- growth
    def try_join(self, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is torch.ops.aten.var_mean.correction:
            return self.whole_rows and self.try_var_mean(node)
        if node.target is operator.getitem and node.args[0] in self.pairs:
            return self.take_item(node)
        out = val(node)
        if out is None:
            return False
        target = node.target
        if target in ROW_REDUCTIONS:
            return self.try_reduction(node, out)
        if target in VIEWS or target in IDENTITY:
            return self.try_view(node, out)
        builder = POINTWISE.get(target)
        if builder is None or dtypes.name_or_none(out.dtype) is None:
            return False
        S = list(out.shape)
        group_args = [a for a in node.all_input_nodes if a in self.values]
        if not group_args:
            return False
        if target is CONVERT and val(node.args[0]).dtype in FP8_DTYPES:  # type: ignore[union-attr]
            return False  # an fp8 value converted back stays outside: the next GEMM reads the fp8
        grouped = {self.grouped.get(a) for a in group_args}
        if len(grouped) > 1 or (None not in grouped and len(group_args) < len(node.all_input_nodes)):
            return False  # grouped values join only each other and numbers
        whole = [a for a in group_args if a not in self.row_dim]
        src = whole[0] if whole else group_args[0]
        if not all(self.fits(a, S) for a in group_args):
            return False

        def convert(x: object) -> object:
            if isinstance(x, fx.Node):
                if x in self.values:
                    return self.values[x]
                return self.outer(x, S) or self.operand(x, S)
            if isinstance(x, (bool, int, float, str, torch.dtype)) or x is None:
                return x
            if isinstance(x, (torch.memory_format, torch.device)):
                return x
            raise Unsupported(f"argument {x!r}")

        try:
            args = [convert(x) for x in node.args]
            kwargs = {k: convert(v) for k, v in node.kwargs.items()}
            expr = builder(*args, **kwargs)
        except (Unsupported, ValueError, TypeError):
            return False
        if not isinstance(expr, Expr):  # a builder folded everything to a number
            return False
        self.values[node] = expr
        self.shape_src[node] = self.shape_src[src]
        if not whole:  # row values only: a row value
            self.row_dim[node] = self.row_dim[src]
        if src in self.grouped:
            self.grouped[node] = self.grouped[src]
        return True

    def try_view(self, node: fx.Node, out: torch.Tensor) -> bool:
        """Join a view (rows split or merged, or column groups formed) or an identity op."""
        target = node.target
        if not self.takes_views and target not in IDENTITY:
            return False
        src = node.args[0]
        sizes = [n for n in node.all_input_nodes if n is not src]  # symbolic sizes are nodes too
        if src not in self.values or any(val(n) is not None for n in sizes):
            return False
        in_shape = list(val(src).shape)  # type: ignore[union-attr]
        out_shape = list(out.shape)
        if target in IDENTITY:
            if not same_shape(in_shape, out_shape):
                return False
            self.shape_src[node] = self.shape_src[src]  # type: ignore[index]
        elif src in self.grouped or (out_shape and not same(out_shape[-1], self.O[-1])):
            return self.try_groups(node, src, in_shape, out_shape)
        else:
            # rows split or merged: same last dim, same number of elements
            if (
                not out_shape
                or not same(out_shape[-1], self.O[-1])
                or not same(math.prod(expr_of(d) for d in out_shape), math.prod(expr_of(d) for d in self.O))
            ):
                return False
            self.shape_src[node] = None if same_shape(out_shape, self.O) else list(node.args[1])  # type: ignore[arg-type]
        self.values[node] = self.values[src]  # type: ignore[index]
        return True

    def try_groups(
        self, node: fx.Node, src: fx.Node, in_shape: list[object], out_shape: list[object]
    ) -> bool:
        """A view splitting the output's columns into groups of a static power-of-two width
        ([..., N] -> [..., N / G, G], the leading dims as they are): a grouped value, whose
        ``amax`` over the last dim is a ``group_max`` (``try_group_max``)."""
        if not self.takes_groups or self.op in GROUPED_OPS or len(out_shape) < 2:
            return False  # the grouped kinds have no column groups
        if src in self.grouped or src in self.row_dim:
            return False
        width = out_shape[-1]
        if not (expr_of(width).is_Integer and same(in_shape[-1], self.O[-1])):
            return False
        width = int(expr_of(width))
        if not (2 <= width <= MAX_GROUP and not width & (width - 1)):
            return False
        if not same_shape(out_shape[:-2], in_shape[:-1]) or not same(out_shape[-2] * width, in_shape[-1]):
            return False
        self.values[node] = self.values[src]
        self.shape_src[node] = list(node.args[1])  # type: ignore[arg-type]
        self.grouped[node] = width
        return True

    def try_group_max(self, node: fx.Node, out: torch.Tensor) -> bool:
        """``amax(v, -1, keepdim=True)`` of a grouped value: its ``group_max``, a row value of
        the grouped shape (its last dim 1), in fp32 as torch's reductions take it."""
        src, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        shape = list(val(src).shape)  # type: ignore[union-attr]
        keepdim = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
        if not isinstance(dims, (list, tuple)) or [d % len(shape) for d in dims] != [len(shape) - 1]:
            return False
        if not keepdim or out.dtype not in ANCHOR_DTYPES or not is_static(out.shape):
            return False
        self.values[node] = group_max(self.values[src], self.grouped[src])  # type: ignore[index]
        self.grouped[node] = self.grouped[src]  # type: ignore[index]
        self.row_dim[node] = len(shape) - 1
        self.shape_src[node] = [int(expr_of(d)) for d in out.shape]
        return True

    def fits(self, arg: fx.Node, S: Sequence[object]) -> bool:
        """Whether group value ``arg`` is read as it is at positions of shape ``S``: of that
        shape, or a row value broadcast along the rows of a value of that shape."""
        shape = list(val(arg).shape)  # type: ignore[union-attr]
        if same_shape(shape, S):
            return True
        d = self.row_dim.get(arg)
        return d is not None and same_shape(shape, [1 if i == d else x for i, x in enumerate(S)])

    def try_var_mean(self, node: fx.Node) -> bool:
        """``var_mean(x, dims, correction, keepdim=True)`` of a group value over the output's
        rows (``reduced_axis`` "row"): its mean and variance as ``row_total``s, in fp32."""
        src, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        correction = node.kwargs.get("correction", 1)
        if src not in self.values or src in self.row_dim or not node.kwargs.get("keepdim"):
            return False
        v = val(src)
        if v is None or v.dtype != torch.float32 or not isinstance(dims, (list, tuple)) or len(dims) != 1:
            return False
        if not is_static(v.shape) or not isinstance(correction, (int, float)) or isinstance(correction, bool):
            return False
        shape = [int(expr_of(d)) for d in v.shape]
        dim = int(dims[0]) % len(shape)  # type: ignore[call-overload]
        found = self.reduced_axis([dim], shape)
        if found is None or found[0] != "row" or found[1] - correction <= 0:
            return False
        x = self.values[src]  # type: ignore[index]
        mean = row_total(x) * (1.0 / found[1])
        centred = x - mean
        self.pairs[node] = (row_total(centred * centred) * (1.0 / (found[1] - correction)), mean)
        self.row_dim[node] = dim
        self.shape_src[node] = None
        return True

    def take_item(self, node: fx.Node) -> bool:
        """A var_mean's variance (0) or mean (1): a row value."""
        pair, index = node.args
        if index not in (0, 1) or val(node) is None:
            return False
        self.values[node] = self.pairs[pair][index]  # type: ignore[index, call-overload]
        self.row_dim[node] = self.row_dim[pair]  # type: ignore[index]
        self.shape_src[node] = [int(expr_of(d)) for d in val(node).shape]  # type: ignore[union-attr]
        return True

    def outer(self, node: fx.Node, S: Sequence[object]) -> Expr | None:
        """A pointwise op of vectors and scalars only whose result is a whole tile (a column
        vector times a row vector: a folded LayerNorm's ``mean[m] * c[n]``), computed in the
        epilogue from its operands instead of read as a materialised tile; None otherwise."""
        builder = POINTWISE.get(node.target)
        tv = val(node)
        if builder is None or node.op != "call_function" or node in self.desc or tv is None:
            return None
        if tv.dim() < 2 or not all(not same(d, 1) for d in tv.shape[-2:]):
            return None  # not a tile
        args = []
        for a in node.args:
            if isinstance(a, fx.Node):
                av = val(a)
                vector = av is not None and (av.dim() < 2 or same(av.shape[-1], 1) or same(av.shape[-2], 1))
                if not vector:
                    return None  # a tile itself: nothing gained
                args.append(self.operand(a, S))
            elif isinstance(a, (bool, int, float)):
                args.append(a)
            else:
                return None
        expr = builder(*args, **node.kwargs)
        return expr if isinstance(expr, Expr) else None

    def try_reduction(self, node: fx.Node, out: torch.Tensor) -> bool:
        """A sum, mean or amax of a group value over the dims the family's GEMM reduces a
        tile over (``reduced_axis``), of static shape, joins as a reduction output (a
        terminal member: nothing in the group reads it). Taken in fp32; a half-precision
        result is rounded once after it, as torch's own reductions accumulate in fp32."""
        src, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        how = ROW_REDUCTIONS[node.target]
        if src in self.grouped:
            return how == "max" and src not in self.row_dim and self.try_group_max(node, out)
        if src not in self.values or out.dtype not in ANCHOR_DTYPES:
            return False
        if node.kwargs.get("dtype") not in (None, out.dtype):
            return False
        shape = list(val(src).shape)  # type: ignore[union-attr]
        if not isinstance(dims, (list, tuple)) or not is_static(shape) or not is_static(out.shape):
            return False
        found = self.reduced_axis(sorted(d % len(shape) for d in dims), [int(expr_of(d)) for d in shape])
        if found is None:
            return False
        axis, count = found
        value = self.values[src]  # type: ignore[index]
        if how == "mean":
            value = value * (1.0 / count)
        self.reduced[node] = (value, f"{axis}_max" if how == "max" else f"{axis}_sum")
        self.shape_src[node] = [int(expr_of(d)) for d in out.shape]
        return True

    def reduced_axis(self, dims: list[int], shape: list[int]) -> tuple[str, int] | None:
        """Which statistic a reduction over ``dims`` of a group value of ``shape`` is: ("row",
        N) over the last dim (N) of the output; None for any other."""
        if dims != [len(shape) - 1] or not same(shape[-1], self.O[-1]):
            return None
        return "row", shape[-1]

    def grow(self, nodes: Sequence[fx.Node]) -> None:
        for node in nodes:
            if not any(a in self.desc for a in node.all_input_nodes):
                continue
            before = dict(self.operands)
            if self.try_join(node):
                self.order.append(node)
            else:
                self.operands = before  # operands found on the way are not used
            self.desc.add(node)


def fake_mode_of(v: torch.Tensor | None) -> object:
    """The fake-tensor mode a graph value belongs to (a no-op context outside one)."""
    mode = getattr(v, "fake_mode", None)
    if mode is None:
        from contextlib import nullcontext

        return nullcontext()
    return mode
