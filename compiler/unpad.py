"""A padded matmul seen as the matmul it pads (Inductor's ``pad_mm``).

Before the post-grad passes, Inductor may pad an mm, addmm or bmm whose sizes are not
multiples of the dtype's alignment (``config.shape_padding``; it decides by benchmarking
cuBLAS, so per machine and per run): its inputs go through ``constant_pad_nd`` (an addmm's
bias through a ``cat``), and the product is sliced back. The anchor the pass then sees has
the padded shape (a decode step's M of 4 becomes 8), and its slices hide the product from
the epilogue and dual-GEMM matchers.

``unpad`` rewrites each such anchor, tentatively, into the matmul of the unpadded inputs
(exact: the rows and columns the slices drop are never computed, and padding of K is zeros,
so the products are the same) and moves the slices' users onto it; ``Unpadded.undo``
restores the padded form where the anchor is left to ATen (cuBLAS keeps the padding
Inductor measured). The padded nodes stay in the graph meanwhile, marked ``PADDED``, for
the pass to skip; they are dead until restored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS
from epilab.compiler.grow import fake_mode_of, same, same_shape, val

aten = torch.ops.aten
PADDED = "epilab_padded"  # meta flag of an anchor replaced by its unpadded form
_PADDABLE = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1)}  # the ops pad_mm pads: A, B args


@dataclass
class Unpadded:
    """The unpadded anchor, and the last slice of the padded one whose users it took."""

    anchor: fx.Node
    padded: fx.Node
    sliced: fx.Node

    def undo(self, graph: fx.Graph) -> None:
        self.anchor.replace_all_uses_with(self.sliced)
        graph.erase_node(self.anchor)
        self.padded.meta.pop(PADDED, None)


def unpad(graph: fx.Graph) -> list[Unpadded]:
    """Rewrite every padded matmul anchor of ``graph`` into its unpadded form (see the module)."""
    done = []
    for node in list(graph.nodes):
        if node.op == "call_function" and ANCHORS.get(node.target) in _PADDABLE:  # type: ignore[arg-type]
            found = _unpad(graph, node)
            if found is not None:
                done.append(found)
    return done


def _unpad(graph: fx.Graph, anchor: fx.Node) -> Unpadded | None:
    op = ANCHORS[anchor.target]  # type: ignore[index]
    if anchor.kwargs or len(anchor.args) != (3 if op == "addmm" else 2):
        return None  # alpha/beta: left alone
    i_a, i_b = _PADDABLE[op]
    a, b = anchor.args[i_a], anchor.args[i_b]
    a0, a_pads = _source(a)
    b0, b_pads = _source(b)
    if a_pads is None and b_pads is None:
        return None
    av, bv, out = val(a0), val(b0), val(anchor)
    if av is None or bv is None or out is None:
        return None
    # K padded: the padded entries must be zeros on at least one side (pad_mm pads both)
    k_padded = not same(val(a).shape[-1], av.shape[-1])  # type: ignore[union-attr]
    if k_padded and not (_zero(a) or _zero(b)):
        return None
    want = [*av.shape[:-1], bv.shape[-1]]  # the unpadded product's shape
    sliced = _sliced_to(anchor, want)
    if sliced is None:
        return None
    args = list(anchor.args)
    args[i_a], args[i_b] = a0, b0
    if op == "addmm":
        bias = _bias(anchor.args[0], want)
        if bias is None:
            return None
        args[0] = bias
    fake = fake_mode_of(out)
    with fake:  # type: ignore[attr-defined]
        value = anchor.target(*fx.node.map_arg(tuple(args), lambda n: n.meta["val"]))  # type: ignore[operator]
    if not same_shape(value.shape, want):
        return None
    with graph.inserting_before(anchor):
        new = graph.call_function(anchor.target, tuple(args))  # type: ignore[arg-type]
    new.meta["val"] = value
    sliced.replace_all_uses_with(new)
    anchor.meta[PADDED] = True
    return Unpadded(new, anchor, sliced)


def _source(node: object) -> tuple[fx.Node | None, list[int] | None]:
    """The tensor a ``constant_pad_nd`` pads on the right only, and its pads; else the
    node itself and None."""
    if not isinstance(node, fx.Node):
        return None, None
    if node.op == "call_function" and node.target is aten.constant_pad_nd.default:
        pads = list(node.args[1])  # type: ignore[call-overload]
        if all(isinstance(p, int) and p >= 0 for p in pads) and not any(pads[0::2]):
            return node.args[0], pads  # type: ignore[return-value]
    return node, None


def _zero(node: object) -> bool:
    """Whether ``node`` is a ``constant_pad_nd`` that pads with zeros."""
    if not (isinstance(node, fx.Node) and node.target is aten.constant_pad_nd.default):
        return False
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    return value == 0


def _sliced_to(anchor: fx.Node, want: list[object]) -> fx.Node | None:
    """The end of the chain of ``slice`` ops (from 0, step 1), the anchor's only users,
    that cuts its output to ``want``; None if it is not one."""
    node = anchor
    while not same_shape(val(node).shape, want):  # type: ignore[union-attr]
        if len(node.users) != 1:
            return None
        (user,) = node.users
        if user.op != "call_function" or user.target is not aten.slice.Tensor:
            return None
        start = user.args[2] if len(user.args) > 2 else user.kwargs.get("start", 0)
        step = user.args[4] if len(user.args) > 4 else user.kwargs.get("step", 1)
        if start not in (0, None) or step != 1 or val(user) is None:
            return None
        node = user
    return None if node is anchor else node


def _bias(bias: object, want: list[object]) -> fx.Node | None:
    """An addmm's bias for the unpadded product: as it is where it broadcasts to ``want``;
    else the leading part of a ``cat`` (pad_mm's padding of it) that covers ``want`` along
    the cat's dim, looked for again inside (a bias padded along both dims)."""
    while isinstance(bias, fx.Node):
        bv = val(bias)
        if bv is None:
            return None
        shape = list(bv.shape)
        if _broadcasts(shape, want):
            return bias
        if bias.target is not aten.cat.default or len(shape) > len(want):
            return None
        first = bias.args[0][0]  # type: ignore[index]
        dim = (bias.args[1] if len(bias.args) > 1 else bias.kwargs.get("dim", 0)) % len(shape)  # type: ignore[operator]
        fv = val(first)
        if fv is None or not same(fv.shape[dim], want[len(want) - len(shape) + dim]):
            return None  # the leading part must cover the kept rows or columns, not broadcast
        bias = first
    return None


def _broadcasts(shape: list[object], want: list[object]) -> bool:
    pad = [1] * (len(want) - len(shape)) + shape
    return len(shape) <= len(want) and all(same(p, 1) or same(p, w) for p, w in zip(pad, want, strict=True))
