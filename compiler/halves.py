"""A concatenated projection seen as its two halves (``gate, up = gate_up(x).chunk(2, -1)``).

Some models keep a gated MLP's gate and up weights as one [2F, K] linear and split its
output; a mixture of experts keeps them as one [E, 2F, K] weight of a grouped GEMM (the
widely used model library's default). ``split_halves`` rewrites such an anchor, tentatively,
into two mm/addmm (or grouped_mm) anchors over views of the weight's halves (and of the
bias's), each followed by the reshape the output went through, and moves the two chunks'
users onto them: the dual-GEMM matcher then sees the two-weight form. ``Halves.undo``
restores the graph exactly when the dual template is not chosen (the single GEMM stays one
cuBLAS call).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS, VIEWS
from epilab.compiler.grow import fake_mode_of, same, val

aten = torch.ops.aten
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


@dataclass
class Halves:
    """The two new anchors, and what undoes the rewrite."""

    first: fx.Node
    second: fx.Node
    added: list[fx.Node]  # in graph order
    moved: list[tuple[fx.Node, fx.Node]]  # (chunk, the node that took over its users)

    def undo(self, graph: fx.Graph) -> None:
        for chunk, new in self.moved:
            new.replace_all_uses_with(chunk)
        for node in reversed(self.added):
            graph.erase_node(node)


def _split_of(anchor: fx.Node) -> tuple[fx.Node | None, fx.Node, int] | None:
    """(the reshape between, the split, the half width) when the anchor's output, directly
    or through one reshape that keeps its last dim, is only split into two equal halves of
    its last dim."""
    out = val(anchor)
    if out is None or len(anchor.users) != 1:
        return None
    (user,) = anchor.users
    view = None
    if user.op == "call_function" and user.target in VIEWS:
        uv = val(user)
        if uv is None or not same(uv.shape[-1], out.shape[-1]) or len(user.users) != 1:
            return None
        view, (user,) = user, tuple(user.users)
    if user.op != "call_function" or user.target not in SPLITS:
        return None
    src = val(user.args[0])  # type: ignore[arg-type]
    dim = user.args[2] if len(user.args) > 2 else user.kwargs.get("dim", 0)
    if src is None or dim not in (-1, src.dim() - 1) or not isinstance(src.shape[-1], int):
        return None
    width, sizes = src.shape[-1], user.args[1]
    equal = sizes == width // 2 if user.target is aten.split.Tensor else list(sizes) == [width // 2] * 2  # type: ignore[arg-type]
    if width % 2 or not equal:
        return None
    if not all(u.op == "call_function" and u.target is operator.getitem for u in user.users):
        return None
    return view, user, width // 2


def _operands(anchor: fx.Node, op: str) -> tuple[object, object, object, tuple, dict] | None:
    """(bias, A, B, the arguments after B, the keywords) of an anchor whose halves are made
    alike, or None: addmm's alpha/beta and grouped_mm's bias and out_dtype are left alone."""
    if op == "mm":
        return None, anchor.args[0], anchor.args[1], (), {}
    if op == "addmm":
        return None if anchor.args[3:] or anchor.kwargs else (*anchor.args[:3], (), {})
    if op == "grouped_mm" and not anchor.args[3:] and set(anchor.kwargs) <= {"offs"}:
        return None, anchor.args[0], anchor.args[1], tuple(anchor.args[2:]), dict(anchor.kwargs)
    return None


def split_halves(graph: fx.Graph, anchor: fx.Node) -> Halves | None:
    """Rewrite a concatenated mm/addmm/grouped_mm anchor into its two halves (see the
    module), or None when ``anchor`` is not one."""
    op = ANCHORS.get(anchor.target)  # type: ignore[arg-type]
    operands = None if op is None else _operands(anchor, op)
    found = None if operands is None else _split_of(anchor)
    if found is None:
        return None
    view, split, half = found
    bias, a, b, rest, kwargs = operands  # type: ignore[misc]
    bv = val(b)
    if bv is None or not isinstance(bias, (fx.Node, type(None))):
        return None
    if bias is not None and (val(bias) is None or val(bias).dim() != 1):  # type: ignore[union-attr]
        return None
    chunks = {u.args[1]: u for u in split.users}
    fake = fake_mode_of(val(anchor))
    added: list[fx.Node] = []

    def add(target: object, args: tuple, kwargs: dict | None = None) -> fx.Node:
        # symbolic sizes: their SymInts
        values, kw = fx.node.map_arg((args, kwargs or {}), lambda n: n.meta["val"])
        with fake:
            value = target(*values, **kw)  # type: ignore[operator]
        node = graph.call_function(target, args, kwargs)  # type: ignore[arg-type]
        node.meta["val"] = value
        added.append(node)
        return node

    anchors, moved = [], []
    with graph.inserting_after(split):
        for i in (0, 1):
            lo, hi = i * half, (i + 1) * half
            b_half = add(aten.slice.Tensor, (b, bv.dim() - 1, lo, hi))  # N: B's last dim
            if bias is None:
                target = anchor.target if op == "grouped_mm" else aten.mm.default
                mm = add(target, (a, b_half, *rest), kwargs)
            else:
                mm = add(aten.addmm.default, (add(aten.slice.Tensor, (bias, 0, lo, hi)), a, b_half))
            anchors.append(mm)
            chunk = chunks.get(i)
            if chunk is None:
                continue
            new = mm if view is None else add(aten.reshape.default, (mm, [*view.args[1][:-1], half]))  # type: ignore[index]
            chunk.replace_all_uses_with(new)
            moved.append((chunk, new))
    cursor = split  # in order of creation, right after the split
    for node in added:
        cursor.append(node)
        cursor = node
    return Halves(anchors[0], anchors[1], added, moved)
