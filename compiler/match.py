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
the kernel (``route``): an A that is ``x[index]`` (the tokens' rows by expert) is read as
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
only where a template can hold its rows (``registry.row_error``); else it is grown again
without them. A row value used outside the group is a ``row_max`` output (its one value).

Every group value used outside the group becomes an output of the kernel. The
anchor's own value is rounded to its dtype (as the unfused graph stores it);
the rest is computed in fp32 and rounded once per output, as Inductor's fused
pointwise kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS
from epilab.compiler.grow import GROUPED_OPS, PAIRED, Group, Grower, NoGroup, Use, val
from epilab.compiler.grow_conv import ConvGrower
from epilab.compiler.grow_dual import DualGrower
from epilab.compiler.grow_matmul import MatmulGrower
from epilab.compiler.routing import route
from epilab.ir import dtypes
from epilab.ir.epilogue import GROUP_REDUCE, Epilogue
from epilab.ir.patterns import canonical_order
from epilab.templates.registry import row_error

GROWERS: dict[str, type[Grower]] = {
    **dict.fromkeys(("mm", "addmm", "bmm", "baddbmm", "scaled_mm", "grouped_mm"), MatmulGrower),
    "conv2d": ConvGrower,
}


def match(
    anchor: fx.Node, after: Sequence[fx.Node], *, precision: str, whole_rows: bool = True, gather: bool = True
) -> Group:
    """The largest epilogue group of ``anchor`` over ``after`` (the nodes following it);
    without ``whole_rows`` it takes no norm over the rows (``row_total``s), nor where no
    template holds the rows of the group's problem (``registry.row_error``); without ``gather``
    a grouped group reads its A as it is (not gathered: ``route``)."""
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


def _group(g: Grower, a: fx.Node, b: fx.Node, precision: str) -> Group:
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
        a, uses = route(g, a, uses, len(exprs))
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


def match_dual(
    first: fx.Node, second: fx.Node, after: Sequence[fx.Node], *, precision: str, gather: bool = True
) -> Group:
    """The dual group of two mm/addmm anchors (or two grouped mms over one set of offsets)
    reading one A (``first`` before ``second`` in the graph) over ``after`` (the nodes following
    ``first``): one kernel computes both products and the pointwise work after them, where a
    member joins the two halves (``silu(gate) * up``). Anything of the second anchor's inputs
    computed from the first anchor would be a cycle through the kernel: refused. Without
    ``gather`` a grouped pair reads its A as it is (``route``)."""
    ops = [PAIRED.get(ANCHORS.get(n.target, "")) for n in (first, second)]  # type: ignore[arg-type]
    if ops[0] is None or ops[0] != ops[1]:
        raise NoGroup("a dual GEMM pairs two mm/addmm anchors, or two grouped mms")

    def grown(swap: bool) -> Group:
        g = DualGrower(first, second, swap, gather)
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
