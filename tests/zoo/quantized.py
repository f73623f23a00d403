"""Quantized building blocks shared by tests and benchmarks (not zoo models themselves)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


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


class Fp8WeightLinear(nn.Module):
    """Weight-only fp8, as torchao's ``Float8WeightOnlyConfig`` runs it: the weight stored in
    e4m3 with one scale per output channel, dequantized in float32 and rounded to the
    activations' dtype before ``linear``. The fp8 weight is kept as its bytes (uint8), so a
    model's ``.to(dtype)`` leaves it as it is (the scale and bias follow the model's dtype)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448
        self.register_buffer("weight_bytes", (w / scale).to(torch.float8_e4m3fn).view(torch.uint8))
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        w8 = self.weight_bytes.view(torch.float8_e4m3fn)
        w = (w8.to(torch.float32) * self.scale).to(x.dtype)
        return F.linear(x, w, self.bias)


class Fp8RowwiseLinear(nn.Module):
    """torchao's ``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``: the
    weight in e4m3 with one scale per output channel, each token's activations quantized on the
    fly with one scale per row, then ``torch._scaled_mm`` (exact accumulation). The weight kept
    as its bytes, as in ``Fp8WeightLinear``; the scales are made float32 where they are used."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448
        self.register_buffer("weight_bytes", (w / scale).to(torch.float8_e4m3fn).view(torch.uint8))
        self.register_buffer("scale", scale.t().contiguous())  # [1, N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        sx = rows.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448
        x8 = (rows / sx).to(torch.float8_e4m3fn)
        w8 = self.weight_bytes.view(torch.float8_e4m3fn)
        # cuBLASLt writes no float64 (the harness's reference runs the model so): fp32 there
        out_dtype = torch.float32 if x.dtype == torch.float64 else x.dtype
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=self.scale.float(), out_dtype=out_dtype).to(
            x.dtype
        )
        y = y if self.bias is None else y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class Fp8BlockLinear(nn.Module):
    """DeepSeek-V3's fp8 (transformers' ``FineGrainedFP8Config``) as a model without a
    block-scaled GEMM writes it: the weight in e4m3 with one scale a 128x128 block, each
    token's activations quantized per 128 channels on the fly, both dequantized in float32 and
    rounded to the activations' dtype before ``linear``. The weight kept as its bytes, as in
    ``Fp8WeightLinear``; its scales [N/128, K/128] made float32 where they are used."""

    BLOCK = 128

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        n, k = linear.weight.shape
        if n % self.BLOCK or k % self.BLOCK:
            raise ValueError(f"block-scaled fp8 needs multiples of {self.BLOCK}, got a {n}x{k} weight")
        blocks = linear.weight.detach().float().view(n // self.BLOCK, self.BLOCK, k // self.BLOCK, self.BLOCK)
        scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / 448
        w8 = (blocks / scale).to(torch.float8_e4m3fn).view(n, k)
        self.register_buffer("weight_bytes", w8.view(torch.uint8))
        self.register_buffer("scale", scale.view(n // self.BLOCK, k // self.BLOCK))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        groups = x.unflatten(-1, (-1, self.BLOCK)).float()
        sx = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448
        x8 = (groups / sx).to(torch.float8_e4m3fn)
        xd = (x8.to(torch.float32) * sx).flatten(-2).to(x.dtype)
        w8 = self.weight_bytes.view(torch.float8_e4m3fn)
        (n, k), b = w8.shape, self.BLOCK
        w = w8.to(torch.float32).view(n // b, b, k // b, b) * self.scale.float()[:, None, :, None]
        return F.linear(xd, w.view(n, k).to(x.dtype), self.bias)


def fp8_weights(model: nn.Module, linear: type[nn.Module] = Fp8WeightLinear) -> nn.Module:
    """``model`` with every ``nn.Linear`` made a ``linear`` (quantized from it)."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, linear(child))
        else:
            fp8_weights(child, linear)
    return model
