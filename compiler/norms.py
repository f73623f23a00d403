"""RMSNorm folded into the GEMMs around it (inference, constant weights).

A decoder layer computes ``h = x + o_proj(...)``, then ``RMSNorm(h) @ W`` for each projection
that reads the norm (q/k/v, or gate/up). With ``rstd[m] = 1/sqrt(mean_n h[m, n]^2 + eps)``:

    RMSNorm(h) @ W = rstd[m] * (h @ (diag(g) W))

``fold_rms_norms`` rewrites the post-grad graph that way where every user of the normalised
tensor is such a projection whose weight is a constant of the graph (``get_attr``: Inductor's
``freezing``): ``g`` is folded into a new constant weight once, at compile time, and each
projection becomes ``mm(h, W') * rstd[m]`` (plus its bias). The matcher then grows the
statistic ``mean(h^2)`` into the producer's epilogue as a reduction output (``row_sum``:
``match.py``) and ``rstd[m]`` into each projection's epilogue as a column operand, so the
normalised tensor is never materialised and no norm kernel is left but the [M] ``rsqrt``.

Not rewritten: a norm whose output is used by anything else (a training forward saves it for
the backward), weights that are graph inputs (no ``freezing``: folding ``g`` would be a
[K, N] product every call), forms other than ``x * rsqrt(mean(x^2, -1) + eps)`` scaled by a
1-D weight (LayerNorm is not folded yet).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import VIEWS
from epilab.compiler.match import fake_mode_of, val

aten, prims = torch.ops.aten, torch.ops.prims
_CAST = prims.convert_element_type.default
_counter = itertools.count()


@dataclass(frozen=True)
class RMSNorm:
    """A matched RMSNorm: its input (before any fp32 upcast), the [..., 1] rstd node, the
    1-D weight constant, and the projections that read its output (mm/addmm over a view)."""

    h: fx.Node
    rstd: fx.Node
    weight: torch.Tensor
    consumers: tuple[fx.Node, ...]


def fold_rms_norms(graph: fx.Graph) -> int:
    """Fold every foldable RMSNorm of ``graph`` into its projections; how many were folded."""
    module = graph.owning_module
    if module is None:
        return 0
    folded = 0
    for node in list(graph.nodes):
        norm = _match(node, module)
        if norm is not None:
            _rewrite(graph, module, norm)
            folded += 1
    if folded:
        graph.eliminate_dead_code()
    return folded


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


def _match(mean: fx.Node, module: torch.nn.Module) -> RMSNorm | None:
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
    out = _only_user(scaled)  # type: ignore[arg-type]
    if _target(out, _CAST):
        out = _only_user(out)  # type: ignore[arg-type]
    if not _target(out, aten.mul.Tensor):
        return None
    others = [a for a in out.args if a is not _only_input(out)]  # type: ignore[union-attr]
    weight = _constant(others[0], module) if len(others) == 1 else None
    if weight is None or weight.dim() != 1:
        return None
    consumers = _projections(out, module)  # type: ignore[arg-type]
    if not consumers:
        return None
    return RMSNorm(h, rstd, weight, consumers)  # type: ignore[arg-type]


def _only_input(mul: fx.Node) -> fx.Node | None:
    """The argument of the weight multiply that carries the normalised values."""
    for a in mul.args:
        if isinstance(a, fx.Node) and a.op == "call_function":
            return a
    return None


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


def _rewrite(graph: fx.Graph, module: torch.nn.Module, norm: RMSNorm) -> None:
    """Each projection ``mm(view(norm), B) [+ bias]`` becomes
    ``(mm(view(h), B * g[:, None]) * rstd[m] [+ bias]).to(dtype)``."""
    fake = fake_mode_of(val(norm.h))

    def add(target: object, args: tuple) -> fx.Node:
        values = fx.node.map_arg(args, lambda n: n.meta["val"])
        with fake:
            value = target(*values)  # type: ignore[operator]
        node = graph.call_function(target, args)  # type: ignore[arg-type]
        node.meta["val"] = value
        return node

    for mm in norm.consumers:
        view = mm.args[0] if mm.target == aten.mm.default else mm.args[1]
        b = mm.args[1] if mm.target == aten.mm.default else mm.args[2]
        bv = _constant(b, module)
        assert bv is not None and isinstance(view, fx.Node)
        g = norm.weight.to(device=bv.device, dtype=torch.float32)
        weight = (bv.float() * g[:, None]).to(bv.dtype)  # B's layout kept (elementwise ops keep it)
        name = f"_epilab_rms_folded_{next(_counter)}"
        module.register_buffer(name, weight)
        dtype = val(mm).dtype  # type: ignore[union-attr]
        with graph.inserting_before(mm):
            w_node = graph.get_attr(name)
            from_tensor = getattr(fake, "from_tensor", None)
            w_node.meta["val"] = weight if from_tensor is None else from_tensor(weight, static_shapes=True)
            h2 = add(aten.reshape.default, (norm.h, list(view.args[1])))  # type: ignore[arg-type]
            product = add(aten.mm.default, (h2, w_node))
            rows = add(aten.reshape.default, (norm.rstd, [-1, 1]))
            scaled = add(aten.mul.Tensor, (product, rows))
            if mm.target == aten.addmm.default:
                scaled = add(aten.add.Tensor, (scaled, mm.args[0]))
            result = add(_CAST, (scaled, dtype))
        mm.replace_all_uses_with(result)
        graph.erase_node(mm)
