"""The zoo's real-size models as factories for ``epilab tune --model`` (from tests/):

    cd tests && epilab tune --model zoo.factories:gpt2 --input 8x256x768:bfloat16 --train
    cd tests && epilab tune --model zoo.factories:mobilenet --trials 16
    cd tests && epilab tune --model zoo.factories:moe_grouped --trials 16   # moe_grouped_decode
    cd tests && epilab tune --model zoo.factories:tv_convnext_tiny          # torchvision's
    cd tests && epilab tune --model zoo.factories:hf_llama --input 4x512x2048:bfloat16

The transformers take the zoo's input shapes (``ZOO["real"][name].input_shape``) with
``--input``; the convolutional models come with their input (bf16, channels last, as the
zoo runs them on a GPU; ``mobilenet_nchw`` and ``mbconv_nchw`` contiguous NCHW), and so do
the grouped-mm MoE's (bf16: prefill, and a decode step of 16 tokens), so they need no
``--input``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from zoo import ZOO
from zoo.harness import spec_of


def gpt2() -> nn.Module:
    return ZOO["real"]["gpt2"].build()


def llama() -> nn.Module:
    return ZOO["real"]["llama"].build()


def bert() -> nn.Module:
    return ZOO["real"]["bert"].build()


def _image_model(
    name: str, memory: torch.memory_format = torch.channels_last
) -> tuple[nn.Module, torch.Tensor]:
    """The model in bf16 and a random bf16 input of the zoo's shape, both in ``memory``
    (channels last, or contiguous NCHW for the ``_nchw`` factories)."""
    spec = spec_of("real", name)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(spec.input_shape, generator=generator).to(torch.bfloat16)
    model = spec.build().to(torch.bfloat16, memory_format=memory)
    return model, x.contiguous(memory_format=memory)


def mobilenet() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("mobilenet")


def mbconv() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("mbconv")


def convnext() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("convnext")


def _moe_grouped(tokens: int) -> tuple[nn.Module, torch.Tensor]:
    """The grouped-mm MoE layer in bf16 (torch._grouped_mm takes nothing else) and a bf16
    input of ``tokens`` tokens: [tokens, 1, d] (one decode step of a batch) or the zoo's."""
    spec = ZOO["real"]["moe_grouped"]
    shape = spec.input_shape if tokens == 0 else (tokens, 1, spec.input_shape[-1])
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return spec.build().to(torch.bfloat16), x


def moe_grouped() -> tuple[nn.Module, torch.Tensor]:
    """Prefill: the zoo's 2 x 256 tokens."""
    return _moe_grouped(0)


def moe_grouped_decode() -> tuple[nn.Module, torch.Tensor]:
    """A decode step of 16 sequences: 16 tokens."""
    return _moe_grouped(16)


def mobilenet_nchw() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("mobilenet", torch.contiguous_format)


def mbconv_nchw() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("mbconv", torch.contiguous_format)


# models built from the libraries users run (``zoo/libraries.py``; optional: torchvision,
# transformers). The transformers take ``--input`` (``LIBRARY_ZOO["real"][name].input_shape``:
# hf_llama 4x512x2048, hf_qwen2_moe 4x256x2048, in bfloat16); the torchvision nets come with
# their input, bf16 channels last at batch 32, 224x224


def hf_llama() -> nn.Module:
    """A Llama-class 2-layer decoder (d 2048, 16 heads, 8 KV heads, SwiGLU 5632), transformers'."""
    return spec_of("real", "hf_llama").build()


def hf_qwen2_moe() -> nn.Module:
    """Qwen2-MoE's block: 60 experts, top-4, a gated shared expert (d 2048), transformers'."""
    return spec_of("real", "hf_qwen2_moe").build()


def tv_convnext_tiny() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("tv_convnext_tiny")


def tv_mobilenet_v3_large() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("tv_mobilenet_v3_large")


def tv_resnet50() -> tuple[nn.Module, torch.Tensor]:
    return _image_model("tv_resnet50")
