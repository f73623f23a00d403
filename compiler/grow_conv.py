"""The convolution's grower: operands per output channel, scalars and whole tensors; a
channels-last permute and a LayerNorm over the channels may join."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import Unsupported
from epilab.compiler.grow import (
    ANCHOR_DTYPES,
    Grower,
    NoGroup,
    Operand,
    expr_of,
    is_static,
    same,
    same_shape,
    val,
)
from epilab.ir import dtypes
from epilab.ir.epilogue import Epilogue, Expr, acc, operand
from epilab.ir.problem import Problem
from epilab.templates.conv.conv_geometry import ConvGeometry, conv_problem
from epilab.templates.registry import default_template, template_hash


class ConvGrower(Grower):
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
        if not is_static(self.O[1:]) or not is_static(xv.shape[1:]):
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
            None if is_static(xv.shape[:1]) else expr_of(xv.shape[0]),
        )
