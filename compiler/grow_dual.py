"""Dual GEMMs: two mm/addmm anchors (or two grouped mms) over one A whose products meet in
a pointwise op (``silu(gate) * up``), grown as one group."""

from __future__ import annotations

import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS, VIEWS
from epilab.compiler.dequant import b_arg, block_dequantized, dequantized
from epilab.compiler.grow import PAIRED, NoGroup, same_shape, val
from epilab.compiler.grow_matmul import MatmulGrower
from epilab.ir.epilogue import ACCUMULATORS, Expr, acc, acc2


class DualGrower(MatmulGrower):
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
        bs = [b_arg(node) for node in (self.anchor, self.second)]
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
