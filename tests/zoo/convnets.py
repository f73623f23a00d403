"""Convolutional models of the zoo: VGG with max pooling, a ResNet bottleneck stage,
MobileNet blocks (depthwise + pointwise, ReLU6 / hardswish), an EfficientNet MBConv stage
(5x5 depthwise, squeeze-excite), a ConvNeXt stage (7x7 depthwise, channel LayerNorm, MLP,
layer scale) and a small UNet.

Batch norms run in eval mode with random statistics (``randomize_norms``), so that they
are the per-channel affines the backend folds into a convolution's epilogue.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(c_in: int, c_out: int, k: int = 3, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out)]


class VGG(nn.Module):
    """The net of issue 15: conv3x3+BN+ReLU twice, 2x2 max pooling, conv3x3+BN+ReLU,
    conv1x1+BN+ReLU -> y; relu(y + conv3x3(y)) with a biased convolution."""

    def __init__(self, c_in: int, a: int, b: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *conv_bn(c_in, a), nn.ReLU(),
            *conv_bn(a, a), nn.ReLU(),
            nn.MaxPool2d(2),
            *conv_bn(a, b), nn.ReLU(),
            *conv_bn(b, b, 1), nn.ReLU(),
        )  # fmt: skip
        self.last = nn.Conv2d(b, b, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x)
        return torch.relu(y + self.last(y))


class Bottleneck(nn.Module):
    """ResNet-50's block (v1.5: the stride on the 3x3 convolution), projection shortcut
    where the shape changes."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            *conv_bn(c_in, width, 1), nn.ReLU(),
            *conv_bn(width, width, 3, stride), nn.ReLU(),
            *conv_bn(width, out, 1),
        )  # fmt: skip
        self.short = nn.Sequential(*conv_bn(c_in, out, 1, stride)) if stride != 1 or c_in != out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))


class ResNetStage(nn.Module):
    def __init__(self, c_in: int, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            Bottleneck(c_in, width, 2), *(Bottleneck(4 * width, width, 1) for _ in range(blocks - 1))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 block: 1x1 expansion, 3x3 depthwise, 1x1 projection (no activation),
    a residual where the shape allows."""

    def __init__(self, c_in: int, expand: int, c_out: int, stride: int, act: type[nn.Module]) -> None:
        super().__init__()
        hidden = c_in * expand
        self.residual = stride == 1 and c_in == c_out
        self.body = nn.Sequential(
            *conv_bn(c_in, hidden, 1), act(),
            *conv_bn(hidden, hidden, 3, stride, groups=hidden), act(),
            *conv_bn(hidden, c_out, 1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    """A stride-2 stem with hardswish, a ReLU6 block that halves the image, a hardswish block
    with a residual, global average pooling and a classifier."""

    def __init__(self, stem: int, c: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(*conv_bn(3, stem, 3, 2), nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(stem, 4, c, 2, nn.ReLU6), InvertedResidual(c, 3, c, 1, nn.Hardswish)
        )
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(y.mean((2, 3)))


class SqueezeExcite(nn.Module):
    """Global average pool, a 1x1 reduction with SiLU, a 1x1 expansion with a sigmoid gate."""

    def __init__(self, c: int, squeeze: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return x * gate


class MBConv(nn.Module):
    """EfficientNet's block: 1x1 expansion (BN, SiLU), k x k depthwise (BN, SiLU), a
    squeeze-excite gate, 1x1 projection (BN), a residual where the shape allows."""

    def __init__(self, c_in: int, expand: int, c_out: int, k: int, stride: int) -> None:
        super().__init__()
        hidden = c_in * expand
        self.residual = stride == 1 and c_in == c_out
        self.body = nn.Sequential(
            *conv_bn(c_in, hidden, 1), nn.SiLU(),
            *conv_bn(hidden, hidden, k, stride, groups=hidden), nn.SiLU(),
            SqueezeExcite(hidden, max(1, c_in // 4)),
            *conv_bn(hidden, c_out, 1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MBConvStage(nn.Module):
    """An EfficientNet-B0 5x5 stage: a stride-2 block, then blocks with residuals."""

    def __init__(self, c_in: int, c_out: int, blocks: int, k: int = 5, expand: int = 6) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            MBConv(c_in, expand, c_out, k, 2),
            *(MBConv(c_out, expand, c_out, k, 1) for _ in range(blocks - 1)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: 7x7 depthwise convolution, LayerNorm over the channels (channels
    last), a 4x MLP with GELU, a layer scale, the residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.up, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.scale = nn.Parameter(torch.full((c,), 0.5))  # layer scale (1e-6 at init; trained, larger)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        y = self.down(F.gelu(self.up(y))) * self.scale
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtStage(nn.Module):
    def __init__(self, c: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(ConvNeXtBlock(c) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(*conv_bn(c_in, c_out), nn.ReLU(), *conv_bn(c_out, c_out), nn.ReLU())


class UNet(nn.Module):
    """Two levels down (max pooling), a bottleneck, two levels up (nearest, then bilinear
    upsampling) with skip connections concatenated, a 1x1 output convolution."""

    def __init__(self, c_in: int, base: int, classes: int) -> None:
        super().__init__()
        self.enc1, self.enc2 = double_conv(c_in, base), double_conv(base, 2 * base)
        self.mid = double_conv(2 * base, 4 * base)
        self.dec2, self.dec1 = double_conv(6 * base, 2 * base), double_conv(3 * base, base)
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat((F.interpolate(m, scale_factor=2.0, mode="nearest"), e2), dim=1))
        up = F.interpolate(d2, scale_factor=2.0, mode="bilinear", align_corners=False)
        d1 = self.dec1(torch.cat((up, e1), dim=1))
        return self.out(d1)


def randomize_norms(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Random running statistics and affine parameters for every batch norm (fresh ones
    are the identity, which would hide a wrongly folded scale or shift)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(c, generator=gen) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(c, generator=gen) - 0.5)
    return model
