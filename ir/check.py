"""Checking a kernel's outputs against the float64 reference.

The error of an output is ``||out - ref|| / ||ref||`` over the whole tensor
(NaN or inf anywhere counts as an infinite error), checked against a bound that
depends on how the inputs were multiplied and on the output dtype (docs/design.md,
"Testing"). Bool outputs must match exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# bound on the relative error norm, by input dtype (and dot precision) or output dtype
# (fp8 inputs are exact in the reference; the bound covers the tensor cores' fast accumulation.
# fp8 outputs: about twice the rounding error of normal-distributed values, 2.7% and 5.3%)
INPUT_TOLERANCE = {
    "float32": 1e-5,
    "tf32": 1e-3,
    "float16": 1e-2,
    "bfloat16": 1e-2,
    "float8_e4m3fn": 1e-2,
    "float8_e5m2": 1e-2,
}
OUTPUT_TOLERANCE = {
    "float32": 1e-5,
    "float16": 1e-2,
    "bfloat16": 1e-2,
    "bool": 0.0,
    "float8_e4m3fn": 6e-2,
    "float8_e5m2": 1.2e-1,
}


def tolerance(input_dtype: str, precision: str, output_dtype: str) -> float:
    key = "tf32" if input_dtype == "float32" and precision == "tf32" else input_dtype
    return max(INPUT_TOLERANCE[key], OUTPUT_TOLERANCE[output_dtype])


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf if ``out`` has NaN/inf where ``ref`` is finite.

    Where ``ref`` lies beyond the largest finite value of ``out``'s dtype (a product of two
    K = 4096 sums in fp16, say), the output is right when it overflowed as rounding to that
    dtype does: inf of the reference's sign, or the largest finite value (rounded down, or
    saturated as an fp8 output is). Such elements are left out of the norms."""
    import torch

    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference {tuple(ref.shape)}")
    if out.dtype == torch.bool or ref.dtype == torch.bool:
        return float((out.bool() != ref.bool()).sum().item())
    o, r = out.double(), ref.double().to(out.device)
    if out.dtype.is_floating_point and out.dtype != torch.float64:
        largest = torch.finfo(out.dtype).max
        over = torch.isfinite(r) & (r.abs() > largest)
        if over.any():
            overflowed = (o.abs() >= largest) & (torch.sign(o) == torch.sign(r))
            if not bool(overflowed[over].all()):
                return math.inf
            o, r = o.masked_fill(over, 0.0), r.masked_fill(over, 0.0)
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), finite) or not torch.equal(
        o[~finite].nan_to_num(), r[~finite].nan_to_num()
    ):
        return math.inf
    diff = torch.linalg.vector_norm(o[finite] - r[finite]).item()
    scale = torch.linalg.vector_norm(r[finite]).item()
    return diff / scale if scale > 0 else diff


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer filled with NaN (True for bool), so an unwritten element shows."""
    import torch

    return torch.full_like(t, True if t.dtype == torch.bool else math.nan)
