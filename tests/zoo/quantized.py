"""Quantized building blocks shared by tests and benchmarks (not zoo models themselves)."""

from __future__ import annotations

import torch
import torch.nn as nn


class Fp8Linear(nn.Module):
    """A rowwise-scaled float8 projection: float8 weight and float32 scale buffers, the
    input quantized per row on the fly (``torch._scaled_mm``)."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        w = torch.randn(f, d) / d**0.5
        scale = w.abs().amax(dim=1, keepdim=True) / 448
        self.register_buffer("weight", (w / scale).to(torch.float8_e4m3fn))
        self.register_buffer("scale", scale.t().contiguous())

    def forward(self, x):
        xs = x.abs().amax(dim=-1, keepdim=True).float() / 448
        xq = (x / xs).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, self.weight.t(), scale_a=xs, scale_b=self.scale, out_dtype=torch.bfloat16)
