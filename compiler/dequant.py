"""fp8 inputs read through the graph's dequantize ops: a per-row or per-column scaled fp8
tensor (``dequantized``) and a block-scaled one (``block_dequantized``, 128-wide groups), so
that a matmul group reads the fp8 data and its scales, not the 16-bit product of them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS, VIEWS
from epilab.compiler.grow import (
    CONVERT,
    FP8_DTYPES,
    OPERAND_DTYPES,
    aten,
    expr_of,
    is_static,
    same,
    same_shape,
    val,
)


def block_scales(
    av: torch.Tensor, bv: torch.Tensor, sa: torch.Tensor | None, sb: torch.Tensor | None
) -> bool:
    """Whether a scaled mm's scales are block scales: A's [M, ceil(K/128)] and B's
    [ceil(K/128), ceil(N/128)] (``torch._scaled_mm``'s), not rowwise or tensorwise ones (shapes
    that read both ways, K and N of at most 128, are read as those: the same product)."""
    if sa is None or sb is None or sa.dim() != 2 or sb.dim() != 2:
        return False
    m, k, n = av.shape[-2], av.shape[-1], bv.shape[-1]
    if not is_static([k, n]):
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


def is_call(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def from_fp8(node: object) -> bool:
    """Whether ``node`` converts an fp8 tensor to a floating dtype."""
    if not is_call(node, CONVERT) or not isinstance(node.args[0], fx.Node):  # type: ignore[union-attr]
        return False
    source, out = val(node.args[0]), val(node)  # type: ignore[union-attr]
    return (
        source is not None and out is not None and source.dtype in FP8_DTYPES and out.dtype.is_floating_point
    )


def b_arg(anchor: fx.Node) -> fx.Node | None:
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
    if per == "row" and is_call(source, *VIEWS) and len(source.args) > 1:
        flat, whole = val(source), val(source.args[0])
        if flat is None or whole is None or flat.dim() != 2 or not same(flat.shape[-1], whole.shape[-1]):
            return None
        source, reshape = source.args[0], list(source.args[1])
    if (is_call(source, aten.permute.default) and list(source.args[1]) == [1, 0]) or is_call(
        source, aten.t.default
    ):
        source, permute = source.args[0], (1, 0)
    if is_call(source, CONVERT) and is_call(source.args[0], aten.mul.Tensor):
        source = source.args[0]  # the product rounded to the GEMM's dtype
    scale = None
    if is_call(source, aten.mul.Tensor):
        x, y = source.args[:2]
        source, scale = (x, y) if from_fp8(x) else (y, x)
    if not from_fp8(source) or (permute and per == "row"):
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
    while is_call(node, *VIEWS) or (is_call(node, CONVERT) and not from_fp8(node)):
        node = node.args[0]  # type: ignore[union-attr]
    return node


def _grouped_fp8(node: object) -> fx.Node | None:
    """The fp8 tensor of ``x8.to(float)`` viewed in groups, the view before the conversion or
    after it, or none (the tensor quantized in its groups); else None."""
    if is_call(node, *VIEWS) and from_fp8(node.args[0]):  # type: ignore[union-attr]
        return node.args[0].args[0]  # type: ignore[union-attr]
    if from_fp8(node):
        inner = node.args[0]  # type: ignore[union-attr]
        return inner.args[0] if is_call(inner, *VIEWS) else inner  # type: ignore[union-attr]
    return None


def block_dequantized(node: fx.Node, per: str) -> BlockDequantized | None:
    """``node`` as an fp8 tensor dequantized by block scales (``BlockDequantized``): ``per``
    "column" a linear layer's weight, transposed ([K, N] of an [N, K] weight, static, N and K
    multiples of 128); "row" an activation's rows ([M, K], K a static multiple of 128); else
    None."""
    top = node
    if per == "column":
        transposed = is_call(top, aten.permute.default) and list(top.args[1]) == [1, 0]  # type: ignore[union-attr]
        if not (transposed or is_call(top, aten.t.default)):
            return None
        top = top.args[0]  # type: ignore[assignment]
    product = _strip_views(top)
    tv, pv = val(top), val(product)
    if not is_call(product, aten.mul.Tensor) or tv is None or pv is None or tv.dim() != 2:
        return None
    k = tv.shape[-1]
    if not is_static([k]) or int(expr_of(k)) % BLOCK or pv.dim() < 2 or not same(pv.shape[-1], BLOCK):
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
        if (
            not is_static([n])
            or int(expr_of(n)) % BLOCK
            or xv.dim() != 2
            or not same_shape(xv.shape, tv.shape)
        ):
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
