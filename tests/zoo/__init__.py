"""The model zoo: models the backend has never been tuned for, defined here (nothing is
downloaded), at two sizes: ``tiny`` for the CPU interpreter and ``real`` for a GPU.

    from zoo import ZOO
    spec = ZOO["real"]["vgg"]
    model, x = spec.build(), torch.randn(spec.input_shape)

``harness.py`` runs one model through the backend and compares it with eager in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from zoo.convnets import VGG, ConvNeXtStage, MBConvStage, MobileNet, ResNetStage, UNet
from zoo.quantized import Fp8BlockLinear, Fp8RowwiseLinear, fp8_weights
from zoo.transformers import GPT2, Bert, GroupedMoE, LlamaBlock, MoE, ViT


@dataclass(frozen=True)
class Spec:
    """A model of the zoo at one size: how to build it and the shape of its input."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # batch first
    image: bool = False  # an NCHW image input: the model runs channels_last and contiguous

    @property
    def batch(self) -> int:
        return self.input_shape[0]


def _specs(*specs: Spec) -> dict[str, Spec]:
    return {s.name: s for s in specs}


# fmt: off
ZOO: dict[str, dict[str, Spec]] = {
    "tiny": _specs(
        Spec("gpt2", lambda: GPT2(d=32, heads=2, layers=2, vocab=40), (3, 8, 32)),
        Spec("llama", lambda: LlamaBlock(d=32, heads=4, kv_heads=2, f=48, max_seq=8), (3, 8, 32)),
        Spec("llama_fp8w", lambda: fp8_weights(LlamaBlock(d=32, heads=4, kv_heads=2, f=48, max_seq=8)), (3, 8, 32)),
        Spec(
            "llama_fp8",
            lambda: fp8_weights(LlamaBlock(d=32, heads=4, kv_heads=2, f=48, max_seq=8), Fp8RowwiseLinear),
            (3, 8, 32),
        ),
        Spec(  # block scales need 128-multiples: every projection 128 or 256 wide
            "llama_fp8b",
            lambda: fp8_weights(LlamaBlock(d=128, heads=4, kv_heads=4, f=256, max_seq=8), Fp8BlockLinear),
            (2, 8, 128),
        ),
        Spec("bert", lambda: Bert(d=32, heads=2, f=64, layers=1), (3, 8, 32)),
        Spec("moe", lambda: MoE(d=32, f=24, experts=4, top_k=2), (3, 8, 32)),
        Spec("moe_grouped", lambda: GroupedMoE(d=32, f=24, experts=4, top_k=2), (3, 8, 32)),
        Spec("vit", lambda: ViT(image=32, d=32, heads=2, f=64, layers=1, classes=10), (4, 3, 32, 32), True),
        Spec("vgg", lambda: VGG(3, 8, 16), (2, 3, 8, 8), True),
        Spec("resnet", lambda: ResNetStage(16, 4, 2), (2, 16, 8, 8), True),
        Spec("mobilenet", lambda: MobileNet(stem=8, c=16, classes=10), (2, 3, 16, 16), True),
        Spec("unet", lambda: UNet(3, 8, 2), (2, 3, 8, 8), True),
        Spec("mbconv", lambda: MBConvStage(8, 16, 2, expand=2), (2, 8, 8, 8), True),
        Spec("convnext", lambda: ConvNeXtStage(16, 1), (2, 16, 8, 8), True),
    ),
    "real": _specs(
        Spec("gpt2", lambda: GPT2(d=768, heads=12, layers=2, vocab=8192), (8, 256, 768)),
        Spec("llama", lambda: LlamaBlock(d=2048, heads=16, kv_heads=8, f=5632, max_seq=2048), (4, 256, 2048)),
        Spec(  # weight-only fp8 at decode: 8 sequences of one token, the weights' bytes bound it
            "llama_fp8w",
            lambda: fp8_weights(LlamaBlock(d=4096, heads=32, kv_heads=8, f=14336, max_seq=1)),
            (8, 1, 4096),
        ),
        Spec(  # rowwise fp8 weights and activations (torchao's dynamic-activation config), prefill
            "llama_fp8",
            lambda: fp8_weights(LlamaBlock(d=4096, heads=32, kv_heads=8, f=14336, max_seq=512), Fp8RowwiseLinear),
            (4, 512, 4096),
        ),
        Spec(  # block-scaled fp8 (DeepSeek-V3's scaling, dequantized in torch ops) at decode
            "llama_fp8b",
            lambda: fp8_weights(LlamaBlock(d=4096, heads=32, kv_heads=8, f=14336, max_seq=512), Fp8BlockLinear),
            (8, 1, 4096),
        ),
        Spec("bert", lambda: Bert(d=768, heads=12, f=3072, layers=2), (8, 128, 768)),
        Spec("moe", lambda: MoE(d=1024, f=1024, experts=8, top_k=2), (2, 256, 1024)),
        Spec("moe_grouped", lambda: GroupedMoE(d=1024, f=1024, experts=8, top_k=2), (2, 256, 1024)),
        Spec("vit", lambda: ViT(image=224, d=384, heads=6, f=1536, layers=2, classes=1000), (16, 3, 224, 224), True),
        Spec("vgg", lambda: VGG(32, 96, 192), (64, 32, 48, 48), True),
        Spec("resnet", lambda: ResNetStage(256, 128, 3), (16, 256, 56, 56), True),
        Spec("mobilenet", lambda: MobileNet(stem=16, c=24, classes=1000), (32, 3, 224, 224), True),
        Spec("unet", lambda: UNet(3, 32, 2), (8, 3, 128, 128), True),
        Spec("mbconv", lambda: MBConvStage(24, 40, 2), (32, 24, 56, 56), True),
        Spec("convnext", lambda: ConvNeXtStage(192, 2), (32, 192, 28, 28), True),
    ),
}
# fmt: on
MODELS = tuple(ZOO["tiny"])
