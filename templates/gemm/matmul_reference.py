"""What a matmul kind is checked and timed against: the float64 reference, the random inputs the
tuner and the tests make (exactly a problem's shapes, dtypes and layouts), and the eager
baselines (cuBLAS through torch.matmul, cuBLASLt's scaled matmul for fp8) with the epilogue in
eager torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from epilab.ir import dtypes
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import (
    BATCHED_OPS,
    Problem,
)


def reference(
    epilogue: Epilogue, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The outputs computed in float64 (on the inputs' device), before output rounding."""
    acc64 = torch.matmul(a.double(), b.double())
    return epilogue.evaluate(acc64, {k: v.double() for k, v in operands.items()})


def random_tensor(
    rows: int,
    cols: int,
    batch: int | None,
    layout: str,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> torch.Tensor:
    """Random values of ``dtype`` [batch,] rows x cols in ``layout`` (col: a transposed
    view; strided: every other column of a twice-as-wide tensor)."""
    lead = () if batch is None else (batch,)
    if dtype == torch.bool:
        return torch.rand((*lead, rows, cols), generator=gen, device=device) > 0.5
    stored = {"col": (*lead, cols, rows), "strided": (*lead, rows, 2 * cols)}.get(layout, (*lead, rows, cols))
    t = torch.randn(stored, generator=gen, device=device).to(dtype)
    if layout == "col":
        return t.transpose(-1, -2)
    return t[..., ::2] if layout == "strided" else t


def matmul_inputs(
    problem: Problem, device: torch.device, gen: torch.Generator, *, b_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Random A, B and operands with exactly the problem's shapes, dtypes and layouts (B of
    ``b_dtype`` where given: a weight-only problem's)."""
    s = problem.shape
    dtype = dtypes.torch_dtype(problem.dtype)
    batch = int(s.batch) if problem.op in BATCHED_OPS or s.batch != 1 else None
    m, n, k = int(s.m), int(s.n), int(s.k)
    a = random_tensor(m, k, batch, problem.layout_a, dtype, device, gen)
    b = random_tensor(k, n, batch, problem.layout_b, b_dtype or dtype, device, gen)
    broadcasts = dict(problem.epilogue.operands)
    operands = {}
    for spec in problem.operands:
        odt, broadcast = dtypes.torch_dtype(spec.dtype), broadcasts[spec.name]
        if broadcast == "row":
            operands[spec.name] = random_tensor(1, n, None, "row", odt, device, gen)[0]
        elif broadcast == "col":
            operands[spec.name] = random_tensor(m, 1, None, "row", odt, device, gen)
        elif broadcast == "scalar":
            operands[spec.name] = random_tensor(1, 1, None, "row", odt, device, gen)[0]
        else:
            operands[spec.name] = random_tensor(m, n, batch, spec.layout, odt, device, gen)
    return a, b, operands


def eager_matmul(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """cuBLAS (torch.matmul; fp8: cuBLASLt's torch._scaled_mm) then the epilogue in eager torch."""
    if problem.dtype in dtypes.FP8_DTYPES:
        return eager_scaled_mm(problem, a, b, operands)
    return tuple(problem.epilogue.evaluate(torch.matmul(a, b), dict(operands)))


class ScaledPrefix(NamedTuple):
    """What an fp8 epilogue starts with that ``torch._scaled_mm`` does itself."""

    scale_a: str | None  # operand of one element or one per row (None: no scale)
    scale_b: str | None  # operand of one element or one per column
    bias: str | None  # operand of one per column, added after the scales
    scaled: int  # the node of ``acc * scale_a * scale_b``
    node: int  # the node of ``acc * scale_a * scale_b + bias``


def scaled_mm_prefix(epilogue: Epilogue) -> ScaledPrefix:
    """The scales and bias an fp8 epilogue starts with (``acc * scale_a * scale_b + bias``,
    any of them missing), as ``torch._scaled_mm`` takes them."""
    users: dict[int, list[int]] = {}
    for i, n in enumerate(epilogue.nodes):
        for arg in n.args:
            users.setdefault(arg, []).append(i)
    found: dict[str, str] = {}
    node = next(i for i, n in enumerate(epilogue.nodes) if n.op == "acc")
    scaled = node
    for side, op, broadcasts in (
        ("a", "mul", ("scalar", "col")),
        ("b", "mul", ("scalar", "row")),
        ("bias", "add", ("row",)),
    ):
        after = users.get(node, [])
        if len(after) != 1 or epilogue.nodes[after[0]].op != op:
            break
        other = [epilogue.nodes[x] for x in epilogue.nodes[after[0]].args if x != node]
        if len(other) != 1 or other[0].op != "operand" or other[0].attr["broadcast"] not in broadcasts:
            break
        found[side], node = str(other[0].attr["name"]), after[0]
        scaled = node if side != "bias" else scaled
    return ScaledPrefix(found.get("a"), found.get("b"), found.get("bias"), scaled, node)


def eager_scaled_mm(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """``torch._scaled_mm`` (cuBLASLt; A row-major and B column-major, as it needs) with the
    epilogue's leading scales and bias, out in bfloat16, then the rest of the epilogue in eager
    torch. Where cuBLASLt has no algorithm for the bias (rowwise scales at M = 16, K = 14336
    on an H100 with torch 2.11), the bias is added in eager torch too."""
    prefix = scaled_mm_prefix(problem.epilogue)
    one = torch.ones((), dtype=torch.float32, device=a.device)
    sa = one if prefix.scale_a is None else operands[prefix.scale_a].float()
    sb = one if prefix.scale_b is None else operands[prefix.scale_b].float()
    sa = sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(())
    sb = sb.reshape(1, -1) if sb.numel() > 1 else sb.reshape(())

    def scaled_mm(bias: str | None) -> torch.Tensor:
        return torch._scaled_mm(
            a.contiguous(),
            b.t().contiguous().t(),
            sa,
            sb,
            bias=None if bias is None else operands[bias].to(torch.bfloat16).reshape(-1),
            out_dtype=torch.bfloat16,
            use_fast_accum=problem.precision == "fast",
        )

    node = prefix.node
    try:
        out = scaled_mm(prefix.bias)
    except RuntimeError:
        if prefix.bias is None:
            raise
        out, node = scaled_mm(None), prefix.scaled
    return tuple(problem.epilogue.evaluate(out, dict(operands), given={node: out}))
