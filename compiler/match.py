"""Matching: from a post-grad ATen graph to epilogue groups and their Problems.

For an anchor (mm, addmm, bmm, baddbmm; 2-D convolution) the group grows over the nodes after it
in graph order. A node joins when it is a pointwise op of ``aten_ops.POINTWISE``
(or a view that only splits or merges rows, or a same-shape copy) whose group
arguments have its own shape, and whose other tensor arguments are operands the
template can load per output element:

- scalars (one element), row vectors (broadcast over rows), column vectors
  (broadcast over columns) and full tiles of the output's shape;
- never a value computed from the anchor outside the group (that would be a
  cycle through the fused kernel).

A convolution's output is [N, K, P, Q]: its operands are per output channel
([K, 1, 1] or [1, K, 1, 1], such as a batch norm's statistics and affine
parameters), scalars and tensors of the output's shape; its group takes no views.

Two mm/addmm anchors that read the same A and whose products meet in a pointwise op
(``silu(gate) * up``) make one dual group (``match_dual``): one product is the epilogue's
``acc``, the other its ``acc2``, in the order ``patterns.canonical_order`` picks.

``torch._grouped_mm`` of A [T, K] and B [E, K, N] with its offsets (a mixture of experts'
projections) grows as an mm of output [T, N] does; its offsets are the group's extra input,
and two of them over one A and one set of offsets whose products meet make a dual grouped
group (every expert's gate and up projections in one kernel). The routing around them joins
the kernel (``_route``): an A that is ``x[index]`` (the tokens' rows by expert) is read as
``x`` with the index as the gather, and a group output whose one use is
``zeros.index_put_([index], y, accumulate=True)`` (or ``index_add``: the top-k combine back to
token order) is added there by the kernel; both where every token has the same rows
(``T = tokens x topk``), and the combine only where torch is not asked for deterministic
algorithms (its atomics add a token's rows in no fixed order).

A sum, mean or amax of a group value over its last dim (N: a norm's or a dynamic
quantization's row statistics) joins as a reduction output of the kernel (``row_sum``,
``row_max``: fp32 per row, added across the row's tiles); nothing in the group reads it.

A ``var_mean`` over a conv's channels (a LayerNorm over a ConvNeXt block's channels-last view)
joins whole: its mean and variance become ``row_total``s of the epilogue (the kernel sums a
pixel's every channel in one program), *row values* constant along the channels that the
pointwise ops after them read, so the norm is computed in the epilogue. A group keeps them
only where a template can hold its rows (``kinds.row_error``); else it is grown again
without them. A row value used outside the group is a ``row_max`` output (its one value).

Every group value used outside the group becomes an output of the kernel. The
anchor's own value is rounded to its dtype (as the unfused graph stores it);
the rest is computed in fp32 and rounded once per output, as Inductor's fused
pointwise kernels do.
"""

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

from epilab.compiler.aten_ops import (
    ANCHORS,
    GROUPED_MM_ARGS,
    IDENTITY,
    POINTWISE,
    ROW_REDUCTIONS,
    SCALED_MM_ARGS,
    VIEWS,
    Unsupported,
)
from epilab.ir import dtypes
from epilab.ir.epilogue import (
    ACCUMULATORS,
    GROUP_REDUCE,
    MAX_GROUP,
    Epilogue,
    Expr,
    acc,
    acc2,
    group_max,
    operand,
    row_total,
)
from epilab.ir.patterns import canonical_order
from epilab.ir.problem import (
    BATCHED_OPS,
    BLOCK_SCALED_OP,
    DUAL_OP,
    DUAL_WEIGHT_ONLY_OP,
    MATRIX_OPS,
    WEIGHT_ONLY_OP,
    Dim,
    OperandSpec,
    Problem,
    Shape,
    applied_precision,
)
from epilab.templates.conv_geometry import ConvGeometry, conv_problem
from epilab.templates.grouped_geometry import GroupedGeometry
from epilab.templates.kinds import default_template, row_error, template_hash
from epilab.templates.runtime import layout_of, operand_layout
from epilab.templates.weight_geometry import WEIGHT_ONLY_DTYPES, WEIGHT_SCALE, WeightGeometry

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


def _static(shape: Sequence[object]) -> bool:
    return all(expr_of(d).is_Integer for d in shape)


class _Grower(ABC):
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
        self.routing: dict[str, object] = {}  # a grouped group's routing (``_route``)
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
                    or not same(
                        math.prod(expr_of(d) for d in out_shape), math.prod(expr_of(d) for d in self.O)
                    )
                ):
                    return False
                self.shape_src[node] = None if same_shape(out_shape, self.O) else list(node.args[1])  # type: ignore[arg-type]
            self.values[node] = self.values[src]  # type: ignore[index]
            return True
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
        if not keepdim or out.dtype not in ANCHOR_DTYPES or not _static(out.shape):
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
        if not _static(v.shape) or not isinstance(correction, (int, float)) or isinstance(correction, bool):
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
        if not isinstance(dims, (list, tuple)) or not _static(shape) or not _static(out.shape):
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


def _block_scales(
    av: torch.Tensor, bv: torch.Tensor, sa: torch.Tensor | None, sb: torch.Tensor | None
) -> bool:
    """Whether a scaled mm's scales are block scales: A's [M, ceil(K/128)] and B's
    [ceil(K/128), ceil(N/128)] (``torch._scaled_mm``'s), not rowwise or tensorwise ones (shapes
    that read both ways, K and N of at most 128, are read as those: the same product)."""
    if sa is None or sb is None or sa.dim() != 2 or sb.dim() != 2:
        return False
    m, k, n = av.shape[-2], av.shape[-1], bv.shape[-1]
    if not _static([k, n]):
        return False
    groups, columns = -(-int(expr_of(k)) // 128), -(-int(expr_of(n)) // 128)
    block_a = same(sa.shape[0], m) and same(sa.shape[1], groups)
    block_b = same(sb.shape[0], groups) and same(sb.shape[1], columns)
    return block_a and block_b and (groups > 1 or columns > 1)


@dataclass(frozen=True)
class Dequantized:
    """An mm input that is an fp8 tensor converted to a wider dtype and scaled:
    ``(x8.to(dtype) * scale)`` (a weight's scale one per output channel, an activation's one per
    row, or one element; or none), maybe transposed (a linear layer's [N, K] weight)."""

    source: fx.Node  # the fp8 tensor
    scale: fx.Node | None
    permute: tuple[int, ...] | None  # (1, 0): the input is the source transposed
    reshape: list[object] | None = None  # the input is the source reshaped so (an activation's rows)


def _call(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _from_fp8(node: object) -> bool:
    """Whether ``node`` converts an fp8 tensor to a floating dtype."""
    if not _call(node, CONVERT) or not isinstance(node.args[0], fx.Node):  # type: ignore[union-attr]
        return False
    source, out = val(node.args[0]), val(node)  # type: ignore[union-attr]
    return (
        source is not None and out is not None and source.dtype in FP8_DTYPES and out.dtype.is_floating_point
    )


def _b_arg(anchor: fx.Node) -> fx.Node | None:
    """The B node of an mm or addmm anchor (None for the other anchors)."""
    op = ANCHORS.get(anchor.target)  # type: ignore[arg-type]
    b = anchor.args[1] if op == "mm" else anchor.args[2] if op == "addmm" else None
    return b if isinstance(b, fx.Node) else None


def dequantized(node: fx.Node, per: str) -> Dequantized | None:
    """``node`` as a dequantized 2-D fp8 tensor, ``[permute](x8.to(dtype) * scale
    [.to(dtype)])`` (the scale's dtype any; the product in any float dtype), whose scale is one
    element or one per column of the product (``per`` "column": a weight's output channels)
    or per row (``per`` "row": an activation's tokens, [..., K] flattened to rows by a view
    after the dequantization, as ``linear`` does; no permute); else None."""
    source, permute, reshape = node, None, None
    if per == "row" and _call(source, *VIEWS) and len(source.args) > 1:
        flat, whole = val(source), val(source.args[0])
        if flat is None or whole is None or flat.dim() != 2 or not same(flat.shape[-1], whole.shape[-1]):
            return None
        source, reshape = source.args[0], list(source.args[1])
    if (_call(source, aten.permute.default) and list(source.args[1]) == [1, 0]) or _call(
        source, aten.t.default
    ):
        source, permute = source.args[0], (1, 0)
    if _call(source, CONVERT) and _call(source.args[0], aten.mul.Tensor):
        source = source.args[0]  # the product rounded to the GEMM's dtype
    scale = None
    if _call(source, aten.mul.Tensor):
        x, y = source.args[:2]
        source, scale = (x, y) if _from_fp8(x) else (y, x)
    if not _from_fp8(source) or (permute and per == "row"):
        return None
    x8 = source.args[0]
    xv = val(x8)
    if xv is None or xv.dim() != (2 if reshape is None else val(source).dim()):  # type: ignore[union-attr]
        return None
    if scale is not None:
        sv = val(scale) if isinstance(scale, fx.Node) else None
        if sv is None or sv.dtype not in OPERAND_DTYPES or sv.device != xv.device or sv.dim() > xv.dim():
            return None
        shape = [1] * (xv.dim() - sv.dim()) + list(sv.shape)  # as it broadcasts against x8
        one = all(same(d, 1) for d in shape)
        if per == "row":  # one per row: every dim but the last (K) x8's
            along = all(same(d, x) for d, x in zip(shape[:-1], xv.shape[:-1], strict=True))
            along = along and same(shape[-1], 1)
        else:  # one per column of the product: x8's rows if it is transposed (a weight's [N, K])
            n_dim = 0 if permute else 1
            along = same(shape[n_dim], xv.shape[n_dim]) and same(shape[1 - n_dim], 1)
        if not (one or along):
            return None
    return Dequantized(x8, scale, permute, reshape)


BLOCK = 128  # the side of a block scale's group (DeepSeek-V3's, torch._scaled_mm's)


@dataclass(frozen=True)
class BlockDequantized:
    """An mm input dequantized from fp8 by block scales: a weight [N, K] by one float32 scale a
    128x128 block (``(w8.float().view(N/128, 128, K/128, 128) * s[:, None, :, None]).view(N,
    K)``, then transposed), or an activation by one a row and 128 of K (``x8.float().view(...,
    K/128, 128) * s[..., None]``, flattened to rows): DeepSeek-V3's scaling, as a model without a
    block-scaled GEMM writes it."""

    source: fx.Node  # the fp8 tensor
    scale: fx.Node  # its scales, float32, in the shape the product broadcast them
    scale_shape: list[object]  # the scales as the kernel reads them: [N/128, K/128] or [-1, K/128]
    permute: tuple[int, ...] | None = None  # (1, 0): the input is the weight transposed
    reshape: list[object] | None = None  # the input is the activation reshaped so (its rows)


def _strip_views(node: object) -> object:
    """``node`` past reshapes and conversions between floating dtypes (not from fp8)."""
    while _call(node, *VIEWS) or (_call(node, CONVERT) and not _from_fp8(node)):
        node = node.args[0]  # type: ignore[union-attr]
    return node


def _grouped_fp8(node: object) -> fx.Node | None:
    """The fp8 tensor of ``x8.to(float)`` viewed in groups, the view before the conversion or
    after it, or none (the tensor quantized in its groups); else None."""
    if _call(node, *VIEWS) and _from_fp8(node.args[0]):  # type: ignore[union-attr]
        return node.args[0].args[0]  # type: ignore[union-attr]
    if _from_fp8(node):
        inner = node.args[0]  # type: ignore[union-attr]
        return inner.args[0] if _call(inner, *VIEWS) else inner  # type: ignore[union-attr]
    return None


def block_dequantized(node: fx.Node, per: str) -> BlockDequantized | None:
    """``node`` as an fp8 tensor dequantized by block scales (``BlockDequantized``): ``per``
    "column" a linear layer's weight, transposed ([K, N] of an [N, K] weight, static, N and K
    multiples of 128); "row" an activation's rows ([M, K], K a static multiple of 128); else
    None."""
    top = node
    if per == "column":
        transposed = _call(top, aten.permute.default) and list(top.args[1]) == [1, 0]  # type: ignore[union-attr]
        if not (transposed or _call(top, aten.t.default)):
            return None
        top = top.args[0]  # type: ignore[assignment]
    product = _strip_views(top)
    tv, pv = val(top), val(product)
    if not _call(product, aten.mul.Tensor) or tv is None or pv is None or tv.dim() != 2:
        return None
    k = tv.shape[-1]
    if not _static([k]) or int(expr_of(k)) % BLOCK or pv.dim() < 2 or not same(pv.shape[-1], BLOCK):
        return None
    x, y = product.args[:2]  # type: ignore[union-attr]
    source = _grouped_fp8(x)
    scale = y
    if source is None:
        source, scale = _grouped_fp8(y), x
    sv, xv = (val(scale) if isinstance(scale, fx.Node) else None), val(source) if source is not None else None
    if source is None or xv is None or sv is None or sv.dtype != torch.float32 or sv.dim() > pv.dim():
        return None
    groups = int(expr_of(k)) // BLOCK
    shape = [1] * (pv.dim() - sv.dim()) + list(sv.shape)  # as it broadcasts against the product
    if per == "column":
        n = tv.shape[0]
        if not _static([n]) or int(expr_of(n)) % BLOCK or xv.dim() != 2 or not same_shape(xv.shape, tv.shape):
            return None
        rows = int(expr_of(n)) // BLOCK
        blocks = [rows, BLOCK, groups, BLOCK]
        if not same_shape(pv.shape, blocks) or not same_shape(shape, [rows, 1, groups, 1]):
            return None
        return BlockDequantized(source, scale, [rows, groups], permute=(1, 0))
    lead = pv.shape[:-2]
    if not same(pv.shape[-2], groups) or not same_shape(shape, [*lead, groups, 1]):
        return None
    # x8 in groups, in the activation's shape, or its rows (a kernel's 2-D output viewed in groups)
    rows = math.prod(expr_of(d) for d in lead)
    flat = xv.dim() == 2 and same(xv.shape[0], rows) and same(xv.shape[1], groups * BLOCK)
    if not (same_shape(xv.shape, pv.shape) or same_shape(xv.shape, [*lead, groups * BLOCK]) or flat):
        return None
    return BlockDequantized(source, scale, [-1, groups], reshape=[-1, groups * BLOCK])


class _MatmulGrower(_Grower):
    """mm, addmm, bmm, baddbmm: operands of the output's shape or broadcast along its rows or
    columns; views that split or merge rows join. An mm whose B is a dequantized fp8 weight
    (``dequantized``) reads the fp8 weight, its scale an epilogue operand per column: the
    weight-only kind, or with an A dequantized from fp8 too, the fp8 scaled mm of both."""

    takes_groups = True  # its kinds hold whole column groups (the matmul family's Triton loops)
    dequantizes = True  # an mm's B dequantized from fp8 is read as fp8 (weight-only)
    block_dequantizes = True  # ... and an mm of two block-dequantized fp8 inputs, block-scaled
    reads_fp8_activations = True  # ... and with its A dequantized too, the fp8 scaled mm
    weight_only = False

    def start(self) -> tuple[fx.Node, fx.Node]:
        a, b, value = self.take_anchor(self.anchor, acc(), "bias")
        self.values[self.anchor] = value
        self.shape_src[self.anchor] = None
        self.order.append(self.anchor)
        return a, b

    def take_anchor(self, node: fx.Node, leaf: Expr, bias_name: str) -> tuple[fx.Node, fx.Node, Expr]:
        """An anchor's A and B nodes and its value: ``leaf`` (its accumulator) scaled by alpha,
        plus its bias (an operand named ``bias_name``) scaled by beta, rounded to its dtype."""
        op = ANCHORS[node.target]  # type: ignore[index]
        if op == "scaled_mm":
            return self.take_scaled_mm(node, leaf)
        if op == "grouped_mm":
            return self.take_grouped_mm(node, leaf)
        args = list(node.args)
        kwargs = dict(node.kwargs)
        if op in ("addmm", "baddbmm"):
            bias, a, b = args[:3]
            beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
            alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        else:
            (a, b), bias, beta, alpha = args[:2], None, 0, 1
        av, bv = val(a), val(b)
        if av is None or bv is None:
            raise NoGroup("an input has no shape information")
        if av.dtype not in ANCHOR_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(f"inputs {av.dtype}/{bv.dtype}: the templates take float16, bfloat16, float32")
        out = val(node)
        if out is None or out.dtype != av.dtype:
            raise NoGroup(f"output dtype {getattr(out, 'dtype', None)} differs from the inputs' {av.dtype}")
        for name, x in (("alpha", alpha), ("beta", beta)):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise NoGroup(f"{name}={x!r} is not a number")
        value: Expr = leaf
        blocks = self.block_dequantizes and op in ("mm", "addmm")
        weight_blocks = block_dequantized(b, "column") if blocks else None
        activation_blocks = block_dequantized(a, "row") if weight_blocks is not None else None
        if activation_blocks is not None and weight_blocks is not None:  # one fp8 dtype, as the kind reads
            xv, wv = val(activation_blocks.source), val(weight_blocks.source)
            if xv is None or wv is None or xv.dtype != wv.dtype:
                activation_blocks = None
        weight = dequantized(b, "column") if self.dequantizes and op in ("mm", "addmm") else None
        if weight_blocks is not None and activation_blocks is not None:
            a, b = self.take_block_dequantized(activation_blocks, weight_blocks)
        elif weight is not None and dtypes.name_of(av.dtype) in WEIGHT_ONLY_DTYPES:
            a, b, value = self.take_dequantized(a, weight, value, bias_name.removeprefix("bias"))
        value = value if alpha == 1 else value * float(alpha)
        if bias is not None and beta != 0:
            bias_expr = self.operand(bias, self.O, bias_name)
            value = value + (bias_expr if beta == 1 else bias_expr * float(beta))
        if av.dtype != torch.float32 and not node.meta.get(UNROUNDED):
            value = Expr("cast", (value,), (("dtype", dtypes.name_of(av.dtype)),))
        return a, b, value  # type: ignore[return-value]

    def take_dequantized(
        self, a: fx.Node, weight: Dequantized, value: Expr, suffix: str = ""
    ) -> tuple[fx.Node, fx.Node, Expr]:
        """An mm of a dequantized fp8 weight: read as fp8, its scale in the epilogue (per column,
        passed flat; ``weight_scale`` + ``suffix``: a dual group's second is ``weight_scale2``).
        Where A is dequantized from the same fp8 dtype too (per row), the group is the fp8
        scaled mm of both (``acc * scale_a * scale_b``, as ``torch._scaled_mm``); else the
        weight-only mm of the 16-bit A."""
        activation = dequantized(a, "row") if self.reads_fp8_activations else None
        xv, wv = (val(activation.source) if activation else None), val(weight.source)
        both = activation is not None and xv is not None and wv is not None and xv.dtype == wv.dtype
        if both:
            assert activation is not None
            self.aten_dequantizes = True
            a, self.a_reshape = activation.source, activation.reshape
            if activation.scale is not None:  # per row, passed as [M, 1] (or one element)
                sv = val(activation.scale)
                assert sv is not None
                broadcast, shape = ("scalar", (-1,)) if sv.numel() == 1 else ("col", (-1, 1))
                key = (activation.scale, shape)
                if key not in self.operands:
                    self.operands[key] = Operand("scale_a", activation.scale, broadcast, shape)
                value = value * operand(self.operands[key].name, broadcast)
        else:
            self.weight_only = True
        self.b_permute = weight.permute
        if weight.scale is not None:
            sv = val(weight.scale)
            assert sv is not None
            broadcast = "scalar" if sv.numel() == 1 else "row"
            key = (weight.scale, (-1,))
            if key not in self.operands:
                name = "scale_b" if both else WEIGHT_SCALE + suffix
                self.operands[key] = Operand(name, weight.scale, broadcast, (-1,))
            value = value * operand(self.operands[key].name, broadcast)
        return a, weight.source, value

    def take_block_dequantized(self, x: BlockDequantized, w: BlockDequantized) -> tuple[fx.Node, fx.Node]:
        """An mm of an activation and a weight both dequantized by block scales (one fp8
        dtype): the block-scaled mm of the fp8 tensors, A's scales [M, K/128] and B's
        [K/128, N/128] (the weight's [N/128, K/128] transposed) its extra inputs."""
        self.block_scaled, self.precision, self.aten_dequantizes = True, "ieee", True
        self.a_reshape, self.b_permute = x.reshape, w.permute
        self.extra = [x.scale, w.scale]
        self.extra_views = {
            0: (("reshape", x.scale_shape),),
            1: (("reshape", w.scale_shape), ("permute", [1, 0])),
        }
        return x.source, w.source

    def take_scaled_mm(self, node: fx.Node, leaf: Expr) -> tuple[fx.Node, fx.Node, Expr]:
        """``torch._scaled_mm``: ``acc * scale_a * scale_b (+ bias)``, rounded
        to its out_dtype; the scales are operands (one element, or per row of A / column of B),
        use_fast_accum the problem's precision."""
        given = dict(zip(SCALED_MM_ARGS, node.args, strict=False)) | dict(node.kwargs)
        a, b = given["self"], given["mat2"]
        av, bv, out = val(a), val(b), val(node)
        if av is None or bv is None or out is None:
            raise NoGroup("an input has no shape information")
        if av.dtype not in FP8_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(
                f"scaled mm of {av.dtype}/{bv.dtype}: the templates take two fp8 inputs of one dtype"
            )
        if dtypes.name_or_none(out.dtype) not in dtypes.OUTPUT_DTYPES or out.dtype == torch.bool:
            raise NoGroup(f"scaled mm output dtype {out.dtype}")
        if given.get("scale_result") is not None:
            # torch 2.11 on an H100 returned the unscaled result (cuBLASLt, tensorwise, e4m3 out):
            # what the graph computes is not certain, so torch keeps it
            raise NoGroup("a scaled mm with scale_result (torch's result ignores it on some builds)")
        value = leaf
        accepted = {
            "scale_a": ("scalar", "col"),
            "scale_b": ("scalar", "row"),
            "bias": ("row",),
        }
        if _block_scales(av, bv, val(given["scale_a"]), val(given["scale_b"])):
            # DeepSeek-V3's scales: A's [M, K/128], B's [K/128, N/128], multiplied in the K loop
            if av.dim() != 2 or not _static(bv.shape):
                raise NoGroup("a block-scaled mm of 2-D A and a static B")
            self.block_scaled, self.extra = True, [given["scale_a"], given["scale_b"]]
            accepted = {"bias": ("row",)}
        for name, broadcasts in accepted.items():
            if given.get(name) is None:
                continue
            try:
                x = self.operand(given[name], self.O, name)
            except Unsupported as e:
                raise NoGroup(str(e)) from e
            broadcast = dict(x.attrs)["broadcast"]
            if broadcast not in broadcasts:
                raise NoGroup(f"{name} read per {broadcast}: a scaled mm takes {' or '.join(broadcasts)}")
            value = value + x if name == "bias" else value * x
        self.precision = "fast" if given.get("use_fast_accum") else "ieee"
        if out.dtype != torch.float32:
            value = Expr("cast", (value,), (("dtype", dtypes.name_of(out.dtype)),))
        return a, b, value  # type: ignore[return-value]

    def take_grouped_mm(self, node: fx.Node, leaf: Expr) -> tuple[fx.Node, fx.Node, Expr]:
        """``torch._grouped_mm`` of A [T, K] and B [E, K, N] with int32 offsets (the form a
        mixture of experts' projections take): ``acc`` rounded to its out_dtype; the offsets
        are the group's first extra input. Other forms (2-D B, 3-D A, a bias) stay with torch."""
        given = dict(zip(GROUPED_MM_ARGS, node.args, strict=False)) | dict(node.kwargs)
        a, b, offs = given["self"], given["mat2"], given.get("offs")
        av, bv, ov, out = val(a), val(b), val(offs), val(node)
        if av is None or bv is None or ov is None or out is None:
            raise NoGroup("a grouped mm without offsets or shape information")
        if av.dim() != 2 or bv.dim() != 3 or ov.dtype != torch.int32:
            raise NoGroup(
                f"a grouped mm of {av.dim()}-D A, {bv.dim()}-D B and {ov.dtype} offsets: the grouped "
                "templates take A [T, K], B [E, K, N] and int32 offsets"
            )
        if av.dtype not in ANCHOR_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(f"inputs {av.dtype}/{bv.dtype}: the templates take float16, bfloat16, float32")
        if given.get("bias") is not None:
            raise NoGroup("a grouped mm with a bias")
        if dtypes.name_or_none(out.dtype) not in dtypes.OUTPUT_DTYPES or out.dtype == torch.bool:
            raise NoGroup(f"grouped mm output dtype {out.dtype}")
        if self.extra and self.extra[0] is not offs:
            raise NoGroup("the two grouped mms read different offsets")
        self.extra = [offs]
        value = (
            leaf
            if out.dtype == torch.float32
            else Expr("cast", (leaf,), (("dtype", dtypes.name_of(out.dtype)),))
        )
        return a, b, value  # type: ignore[return-value]

    def operand_broadcast(
        self, node: fx.Node, pad: list[object], S: Sequence[object]
    ) -> tuple[str, tuple[int, ...] | None]:
        one = [same(p, 1) for p in pad]
        reshape: tuple[int, ...] | None = None
        if same_shape(S, self.O):
            if all(one):
                broadcast = "scalar"
            elif one[-2]:
                broadcast = "row"
            elif one[-1]:
                broadcast = "col"
            else:
                broadcast = "tile"
        else:  # S splits or merges the output's rows: pass the operand in the output's shape
            last = -1 if one[-1] else int(expr_of(self.O[-1])) if _static(self.O[-1:]) else None
            if last is None:
                raise Unsupported("a symbolic N after a view")
            if all(one[:-1]):
                broadcast, reshape = ("scalar" if one[-1] else "row"), (-1,)
            elif all(not o for o in one[:-1]):
                if len(self.O) == 3 and not _static(self.O[:1]):
                    raise Unsupported("a symbolic batch after a view")
                lead = [-1] if len(self.O) == 2 else [int(expr_of(self.O[0])), -1]
                broadcast, reshape = ("col" if one[-1] else "tile"), (*lead, 1 if one[-1] else last)
            else:
                raise Unsupported(f"operand {node.name} broadcasts over part of the rows")
        return broadcast, reshape

    def problem(
        self, a: fx.Node, b: fx.Node, operands: list[Operand], epilogue: Epilogue, precision: str
    ) -> Problem:
        op = BLOCK_SCALED_OP if self.block_scaled else "mm" if self.op == "scaled_mm" else self.op
        if self.weight_only:
            op = DUAL_WEIGHT_ONLY_OP if op == DUAL_OP else WEIGHT_ONLY_OP
        av, bv = val(a), val(b)
        assert av is not None and bv is not None
        if self.b_permute is not None:
            with fake_mode_of(bv):
                bv = torch.ops.aten.permute.default(bv, list(self.b_permute))
        if self.a_reshape is not None:
            with fake_mode_of(av):
                av = torch.ops.aten.reshape.default(av, self.a_reshape)
        if op in GROUPED_OPS:
            return self.grouped_problem(av, bv, operands, epilogue)
        if not self.weight_only and av.dtype != bv.dtype:  # else the kind's bind refuses it at run time
            raise NoGroup(f"A of {av.dtype} and B of {bv.dtype}: the {op} kinds read one dtype")
        batched = op in BATCHED_OPS
        if av.dim() != (3 if batched else 2) or bv.dim() != av.dim():
            raise NoGroup(f"{op} inputs of {av.dim()} and {bv.dim()} dims")
        sa = [dim_of(d) for d in av.shape]
        sb = [dim_of(d) for d in bv.shape]
        stride_a = [dim_of(d) for d in av.stride()]
        stride_b = [dim_of(d) for d in bv.stride()]
        shape = Shape(sa[0] if batched else 1, sa[-2], sb[-1], sa[-1])
        problem = Problem(
            op=op,
            template=default_template(op),
            template_hash=template_hash(default_template(op), epilogue),
            dtype=dtypes.name_of(av.dtype),
            layout_a=layout_of(sa[-2:], stride_a[-2:]),
            layout_b=layout_of(sb[-2:], stride_b[-2:]),
            operands=_operand_specs(operands),
            epilogue=epilogue,
            shape=shape,
            precision=applied_precision(dtypes.name_of(av.dtype), self.precision or precision),
            geometry=WeightGeometry(dtypes.name_of(bv.dtype)) if self.weight_only else None,
        )
        return _storable(problem)

    def grouped_problem(
        self, av: torch.Tensor, bv: torch.Tensor, operands: list[Operand], epilogue: Epilogue
    ) -> Problem:
        """A grouped (or dual grouped) problem: A [T, K], B [E, K, N], the experts static."""
        if not _static(bv.shape):
            raise NoGroup("a grouped mm's B (its experts, K and N) must be static")
        e, k, n = (int(expr_of(d)) for d in bv.shape)
        try:
            geometry = GroupedGeometry(e, **self.routing)  # type: ignore[arg-type]
        except ValueError as err:
            raise NoGroup(str(err)) from err
        problem = Problem(
            op=self.op,
            template=default_template(self.op),
            template_hash=template_hash(default_template(self.op), epilogue),
            dtype=dtypes.name_of(av.dtype),
            layout_a=layout_of([dim_of(d) for d in av.shape], [dim_of(d) for d in av.stride()]),
            layout_b=layout_of([k, n], [dim_of(d) for d in bv.stride()[1:]]),
            operands=_operand_specs(operands),
            epilogue=epilogue,
            shape=Shape(1, dim_of(av.shape[0] if self.rows is None else self.rows), n, k),
            geometry=geometry,
        )
        return _storable(problem)


def _operand_specs(operands: list[Operand]) -> tuple[OperandSpec, ...]:
    """Each operand's dtype and layout as the kernel reads it (after its reshape, if any)."""
    specs = []
    for o in operands:
        ov = val(o.node)
        assert ov is not None
        sizes, strides = list(ov.shape), list(ov.stride())
        if o.reshape is not None:
            with fake_mode_of(ov):
                moved = torch.ops.aten.reshape.default(ov, list(o.reshape))
            sizes, strides = list(moved.shape), list(moved.stride())
        layout = operand_layout(o.broadcast, [dim_of(d) for d in sizes], [dim_of(d) for d in strides])
        specs.append(OperandSpec(o.name, str(dtypes.name_or_none(ov.dtype)), layout))
    return tuple(specs)


def _storable(problem: Problem) -> Problem:
    """``problem``, which the database must read back as it is."""
    try:
        if Problem.from_json(problem.to_json()) != problem:
            raise ValueError("differs after a JSON round trip")
    except ValueError as e:
        raise NoGroup(f"the shape {problem.shape} cannot be stored ({e})") from e
    return problem


class _ConvGrower(_Grower):
    """2-D convolutions: operands per output channel, scalars and whole tensors; no views
    but permutes (a ConvNeXt block's ``permute(0, 2, 3, 1)`` before its channel LayerNorm:
    pointwise ops of a permuted value take scalars and per-channel operands, its reductions
    are mapped back to the output's dims, and a use of it permutes the kernel's output);
    statistics per pixel over the channels or per channel over the pixels (a pooling's)."""

    takes_views = False
    takes_rows = True
    reading: tuple[int, ...] | None = None  # the permutation of the values a joining node reads

    def try_join(self, node: fx.Node) -> bool:
        if node.op == "call_function" and node.target is torch.ops.aten.permute.default:
            return self._try_permute(node)
        perms = {self.perm.get(a) for a in node.all_input_nodes if a in self.values or a in self.pairs}
        if len(perms) != 1:
            return False  # values of two orders (or none of the group's)
        self.reading = perms.pop()
        try:
            joined = super().try_join(node)
        finally:
            read, self.reading = self.reading, None
        if joined and read is not None and node not in self.reduced:
            self.perm[node] = read
        return joined

    def _try_permute(self, node: fx.Node) -> bool:
        src, dims = node.args[0], node.args[1]
        if src not in self.values or not isinstance(dims, (list, tuple)) or len(dims) != len(self.O):
            return False
        order = self.perm.get(src, tuple(range(len(self.O))))  # type: ignore[arg-type]
        perm = tuple(order[int(d) % len(self.O)] for d in dims)
        self.values[node] = self.values[src]  # type: ignore[index]
        self.shape_src[node] = self.shape_src[src]  # type: ignore[index]
        if perm != tuple(range(len(self.O))):
            self.perm[node] = perm
        return True

    def _in_output_order(self, per_dim: Sequence[object]) -> list[object]:
        """Sizes (or flags) given per dim of a value read now, in the output's dim order."""
        if self.reading is None:
            return list(per_dim)
        out: list[object] = [None] * len(per_dim)
        for i, d in enumerate(self.reading):
            out[d] = per_dim[i]
        return out

    def reduced_axis(self, dims: list[int], shape: list[int]) -> tuple[str, int] | None:
        """Over the pixels (dims 2, 3: a global pool) a column statistic [N, K]; over the
        channels (dim 1) a row statistic [N, P, Q] (the dims of a permuted value mapped back)."""
        if self.reading is not None:
            dims = sorted(self.reading[d] for d in dims)
            shape = self._in_output_order(shape)  # type: ignore[assignment]
        if not same_shape(shape, self.O):
            return None
        _, k, p, q = shape
        return {(2, 3): ("col", p * q), (1,): ("row", k)}.get(tuple(dims))

    def start(self) -> tuple[fx.Node, fx.Node]:
        node = self.anchor
        x, w, bias, stride, padding, dilation, transposed, _, groups = node.args[:9]
        xv, wv = val(x), val(w)
        if xv is None or wv is None:
            raise NoGroup("an input has no shape information")
        if transposed or xv.dim() != 4 or len(stride) != 2:  # type: ignore[arg-type]
            raise NoGroup("only 2-D, non-transposed convolutions have a template")
        if xv.dtype not in ANCHOR_DTYPES or wv.dtype != xv.dtype or self.out.dtype != xv.dtype:
            raise NoGroup(f"inputs {xv.dtype}/{wv.dtype}: the templates take float16, bfloat16, float32")
        if not _static(self.O[1:]) or not _static(xv.shape[1:]):
            raise NoGroup("the conv2d template takes static channels and image sizes (the batch may vary)")
        self.conv_args = (list(stride), list(padding), list(dilation), int(groups))  # type: ignore[arg-type]
        value: Expr = acc()
        if bias is not None:
            if not isinstance(bias, fx.Node):
                raise NoGroup(f"bias {bias!r} is not a tensor")
            self.operands[(bias, None)] = Operand("bias", bias, "row", None)
            value = value + operand("bias", "row")
        if xv.dtype != torch.float32:
            value = Expr("cast", (value,), (("dtype", dtypes.name_of(xv.dtype)),))
        self.values[node] = value
        self.shape_src[node] = None
        self.order.append(node)
        return x, w  # type: ignore[return-value]

    def operand_broadcast(
        self, node: fx.Node, pad: list[object], S: Sequence[object]
    ) -> tuple[str, tuple[int, ...] | None]:
        """How an operand of a [N, K, P, Q] output is read: per channel (passed as [K]), whole, one.
        Read by a permuted value: its dims mapped back; a whole tensor is not taken there."""
        if not same_shape(self._in_output_order(S), self.O):
            raise Unsupported("a conv2d group takes no views")
        one = [same(p, 1) for p in self._in_output_order(pad)]
        if self.reading is not None and not any(one):
            raise Unsupported(f"operand {node.name} is a whole tensor in a permuted order")
        if all(one):
            return "scalar", None
        if one == [True, False, True, True]:
            return "row", (-1,)
        if not any(one):
            return "tile", None
        raise Unsupported(f"operand {node.name} broadcasts over part of the output")

    def problem(
        self, x: fx.Node, w: fx.Node, operands: list[Operand], epilogue: Epilogue, precision: str
    ) -> Problem:
        xv, wv = val(x), val(w)
        assert xv is not None and wv is not None
        stride, padding, dilation, groups = self.conv_args
        c, h, wd = (int(expr_of(d)) for d in xv.shape[1:])
        _, _, r, s = (int(expr_of(d)) for d in wv.shape)
        try:
            geometry = ConvGeometry(h, wd, c, r, s, tuple(stride), tuple(padding), tuple(dilation), groups)
        except ValueError as e:
            raise NoGroup(str(e)) from e
        return conv_problem(
            xv,  # type: ignore[arg-type]
            wv,  # type: ignore[arg-type]
            geometry,
            epilogue,
            [(o.name, o.broadcast, val(o.node)) for o in operands],  # type: ignore[misc]
            precision,
            template_hash(default_template("conv2d"), epilogue),
            None if _static(xv.shape[:1]) else expr_of(xv.shape[0]),
        )


GROWERS: dict[str, type[_Grower]] = {
    **dict.fromkeys(("mm", "addmm", "bmm", "baddbmm", "scaled_mm", "grouped_mm"), _MatmulGrower),
    "conv2d": _ConvGrower,
}


def match(
    anchor: fx.Node, after: Sequence[fx.Node], *, precision: str, whole_rows: bool = True, gather: bool = True
) -> Group:
    """The largest epilogue group of ``anchor`` over ``after`` (the nodes following it);
    without ``whole_rows`` it takes no norm over the rows (``row_total``s), nor where no
    template holds the rows of the group's problem (``kinds.row_error``); without ``gather``
    a grouped group reads its A as it is (not gathered: ``_route``)."""
    grower = GROWERS[ANCHORS[anchor.target]]  # type: ignore[index]
    g = grower(anchor, whole_rows=whole_rows, gather=gather)
    a, b = g.start()
    g.grow(after)
    if not g.pairs:
        return _group(g, a, b, precision)
    try:
        group = _group(g, a, b, precision)
        if row_error(group.problem) is None:
            return group
    except NoGroup:
        pass
    return match(anchor, after, precision=precision, whole_rows=False, gather=gather)


def _group(g: _Grower, a: fx.Node, b: fx.Node, precision: str) -> Group:
    """The group a grown grower holds: its outputs (members used outside it), epilogue,
    operands, problem and the kind's extra inputs."""
    members = set(g.order)
    exprs: list[tuple] = []  # (value, dtype) or (value, "float32", reduction)
    index: dict[tuple[int, str], int] = {}
    uses: list[Use] = []
    for node in g.order:
        if all(u in members for u in node.users):
            continue
        if node in g.pairs:
            raise NoGroup("a var_mean's pair is used outside the group")
        dt = str(dtypes.name_or_none(val(node).dtype))  # type: ignore[union-attr, arg-type]
        # a row value's one value per row: the max of it over the row (over its group, grouped)
        row_value = None
        if node in g.row_dim:
            row_value = (g.values[node], GROUP_REDUCE if node in g.grouped else "row_max")
        value, reduce = g.reduced.get(node, row_value or (g.values.get(node), ""))
        cast = None
        if reduce and dt != "float32":
            dt, cast = "float32", val(node).dtype  # type: ignore[union-attr]
        key = (id(value), dt, reduce)
        if key not in index:
            index[key] = len(exprs)
            group = (g.grouped[node],) if reduce == GROUP_REDUCE else ()
            exprs.append((value, dt, reduce, *group) if reduce else (value, dt))  # type: ignore[arg-type]
        uses.append(Use(node, index[key], g.shape_src[node], cast, None if reduce else g.perm.get(node)))
    if not uses:
        raise NoGroup("nothing of the group is used")
    if g.op in GROUPED_OPS:
        a, uses = _route(g, a, uses, len(exprs))
    epilogue = Epilogue.build(exprs)
    used = {name for name, _ in epilogue.operands}
    operands = [o for o in g.operands.values() if o.name in used]  # constant folding may drop some
    return Group(
        anchor=g.anchor,
        op=g.op,
        a=a,
        b=b,
        nodes=g.order,
        operands=operands,
        uses=uses,
        problem=g.problem(a, b, operands, epilogue, precision),
        extra=list(g.extra),
        b_permute=g.b_permute,
        a_reshape=g.a_reshape,
        extra_views=dict(g.extra_views),
        aten_dequantizes=g.aten_dequantizes,
    )


def _rows_index(node: object) -> tuple[fx.Node, fx.Node] | None:
    """(x, index) of ``x[index]`` (``aten.index.Tensor`` or ``index_select`` on dim 0) of a
    2-D x by a 1-D integer index; None for anything else."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target is torch.ops.aten.index.Tensor and len(node.args) == 2:
        x, indices = node.args
        found = indices[0] if isinstance(indices, (list, tuple)) and len(indices) == 1 else None
    elif node.target is torch.ops.aten.index_select.default and node.args[1:2] in ((0,), (-2,)):
        x, found = node.args[0], node.args[2]
    else:
        return None
    xv, iv = val(x), val(found)
    if (
        xv is None
        or iv is None
        or xv.dim() != 2
        or iv.dim() != 1
        or iv.dtype not in (torch.int32, torch.int64)
    ):
        return None
    return x, found  # type: ignore[return-value]


def _combine(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(zeros, index) where ``node``'s one use adds its rows into zeros at ``index`` rows
    (``index_put(zeros, [index], node, accumulate=True)`` or ``index_add(zeros, 0, index,
    node)``), zeros of the same dtype used by nothing else; None for anything else."""
    if len(node.users) != 1:
        return None
    (user,) = node.users
    if user.op != "call_function":
        return None
    if user.target is torch.ops.aten.index_put.default and len(user.args) == 4 and user.args[3] is True:
        zeros, indices, values = user.args[:3]
        index = indices[0] if isinstance(indices, (list, tuple)) and len(indices) == 1 else None
    elif user.target is torch.ops.aten.index_add.default and user.args[1] in (0, -2):
        zeros, _, index, values = user.args[:4]
        if user.kwargs.get("alpha", 1) != 1:
            return None
    else:
        return None
    ok = (
        values is node
        and isinstance(zeros, fx.Node)
        and zeros.target is torch.ops.aten.full.default
        and zeros.args[1] == 0
        and len(zeros.users) == 1
    )
    zv, iv, nv = val(zeros), val(index), val(node)
    if not ok or zv is None or iv is None or nv is None or zv.dtype != nv.dtype or zv.dim() != 2:
        return None
    if iv.dim() != 1 or iv.dtype not in (torch.int32, torch.int64) or not same(zv.shape[1], nv.shape[1]):
        return None
    if not same(iv.shape[0], nv.shape[0]):  # an index that broadcasts the rows: not a combine
        return None
    return zeros, index  # type: ignore[return-value]


def _topk(rows: object, tokens: object) -> int | None:
    """``rows / tokens`` where it is a whole number whatever the sizes (symbolic or not)."""
    ratio = sympy.simplify(expr_of(rows) / expr_of(tokens))
    return int(ratio) if ratio.is_Integer and int(ratio) >= 1 else None


def _route(g: _Grower, a: fx.Node, uses: list[Use], outputs: int) -> tuple[fx.Node, list[Use]]:
    """A grouped group's routing joined (see the module's text): its A (``x`` where A is
    ``x[index]``) and uses (the combine's node where a tile output is added back to tokens);
    the indices become its extra inputs after the offsets, the routing its geometry's."""
    t = val(a).shape[0]  # type: ignore[union-attr]
    gather = _rows_index(a) if g.gather else None
    topk = None
    if gather is not None:
        topk = _topk(t, val(gather[0]).shape[0])  # type: ignore[union-attr]
        gather = gather if topk is not None else None
    combine = None
    if outputs == 1 and len(uses) == 1 and uses[0].reshape is None and uses[0].cast is None:
        combine = _combine(uses[0].node)
    if combine is not None:
        k = _topk(t, val(combine[0]).shape[0])  # type: ignore[union-attr]
        # atomics: the order of a token's additions is not fixed (torch's deterministic
        # index_put sorts them); how many rows a token gets is the index's, unknown here
        ordered = k is not None and not torch.are_deterministic_algorithms_enabled()
        combine = combine if ordered and (topk is None or k == topk) else None
        topk = topk if combine is None else k
    if gather is None and combine is None:
        return a, uses
    g.routing = {"topk": topk, "gather": gather is not None, "scatter": "add" if combine else ""}
    g.extra = [*g.extra, *(r[1] for r in (gather, combine) if r is not None)]
    if gather is not None:
        g.rows, a = t, gather[0]
    if combine is not None:
        (user,) = uses[0].node.users
        uses = [Use(user, 0, None)]
    return a, uses


def fake_mode_of(v: torch.Tensor | None) -> object:
    """The fake-tensor mode a graph value belongs to (a no-op context outside one)."""
    mode = getattr(v, "fake_mode", None)
    if mode is None:
        from contextlib import nullcontext

        return nullcontext()
    return mode


# ------------------------------------------------------------------ dual GEMMs


class _DualGrower(_MatmulGrower):
    """Two mm/addmm anchors that read the same A (a gated MLP's gate and up projections):
    the first is ``acc``, the second ``acc2``; their B nodes have one shape, dtype and set of
    strides. The group grows over the nodes after the first anchor, as one group of both.
    Where both Bs are fp8 weights dequantized alike (``dequantized``: one fp8 dtype, both
    transposed or neither) the pair reads them as fp8, each scale in the epilogue (the dual
    weight-only kind); else both Bs as the graph has them."""

    reads_fp8_activations = False  # no dual template takes fp8 A
    block_dequantizes = False

    def __init__(self, anchor: fx.Node, second: fx.Node, swap: bool = False, gather: bool = True) -> None:
        super().__init__(anchor, gather=gather)
        self.second = second
        self.swap = swap  # the second anchor is acc, the first acc2 (``canonical_order``)
        self.desc.add(second)

    def start(self) -> tuple[fx.Node, fx.Node]:
        leaves, names = (
            ((acc2(), acc()), ("bias2", "bias")) if self.swap else ((acc(), acc2()), ("bias", "bias2"))
        )
        bs = [_b_arg(node) for node in (self.anchor, self.second)]
        if any(b is not None and block_dequantized(b, "column") is not None for b in bs):
            raise NoGroup("block-scaled fp8 weights: each mm is a block-scaled group of its own")
        weights = [dequantized(b, "column") if b is not None else None for b in bs]
        sources = [val(w.source) if w is not None else None for w in weights]
        self.dequantizes = (
            all(w is not None for w in weights)
            and len({s.dtype for s in sources if s is not None}) == 1
            and len({w.permute for w in weights if w is not None}) == 1
        )
        second = val(self.second)
        if second is None or not same_shape(second.shape, self.O):  # before its bias is taken
            raise NoGroup("the two anchors' outputs differ in shape")
        a, b, value = self.take_anchor(self.anchor, leaves[0], names[0])
        a2, b2, value2 = self.take_anchor(self.second, leaves[1], names[1])
        if not same_input(a, a2):
            raise NoGroup("the two anchors read different A nodes")
        bv, b2v = val(b), val(b2)
        assert bv is not None and b2v is not None
        if (
            b2v.dtype != bv.dtype
            or not same_shape(b2v.shape, bv.shape)
            or not same_shape(b2v.stride(), bv.stride())
        ):
            raise NoGroup("the two anchors' B differ in shape, dtype or strides")
        self.inputs2 = [n for n in self.second.all_input_nodes if n is not a]  # B2 and its bias
        for node, v in ((self.anchor, value), (self.second, value2)):
            self.values[node] = v
            self.shape_src[node] = None
            self.order.append(node)
        self.op = PAIRED[ANCHORS[self.anchor.target]]  # type: ignore[index]
        # the kernel's B and B2: the B of the acc anchor, and of the acc2 anchor
        kernel_b, self.b2 = (b2, b) if self.swap else (b, b2)
        self.extra = [*self.extra, self.b2]  # a grouped pair's offsets first
        if self.b_permute is not None:  # a dual weight-only pair's B2 is permuted as B
            self.extra_views[len(self.extra) - 1] = (("permute", list(self.b_permute)),)
        return a, kernel_b

    def joins(self) -> bool:
        """Whether a member's value reads both accumulators (the halves meet in the group);
        a row statistic (``self.reduced``: an MoE router's softmax beside its expert's
        projection) is no meeting."""
        both = set(ACCUMULATORS)
        return any(n in self.values and _accumulators(self.values[n]) >= both for n in self.order)


def same_input(x: object, y: object) -> bool:
    """Whether two nodes are one value: the same node, or the same view of one node (each
    nn.Linear flattens its input with a reshape of its own)."""
    if x is y:
        return True
    return (
        isinstance(x, fx.Node)
        and isinstance(y, fx.Node)
        and x.op == y.op == "call_function"
        and x.target in VIEWS
        and x.target == y.target
        and x.args == y.args
        and x.kwargs == y.kwargs
    )


def _accumulators(e: Expr) -> set[str]:
    """The accumulator leaves an expression reads."""
    found: set[str] = set()
    seen: set[int] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op in ACCUMULATORS:
            found.add(x.op)
        stack.extend(x.args)
    return found


def match_dual(
    first: fx.Node, second: fx.Node, after: Sequence[fx.Node], *, precision: str, gather: bool = True
) -> Group:
    """The dual group of two mm/addmm anchors (or two grouped mms over one set of offsets)
    reading one A (``first`` before ``second`` in the graph) over ``after`` (the nodes following
    ``first``): one kernel computes both products and the pointwise work after them, where a
    member joins the two halves (``silu(gate) * up``). Anything of the second anchor's inputs
    computed from the first anchor would be a cycle through the kernel: refused. Without
    ``gather`` a grouped pair reads its A as it is (``_route``)."""
    ops = [PAIRED.get(ANCHORS.get(n.target, "")) for n in (first, second)]  # type: ignore[arg-type]
    if ops[0] is None or ops[0] != ops[1]:
        raise NoGroup("a dual GEMM pairs two mm/addmm anchors, or two grouped mms")

    def grown(swap: bool) -> Group:
        g = _DualGrower(first, second, swap, gather)
        a, b = g.start()
        g.grow([n for n in after if n is not second])
        if any(n in g.desc for n in g.inputs2):
            raise NoGroup("the second anchor reads a value computed from the first")
        if not g.joins():
            raise NoGroup("the two products never meet in a pointwise op")
        return _group(g, a, b, precision)

    # one problem whichever projection comes first in the graph (``canonical_order``): the
    # other order is grown only where this one is not canonical
    group = grown(swap=False)
    return group if canonical_order(group.problem.epilogue) else grown(swap=True)
