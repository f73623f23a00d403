"""What the grouped kinds are checked and timed against: the float64 reference (each expert's rows
times its weight, the routing's gather and scatter applied), the eager baseline
(torch._grouped_mm where it runs, else a loop over the experts), and the random inputs,
offsets and routing the tuner and the tests draw.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from epilab.ir import dtypes
from epilab.ir.problem import Problem
from epilab.templates.gemm.matmul_reference import random_tensor
from epilab.templates.grouped.grouped_geometry import (
    GATHER,
    OFFS,
    SCATTER,
    geometry_of,
    output_rows,
)


def expert_of_rows(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """The expert of each of ``rows`` rows, the offsets read as the kernel reads them (the
    last expert's for rows past every group)."""
    ends = torch.cummax(offs.long().clamp(0, rows), 0).values
    return torch.searchsorted(ends, torch.arange(rows, device=offs.device), right=True).clamp(
        max=len(offs) - 1
    )


def per_row(t: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """An epilogue operand broadcast to [E, T, N], as a tensor that broadcasts to [T, N]: one
    per expert ([E, 1, N], [E, 1, 1]) taken at each row's expert."""
    if t.dim() == 3:
        return t[experts][:, 0] if t.shape[0] > 1 else t[0]
    return t


def _evaluate(
    problem: Problem,
    acc: torch.Tensor,
    acc2: torch.Tensor | None,
    operands: Mapping[str, torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    """The epilogue on [T, N] accumulators, each operand at its rows' experts."""
    experts = expert_of_rows(operands[OFFS], acc.shape[0])
    rest = {
        name: per_row(t, experts) for name, t in operands.items() if name in dict(problem.epilogue.operands)
    }
    return problem.epilogue.evaluate(acc, rest, acc2=acc2)


def _outputs(
    problem: Problem,
    acc: torch.Tensor,
    acc2: torch.Tensor | None,
    operands: Mapping[str, torch.Tensor],
    strict: bool = True,
) -> tuple[torch.Tensor, ...]:
    """The epilogue's outputs, their rows stored or added where the problem scatters them
    (``strict``: an index outside the output's rows dropped, as the kernel drops it; else
    the indices are torch's own, as a model passes them)."""
    values = _evaluate(problem, acc, acc2, operands)
    how = geometry_of(problem).scatter
    if not how:
        return values
    rows = output_rows(problem, acc.shape[0])
    index = operands[SCATTER].long()
    keep = (index >= 0) & (index < rows) if strict else None  # no work in the timed baseline
    outs = []
    kept = index if keep is None else index[keep]
    for v in values:
        o = v.new_zeros((rows, *v.shape[1:]))
        v = v if keep is None else v[keep]
        if how == "add":
            o.index_add_(0, kept, v)
        else:
            o[kept] = v
        outs.append(o)
    return tuple(outs)


def gathered(
    problem: Problem, a: torch.Tensor, operands: Mapping[str, torch.Tensor], strict: bool = True
) -> torch.Tensor:
    """A's rows as the groups read them: rows ``gather[m]`` of ``a`` where the problem gathers
    them (``strict``: zeros for an index outside ``a``'s rows, as the kernel reads them; else
    ``a[gather]``, as a model gathers them)."""
    if not geometry_of(problem).gather:
        return a
    index = operands[GATHER]
    if not strict:
        return a[index]
    keep = (index >= 0) & (index < a.shape[0])
    if a.shape[0] == 0:
        return a.new_zeros((index.shape[0], a.shape[1]))
    return torch.where(keep[:, None], a[index.long().clamp(0, a.shape[0] - 1)], 0)


def row_ranges(offs: torch.Tensor, rows: int) -> list[tuple[int, int]]:
    """Each expert's rows [start, end) as the kernel reads the offsets: clamped to [0, rows],
    each group starting where the furthest before it ended (reads them on the host)."""
    ranges, start = [], 0
    for end in offs.tolist():
        end = max(start, min(max(end, 0), rows))
        ranges.append((start, end))
        start = end
    return ranges


def grouped_products(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Each expert's rows of ``a`` times its ``b`` at ``dtype`` (a loop over the experts)."""
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=dtype, device=a.device)
    for e, (lo, hi) in enumerate(row_ranges(offs, a.shape[0])):
        if hi > lo:
            out[lo:hi] = a[lo:hi].to(dtype) @ b[e].to(dtype)
    return out


def grouped_reference(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs in float64, before output rounding (a second weight ``b2`` where the kind
    has one; rows gathered and scattered where the problem routes them)."""
    a = gathered(problem, a, operands)
    acc = grouped_products(a, b, operands[OFFS], torch.float64)
    acc2 = grouped_products(a, operands["b2"], operands[OFFS], torch.float64) if "b2" in operands else None
    return _outputs(problem, acc, acc2, operands)


def library_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm`` (CUTLASS on Hopper), or the loop over the experts for what it does
    not take (fp32 and fp16 inputs on torch 2.11; strides it refuses)."""
    try:
        return torch._grouped_mm(a, b, offs=offs)
    except (RuntimeError, TypeError):
        return grouped_products(a, b, offs, a.dtype)


def eager_grouped(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The unfused baseline: a routed problem's gathered copy of A, ``torch._grouped_mm``
    (twice for a dual problem), then the epilogue in eager torch, each per-expert operand
    gathered at its rows, and the rows' scatter (``index_add_`` for the combine)."""
    offs = operands[OFFS]
    a = gathered(problem, a, operands, strict=False)
    acc = library_grouped_mm(a, b, offs)
    acc2 = library_grouped_mm(a, operands["b2"], offs) if "b2" in operands else None
    return _outputs(problem, acc, acc2, operands, strict=False)


def draw_offsets(rows: int, experts: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """Offsets of ``rows`` rows routed to ``experts`` experts as a router skews them: each
    expert's share drawn from a flat Dirichlet (normalised exponentials), then the rows
    multinomially; experts may get none. Every row is routed (offs[-1] = rows)."""
    share = -torch.log(torch.rand(experts, generator=gen, device=device).clamp_min(1e-12))
    picks = (
        torch.multinomial(share, rows, replacement=True, generator=gen) if rows else share.new_zeros(0).long()
    )
    counts = torch.bincount(picks, minlength=experts)
    return torch.cumsum(counts, 0).to(torch.int32)


def draw_routing(
    tokens: int, experts: int, topk: int, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's choice for ``tokens`` tokens: ``topk`` distinct experts each, drawn by skewed
    shares (a flat Dirichlet, as ``draw_offsets``); returns the offsets of the rows sorted by
    expert and each sorted row's place in token order (token x topk + slot: its token is
    that // topk), as ``argsort`` gives them to serving code."""
    share = -torch.log(torch.rand(experts, generator=gen, device=device).clamp_min(1e-12))
    if tokens == 0:
        return torch.zeros(experts, dtype=torch.int32, device=device), share.new_zeros(0).long()
    chosen = torch.multinomial(share.expand(tokens, experts), topk, replacement=False, generator=gen)
    order = torch.argsort(chosen.flatten(), stable=True)
    counts = torch.bincount(chosen.flatten(), minlength=experts)
    return torch.cumsum(counts, 0).to(torch.int32), order


def grouped_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, B and operands of the problem, and skewed offsets (``draw_offsets``): row
    vectors one per expert ([E, 1, N]), column vectors one per row ([T, 1]). A routed
    problem's rows come from ``draw_routing`` (A the tokens' rows where they are gathered)."""
    s, g = problem.shape, geometry_of(problem)
    e, t, n, k = g.experts, int(s.m), int(s.n), int(s.k)
    dtype = dtypes.torch_dtype(problem.dtype)
    b = random_tensor(k, n, e, problem.layout_b, dtype, device, gen)
    operands: dict[str, torch.Tensor] = {}
    if g.routed:
        if t % g.topk:  # a bucket's shape (compiler/decide.py) has any rows: its calls do not
            raise ValueError(f"a routed GEMM's rows are tokens x topk: {t} rows, topk {g.topk}")
        offs, order = draw_routing(t // g.topk, e, g.topk, device, gen)
        token = (order // g.topk).to(torch.int32)
        if g.gather:
            operands[GATHER] = token
        if g.scatter:
            operands[SCATTER] = token if g.scatter == "add" else order.to(torch.int32)
    else:
        offs = draw_offsets(t, e, device, gen)
    a = random_tensor(t // g.topk if g.gather else t, k, None, problem.layout_a, dtype, device, gen)
    broadcasts = dict(problem.epilogue.operands)
    operands[OFFS] = offs
    for spec in problem.operands:
        odt, broadcast = dtypes.torch_dtype(spec.dtype), broadcasts[spec.name]
        if broadcast == "row":
            operands[spec.name] = random_tensor(1, n, e, "row", odt, device, gen)
        elif broadcast == "col":
            operands[spec.name] = random_tensor(t, 1, None, "row", odt, device, gen)
        elif broadcast == "scalar":
            operands[spec.name] = random_tensor(1, 1, None, "row", odt, device, gen)[0]
        else:
            operands[spec.name] = random_tensor(t, n, None, spec.layout, odt, device, gen)
    return a, b, operands
