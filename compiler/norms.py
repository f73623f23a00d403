"""RMSNorm and LayerNorm folded into the GEMMs around them (inference, constant weights).

A decoder layer computes ``h = x + o_proj(...)``, then ``RMSNorm(h) @ W`` for each projection
that reads the norm (q/k/v, or gate/up). With ``rstd[m] = 1/sqrt(mean_n h[m, n]^2 + eps)``:

    RMSNorm(h) @ W = rstd[m] * (h @ (diag(g) W))

``fold_norms`` rewrites the post-grad graph that way where every user of the normalised
tensor is such a projection whose weight is a constant of the graph (``get_attr``: Inductor's
``freezing``): ``g`` is folded into a new constant weight once, at compile time, and each
projection becomes ``mm(h, W') * rstd[m]`` (plus its bias). The matcher then grows the
statistic ``mean(h^2)`` into the producer's epilogue as a reduction output (``row_sum``:
``match.py``) and ``rstd[m]`` into each projection's epilogue as a column operand, so the
normalised tensor is never materialised and no norm kernel is left but the [M] ``rsqrt``.

LayerNorm folds the same way with its mean and a rank-1 correction (``fold_norms``):

    LayerNorm(h) @ W + b = rstd[m] * (h @ W' - mean[m] * c[n]) + (beta @ W + b)[n]

with ``W' = diag(g) W`` (rounded to W's dtype), ``c[n] = sum_k W'[k, n]`` (of the rounded W',
so the mean cancels exactly) and ``beta @ W`` constants; its ``var_mean`` becomes
``mean(h)`` and ``mean(h^2) - mean(h)^2``, two row statistics the producer's epilogue takes
(in fp32: the variance loses precision where |mean| >> std, which pre-norm residual streams
do not show; Inductor's Welford is exact there). Each folded projection's product is flagged
``grow.UNROUNDED``: a template keeps its accumulator in fp32 through the correction (rounding
``h @ W'`` to bf16 before subtracting ``mean * c`` would lose what the mean cancels).

A fold pays only where its projections then run as templates (in front of an aten mm it is a
GEMM and more pointwise work than Inductor's norm kernel): the pass (``graph_pass.py``) folds
a copy of the graph first with ``dry=True`` (constants made as fake values: nothing computed
or registered), decides it, and folds in the real graph only the norms (``Folded.key``) whose
projections were all chosen.

Not rewritten: a norm whose output is used by anything else (a training forward saves it for
the backward; a post-norm block's residual stream is the norm's output), weights that are
graph inputs (no ``freezing``: folding ``g`` would be a [K, N] product every call), other
forms of the norms.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import VIEWS
from epilab.compiler.grow import UNROUNDED, fake_mode_of, val

aten, prims = torch.ops.aten, torch.ops.prims
_CAST = prims.convert_element_type.default
_counter = itertools.count()


@dataclass(frozen=True)
class Norm:
    """A matched norm: its input (before any fp32 upcast), the [..., 1] rstd node, the 1-D
    weight constant, and the projections that read its output (mm/addmm over a view); a
    LayerNorm's [..., 1] mean node and bias constant too."""

    h: fx.Node
    rstd: fx.Node
    weight: torch.Tensor
    consumers: tuple[fx.Node, ...]
    mean: fx.Node | None = None  # LayerNorm
    bias: torch.Tensor | None = None  # LayerNorm's beta (None: no bias)


@dataclass(frozen=True)
class Folded:
    """A folded norm: its key (the names of its input and rstd nodes, the same in a copy of
    the graph) and the new projection products (the anchors its projections became)."""

    key: str
    products: tuple[fx.Node, ...]


def fold_norms(
    graph: fx.Graph, only: set[str] | None = None, dry: bool = False, module: torch.nn.Module | None = None
) -> list[Folded]:
    """Fold the foldable RMSNorms and LayerNorms of ``graph`` (those keyed in ``only``, or
    all) into their projections; ``module`` holds its constants (default: its owning
    module). ``dry``: the folded weights and their sums are fake values of their shapes (a
    trial on a copy of the graph: nothing is computed or registered)."""
    module = module if module is not None else graph.owning_module
    if module is None:
        return []
    folded = []
    for node in list(graph.nodes):
        if node.graph is not graph or node not in graph.nodes:
            continue
        norm = _match(node, module, only) or _match_layer_norm(graph, node, module, only)
        if norm is not None:
            folded.append(Folded(_key(norm.h, norm.rstd), _rewrite(graph, module, norm, dry)))
    if folded:
        graph.eliminate_dead_code()
    return folded


def _key(h: fx.Node, rstd: fx.Node) -> str:
    return f"{h.name}/{rstd.name}"


def _target(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _constant(node: object, module: torch.nn.Module) -> torch.Tensor | None:
    """The value of a constant of the graph: a ``get_attr`` tensor, or a permute of one."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "get_attr":
        t = getattr(module, str(node.target), None)
        return t if isinstance(t, torch.Tensor) else None
    if _target(node, aten.permute.default):
        base = _constant(node.args[0], module)
        return None if base is None else base.permute(*node.args[1])  # type: ignore[misc]
    return None


def _match(mean: fx.Node, module: torch.nn.Module, only: set[str] | None = None) -> Norm | None:
    """``mean(x32^2, [-1], keepdim) -> + eps -> rsqrt -> x32 * rstd -> [cast] -> * g`` whose
    output only feeds mm/addmm projections with constant weights (through views)."""
    if not _target(mean, aten.mean.dim) or len(mean.args) < 3 or not mean.args[2]:
        return None
    src = val(mean.args[0])
    if src is None or list(mean.args[1]) not in ([-1], [src.dim() - 1]):  # type: ignore[call-overload]
        return None
    square = mean.args[0]
    squares = (_target(square, aten.pow.Tensor_Scalar) and square.args[1] == 2) or (  # type: ignore[union-attr]
        _target(square, aten.mul.Tensor) and square.args[0] is square.args[1]  # type: ignore[union-attr]
    )
    if not squares:
        return None
    x32 = square.args[0]  # type: ignore[union-attr]
    v32 = val(x32)
    if not isinstance(x32, fx.Node) or v32 is None or v32.dtype != torch.float32:
        return None
    h = x32.args[0] if _target(x32, _CAST) else x32
    add = _only_user(mean)
    if not _target(add, aten.add.Scalar, aten.add.Tensor) or not isinstance(add.args[1], float):  # type: ignore[union-attr]
        return None
    rstd = _only_user(add)  # type: ignore[arg-type]
    if not _target(rstd, aten.rsqrt.default):
        return None
    scaled = _only_user(rstd)  # type: ignore[arg-type]
    if not _target(scaled, aten.mul.Tensor) or set(scaled.args) != {x32, rstd}:  # type: ignore[union-attr]
        return None
    affine = _affine(scaled, module)  # type: ignore[arg-type]
    if affine is None or affine[1] is not None:
        return None
    weight, _, consumers = affine
    if only is not None and _key(h, rstd) not in only:  # type: ignore[arg-type]
        return None
    return Norm(h, rstd, weight, consumers)  # type: ignore[arg-type]


def _affine(
    scaled: fx.Node, module: torch.nn.Module
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[fx.Node, ...]] | None:
    """After the normalised values ``scaled``: ``[cast] -> * g [-> + beta] [-> cast]`` with 1-D
    constants, whose result only feeds projections; (g, beta or None, the projections)."""
    out = _only_user(scaled)
    if _target(out, _CAST):
        out = _only_user(out)  # type: ignore[arg-type]
    weight = _operand_constant(out, scaled, aten.mul.Tensor, module)
    if weight is None:
        return None
    beta = None
    after = _only_user(out)  # type: ignore[arg-type]
    if after is not None:
        beta = _operand_constant(after, out, aten.add.Tensor, module)  # type: ignore[arg-type]
        if beta is not None:
            out = after
            if _target(_only_user(out), _CAST):  # type: ignore[arg-type]
                out = _only_user(out)  # type: ignore[arg-type]
    consumers = _projections(out, module)  # type: ignore[arg-type]
    if not consumers or weight.dim() != 1 or (beta is not None and beta.shape != weight.shape):
        return None
    return weight, beta, consumers


def _operand_constant(
    node: object, value: fx.Node, target: object, module: torch.nn.Module
) -> torch.Tensor | None:
    """The constant ``node`` (an op ``target``) combines with the chain through ``value`` (the
    chain may pass a cast between them), or None."""
    if not _target(node, target) or len(node.args) != 2 or node.kwargs:  # type: ignore[union-attr]
        return None
    chain = {value, *value.users}
    others = [a for a in node.args if a not in chain]  # type: ignore[union-attr]
    return _constant(others[0], module) if len(others) == 1 else None


def _match_layer_norm(
    graph: fx.Graph, var_mean: fx.Node, module: torch.nn.Module, only: set[str] | None = None
) -> Norm | None:
    """``var_mean(x32, [-1], correction=0, keepdim) -> (x32 - mean) * rsqrt(var + eps) -> * g
    [-> + beta]`` whose output only feeds projections with constant weights; its var_mean is
    replaced by two means (row statistics a producer's epilogue can compute)."""
    if not _target(var_mean, aten.var_mean.correction) or var_mean.kwargs.get("correction") != 0:
        return None
    if not var_mean.kwargs.get("keepdim") or len(var_mean.args) != 2:
        return None
    x32 = var_mean.args[0]
    v32 = val(x32)
    if not isinstance(x32, fx.Node) or v32 is None or v32.dtype != torch.float32:
        return None
    if list(var_mean.args[1]) not in ([-1], [v32.dim() - 1]):  # type: ignore[call-overload]
        return None
    items = {u.args[1]: u for u in var_mean.users if u.target is operator.getitem}
    if set(items) != {0, 1} or len(var_mean.users) != 2:
        return None
    var, mean = items[0], items[1]
    add = _only_user(var)
    if not _target(add, aten.add.Scalar, aten.add.Tensor) or not isinstance(add.args[1], float):  # type: ignore[union-attr]
        return None
    rstd = _only_user(add)  # type: ignore[arg-type]
    centred = _only_user(mean)
    if not _target(rstd, aten.rsqrt.default) or not _target(centred, aten.sub.Tensor):
        return None
    if centred.args != (x32, mean):  # type: ignore[union-attr]
        return None
    scaled = _only_user(centred)  # type: ignore[arg-type]
    if not _target(scaled, aten.mul.Tensor) or set(scaled.args) != {centred, rstd}:  # type: ignore[union-attr]
        return None
    if _only_user(rstd) is not scaled:  # type: ignore[arg-type]
        return None
    affine = _affine(scaled, module)  # type: ignore[arg-type]
    if affine is None:
        return None
    weight, beta, consumers = affine
    h = x32.args[0] if _target(x32, _CAST) else x32
    if only is not None and _key(h, rstd) not in only:  # type: ignore[arg-type]
        return None  # left as it is: var_mean (Welford) kept
    mean_node, var_node = _two_means(graph, var_mean, x32)
    mean.replace_all_uses_with(mean_node)
    var.replace_all_uses_with(var_node)
    return Norm(h, rstd, weight, consumers, mean_node, beta)  # type: ignore[arg-type]


def _two_means(graph: fx.Graph, var_mean: fx.Node, x32: fx.Node) -> tuple[fx.Node, fx.Node]:
    """``mean(x)`` and ``max(mean(x^2) - mean(x)^2, 0)`` in place of ``var_mean(x)``."""
    fake = fake_mode_of(val(x32))
    dims = list(var_mean.args[1])  # type: ignore[call-overload]
    with graph.inserting_before(var_mean.next):  # in order of creation
        mean = _add(graph, fake, aten.mean.dim, (x32, dims, True))
        square = _add(graph, fake, aten.mul.Tensor, (x32, x32))
        mean_sq = _add(graph, fake, aten.mean.dim, (square, dims, True))
        var = _add(graph, fake, aten.sub.Tensor, (mean_sq, _add(graph, fake, aten.mul.Tensor, (mean, mean))))
        var = _add(graph, fake, aten.clamp_min.default, (var, 0.0))
    return mean, var


def _add(graph: fx.Graph, fake: object, target: object, args: tuple) -> fx.Node:
    """A new call of ``target`` at the insertion point, with its fake value."""
    values = fx.node.map_arg(args, lambda n: n.meta["val"])
    with fake:  # type: ignore[attr-defined]
        value = target(*values)  # type: ignore[operator]
    node = graph.call_function(target, args)  # type: ignore[arg-type]
    node.meta["val"] = value
    return node


def _projections(out: fx.Node, module: torch.nn.Module) -> tuple[fx.Node, ...]:
    """The mm/addmm nodes that read ``out`` (through one view each) as A with a constant B;
    empty unless every use of ``out`` is one."""
    found = []
    for view in out.users:
        if not _target(view, *VIEWS):
            return ()
        for mm in view.users:
            if _target(mm, aten.mm.default) and mm.args[0] is view:
                b = mm.args[1]
            elif _target(mm, aten.addmm.default) and mm.args[1] is view and len(mm.args) == 3:
                if mm.kwargs:  # beta or alpha
                    return ()
                b = mm.args[2]
            else:
                return ()
            bv = _constant(b, module)
            if bv is None or bv.dim() != 2:
                return ()
            found.append(mm)
    return tuple(found)


def _rewrite(graph: fx.Graph, module: torch.nn.Module, norm: Norm, dry: bool = False) -> tuple[fx.Node, ...]:
    """Each projection ``mm(view(norm), B) [+ bias]`` becomes
    ``(mm(view(h), B * g[:, None]) * rstd[m] [+ bias]).to(dtype)``; for a LayerNorm
    ``((mm(view(h), W') - mean[m] * c[n]) * rstd[m] + (beta @ B)[n] [+ bias]).to(dtype)``.
    Returns the new products (mm nodes); ``dry``: constants are fake values (``fold_norms``)."""
    fake = fake_mode_of(val(norm.h))

    def add(target: object, args: tuple) -> fx.Node:
        return _add(graph, fake, target, args)

    def constant(t: torch.Tensor) -> fx.Node:
        name = f"_epilab_norm_folded_{next(_counter)}"
        if not dry:
            module.register_buffer(name, t)
        node = graph.get_attr(name)
        from_tensor = getattr(fake, "from_tensor", None)
        node.meta["val"] = t if from_tensor is None else from_tensor(t, static_shapes=True)
        return node

    products = []
    for mm in norm.consumers:
        view = mm.args[0] if mm.target == aten.mm.default else mm.args[1]
        b = mm.args[1] if mm.target == aten.mm.default else mm.args[2]
        bv = _constant(b, module)
        assert bv is not None and isinstance(view, fx.Node)
        g = norm.weight.to(device=bv.device, dtype=torch.float32)
        # B's layout kept (elementwise ops keep it); a dry run takes B's shape, dtype and layout
        weight = bv if dry else (bv.float() * g[:, None]).to(bv.dtype)
        columns = torch.empty(bv.shape[1], dtype=torch.float32, device=bv.device)  # a dry [N] constant
        dtype = val(mm).dtype  # type: ignore[union-attr]
        with graph.inserting_before(mm):
            h2 = add(aten.reshape.default, (norm.h, list(view.args[1])))  # type: ignore[arg-type]
            product = add(aten.mm.default, (h2, constant(weight)))
            product.meta[UNROUNDED] = True
            products.append(product)
            scaled = product
            if norm.mean is not None:  # the rank-1 correction: the mean times W''s column sums
                means = add(aten.reshape.default, (norm.mean, [-1, 1]))
                sums = constant(columns if dry else weight.float().sum(0))
                scaled = add(aten.sub.Tensor, (scaled, add(aten.mul.Tensor, (means, sums))))
            rows = add(aten.reshape.default, (norm.rstd, [-1, 1]))
            scaled = add(aten.mul.Tensor, (scaled, rows))
            if norm.bias is not None:
                shift = columns if dry else norm.bias.to(device=bv.device, dtype=torch.float32) @ bv.float()
                scaled = add(aten.add.Tensor, (scaled, constant(shift)))
            if mm.target == aten.addmm.default:
                scaled = add(aten.add.Tensor, (scaled, mm.args[0]))
            result = add(_CAST, (scaled, dtype))
        mm.replace_all_uses_with(result)
        graph.erase_node(mm)
    return tuple(products)
