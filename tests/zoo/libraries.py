"""Models built from the libraries users run: torchvision classification nets and Hugging Face
transformers decoders, encoders and MoE layers, with random weights from their configs
(nothing is downloaded). Not the zoo's own code, so the backend meets them as users write them.

Optional (``pip install -e .[zoo]``, with a torchvision that matches your torch): where a
library is missing its models are left out of ``LIBRARY_ZOO`` and the tests that need them
skip (``tests/test_library_zoo.py``). Each model takes a float input the zoo's harness makes
(``zoo.harness``): an image, or a transformer's embeddings (``inputs_embeds``: the token
embedding lookup is not a GEMM).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
import torch.nn as nn

from zoo import Spec

HAVE_TORCHVISION = importlib.util.find_spec("torchvision") is not None
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


class LastHidden(nn.Module):
    """A transformers model run on embeddings: its last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=x, use_cache=False).last_hidden_state


class Bare(nn.Module):
    """A transformers layer's hidden states (an MoE block may also return its router logits).
    A layer built alone is not initialised (a model's ``post_init`` does that; experts are
    ``torch.empty``): each matrix is drawn with std 1/sqrt(fan-in), each vector zeroed."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        with torch.no_grad():
            for p in block.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, p.shape[-1] ** -0.5)
                else:
                    p.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def _eager(config: object) -> object:
    """``config`` run as the library's eager modules (its MoE experts looped: a standalone
    block gets no implementation otherwise)."""
    config._attn_implementation = "sdpa"  # type: ignore[attr-defined]
    config._experts_implementation = "eager"  # type: ignore[attr-defined]
    return config


def hf_llama(d: int, layers: int, heads: int, kv_heads: int, f: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=d,
        intermediate_size=f,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=64,
    )
    return LastHidden(LlamaModel(_eager(config)))


def hf_bert(d: int, layers: int, heads: int, f: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=f, vocab_size=64
    )
    return LastHidden(BertModel(_eager(config), add_pooling_layer=False))


def hf_qwen2_moe(d: int, f: int, shared: int, experts: int, top_k: int) -> nn.Module:
    """Qwen2-MoE's sparse block: softmax top-k routing over ``experts`` SwiGLU experts and a
    gated shared expert."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = Qwen2MoeConfig(
        hidden_size=d,
        moe_intermediate_size=f,
        shared_expert_intermediate_size=shared,
        num_experts=experts,
        num_experts_per_tok=top_k,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
    )
    return Bare(Qwen2MoeSparseMoeBlock(_eager(config)))


def hf_mixtral_moe(d: int, f: int, experts: int, top_k: int) -> nn.Module:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=d, intermediate_size=f, num_local_experts=experts, num_experts_per_tok=top_k
    )
    return Bare(MixtralSparseMoeBlock(_eager(config)))


def tv(name: str) -> Callable[[], nn.Module]:
    """A torchvision classification net by name, random weights."""

    def build() -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name, weights=None)

    return build


def _specs(*specs: Spec) -> dict[str, Spec]:
    return {s.name: s for s in specs}


TRANSFORMERS = {
    "tiny": _specs(
        Spec("hf_llama", lambda: hf_llama(32, 2, 4, 2, 48), (2, 8, 32)),
        Spec("hf_bert", lambda: hf_bert(32, 1, 2, 64), (2, 8, 32)),
        Spec("hf_qwen2_moe", lambda: hf_qwen2_moe(32, 24, 48, 6, 2), (2, 8, 32)),
        Spec("hf_mixtral_moe", lambda: hf_mixtral_moe(32, 24, 4, 2), (2, 8, 32)),
    ),
    "real": _specs(
        Spec("hf_llama", lambda: hf_llama(2048, 2, 16, 8, 5632), (4, 512, 2048)),
        Spec("hf_bert", lambda: hf_bert(768, 4, 12, 3072), (8, 128, 768)),
        Spec("hf_qwen2_moe", lambda: hf_qwen2_moe(2048, 1408, 5632, 60, 4), (4, 256, 2048)),
        Spec("hf_mixtral_moe", lambda: hf_mixtral_moe(1024, 3584, 8, 2), (4, 256, 1024)),
    ),
}
TORCHVISION = {
    "tiny": _specs(
        Spec("tv_resnet18", tv("resnet18"), (1, 3, 32, 32), True),
        Spec("tv_mobilenet_v3_small", tv("mobilenet_v3_small"), (1, 3, 32, 32), True),
    ),
    "real": _specs(
        Spec("tv_resnet50", tv("resnet50"), (32, 3, 224, 224), True),
        Spec("tv_mobilenet_v3_large", tv("mobilenet_v3_large"), (32, 3, 224, 224), True),
        Spec("tv_convnext_tiny", tv("convnext_tiny"), (32, 3, 224, 224), True),
        Spec("tv_efficientnet_b0", tv("efficientnet_b0"), (32, 3, 224, 224), True),
    ),
}
LIBRARY_ZOO: dict[str, dict[str, Spec]] = {
    size: {
        **(TRANSFORMERS[size] if HAVE_TRANSFORMERS else {}),
        **(TORCHVISION[size] if HAVE_TORCHVISION else {}),
    }
    for size in ("tiny", "real")
}
# every model, and the library it needs (a test of a missing one skips, naming it)
NEEDS = {
    **{name: "transformers" for name in TRANSFORMERS["tiny"] | TRANSFORMERS["real"]},
    **{name: "torchvision" for name in TORCHVISION["tiny"] | TORCHVISION["real"]},
}
