"""A mixture of experts' routing joined to its grouped GEMM: an A gathered by an index (the
tokens' rows by expert) and an output added back to token order (the top-k combine)."""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from epilab.compiler.grow import Grower, Use, expr_of, same, val


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


def route(g: Grower, a: fx.Node, uses: list[Use], outputs: int) -> tuple[fx.Node, list[Use]]:
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
