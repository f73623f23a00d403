"""``epilab.grouped_matmul``: a mixture of experts' projection (or its gated pair) in one
grouped GEMM with its epilogue fused, for users and tests.

    act(a @ b[e] + bias[e]) * scale                       (per row m of expert e)
    act(a @ b[e] + bias[e]) * (a @ b2[e] + bias2[e]) * scale   (with ``b2``: the gated MLP)
    or any IR epilogue

Builds the epilogue (cached per signature), the problem, a default config when none is given,
and launches the grouped template (grouped_matmul, or dual_grouped_matmul with ``b2``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import torch

from epilab.api.matmul import ACTIVATIONS, _refuse_grad, _run
from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, Expr, acc, acc2, operand, ops
from epilab.templates.grouped.dual_grouped_matmul import B2, make_dual_grouped_problem
from epilab.templates.grouped.grouped_geometry import GATHER, SCATTER
from epilab.templates.grouped.grouped_matmul import OFFS, check_routing, check_tensors, make_grouped_problem


def grouped_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    *,
    b2: torch.Tensor | None = None,
    activation: str | None = None,
    bias: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    epilogue: Epilogue | None = None,
    operands: Mapping[str, torch.Tensor] | None = None,
    gather: torch.Tensor | None = None,
    scatter: torch.Tensor | None = None,
    combine: str | None = None,
    topk: int | None = None,
    config: Config | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Each expert's rows of ``a`` times its own ``b``, with the epilogue fused.

    ``a``: [T, K], the rows routed to expert 0, then those routed to expert 1, ...; ``b``:
    [E, K, N] (experts' [E, N, K] weights as ``w.transpose(-1, -2)``); ``offs``: int32 [E],
    the cumulative row ends (as ``torch._grouped_mm`` takes them: expert e has rows
    ``offs[e-1] <= m < offs[e]``), read on the device and clamped to [0, T]; rows at or past
    ``offs[-1]`` are left unwritten. bf16, fp16 or fp32 (IEEE) inputs.

    ``bias``: [N] (shared) or [E, N] (one per expert); ``activation``: relu, gelu, gelu_tanh,
    silu, sigmoid or tanh; ``scale``: [T] or [T, 1], each row's factor, applied last (an MoE's
    routing weight). With ``b2`` (B's shape and strides) the result is the gated MLP
    ``act(a @ b + bias) * (a @ b2 + bias2)`` (activation silu unless given: SwiGLU), each A
    tile read once. For any other epilogue pass ``epilogue`` (reading ``acc``, and ``acc2``
    with ``b2``) and the tensors it reads as ``operands`` (per expert: [E, 1, N]). Inference
    only, as ``epilab.matmul``.

    Routing in the kernel (a mixture of experts without its permuted copies): ``gather``
    (int32/int64 [T]) makes ``a`` the tokens' activations [T / topk, K] and row m of the
    grouped rows ``a[gather[m]]``; ``scatter`` (int32/int64 [T]) sends output row m to row
    ``scatter[m]``: ``combine="add"`` (the default) adds it there, the top-k combine
    ``out[token] += y`` into a zeroed [T / topk, N] output (atomics: with three or more rows
    a token their order, and the sum's last bit, is not fixed); ``combine="store"`` writes it
    there ([T, N]; each row once, deterministic; sum the k rows of a token after). ``topk``
    (rows per token) is the gather's rows over ``a``'s; without a gather, "add" needs it.
    ``scale`` and other per-row operands stay in the grouped rows' order. An index outside
    the rows it indexes reads zeros (gather) or is dropped (scatter).
    """
    e, _, n, _ = check_tensors(a, b, offs)
    if combine is not None and scatter is None:
        raise ValueError("combine= says how scatter= rows are written: pass scatter too")
    routing = {
        "gather": gather,
        "scatter": scatter,
        "combine": (combine or "add") if scatter is not None else "",
        "topk": topk,
    }
    if routing["combine"] not in ("", "store", "add"):
        raise ValueError(f"combine is 'add' or 'store', got {combine!r}")
    _, t = check_routing(e, a, **routing)  # type: ignore[arg-type]
    inputs = {"a": a, "b": b, "b2": b2, "bias": bias, "bias2": bias2, "scale": scale, **(operands or {})}
    _refuse_grad("grouped_matmul", inputs)
    if bias2 is not None and b2 is None:
        raise ValueError("bias2 is the second projection's bias: pass b2 too")
    if epilogue is not None:
        given = (bias, bias2, scale, activation, out_dtype)
        if any(x is not None for x in given):
            raise ValueError(
                "pass either epilogue= (with operands=) or activation/bias/bias2/scale/out_dtype"
            )
        tensors = dict(operands or {})
    else:
        if operands:
            raise ValueError("operands= is only used together with epilogue=")
        epilogue, tensors = _simple_epilogue(a, b2, e, n, t, activation, bias, bias2, scale, out_dtype)
    indices = {GATHER: gather, SCATTER: scatter}
    calls = {OFFS: offs, **{name: x for name, x in indices.items() if x is not None}, **tensors}
    if b2 is None:
        problem = make_grouped_problem(a, b, offs, epilogue, tensors, **routing)  # type: ignore[arg-type]
        return _run(problem, config, a, b, calls)
    problem = make_dual_grouped_problem(a, b, b2, offs, epilogue, tensors, **routing)
    return _run(problem, config, a, b, {B2: b2, **calls})


def _simple_epilogue(
    a: torch.Tensor,
    b2: torch.Tensor | None,
    e: int,
    n: int,
    t: int,
    activation: str | None,
    bias: torch.Tensor | None,
    bias2: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> tuple[Epilogue, dict[str, torch.Tensor]]:
    """The epilogue ``grouped_matmul(..., activation=, bias=, ...)`` runs, and its operand
    tensors (``e`` experts, ``n`` columns, ``t`` grouped rows)."""
    if activation is None and b2 is not None:
        activation = "silu"
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    tensors: dict[str, torch.Tensor] = {}
    for name, x in (("bias", bias), ("bias2", bias2)):
        if x is not None:
            tensors[name] = _per_expert_bias(name, x, e, n)
    if scale is not None:
        tensors["scale"] = _per_row_scale(scale, t)
    dtype = dtypes.name_of(out_dtype if out_dtype is not None else a.dtype)
    epilogue = _build(
        activation, bias is not None, b2 is not None, bias2 is not None, scale is not None, dtype
    )
    return epilogue, tensors


def _per_expert_bias(name: str, x: object, experts: int, n: int) -> torch.Tensor:
    """A bias of [N] (shared) or [E, N] (per expert) as the kernel reads it: [N] or [E, 1, N]."""
    if isinstance(x, torch.Tensor) and tuple(x.shape) == (n,):
        return x
    if isinstance(x, torch.Tensor) and tuple(x.shape) == (experts, n):
        return x.unsqueeze(1)
    raise ValueError(
        f"{name} must be [{n}] (shared) or [{experts}, {n}] (per expert), got {getattr(x, 'shape', x)!r}"
    )


def _per_row_scale(x: object, rows: int) -> torch.Tensor:
    if isinstance(x, torch.Tensor) and tuple(x.shape) in ((rows,), (rows, 1)):
        return x.reshape(rows, 1)
    raise ValueError(
        f"scale must be [{rows}] or [{rows}, 1] (one factor per row), got {getattr(x, 'shape', x)!r}"
    )


@lru_cache(maxsize=64)
def _build(
    activation: str | None, has_bias: bool, gated: bool, has_bias2: bool, has_scale: bool, dtype: str
) -> Epilogue:
    x: Expr = acc() + operand("bias", "row") if has_bias else acc()
    x = getattr(ops, activation)(x) if activation is not None else x
    if gated:
        x = x * (acc2() + operand("bias2", "row") if has_bias2 else acc2())
    x = x * operand("scale", "col") if has_scale else x
    return Epilogue.build([(x, dtype)])
