"""Transformer-family models of the zoo: GPT-2, Llama, BERT, a mixture of experts, ViT.

Every model takes one float tensor (token embeddings [B, S, D], or images [B, 3, H, W]
for ViT) and is built from ``torch.nn`` parts only, with random weights. Attention goes
through ``F.scaled_dot_product_attention``, as in the libraries these models imitate.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, H*Dh] -> [B, H, S, Dh]."""
    b, s, d = t.shape
    return t.view(b, s, heads, d // heads).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, Dh] -> [B, S, H*Dh]."""
    b, h, s, dh = t.shape
    return t.transpose(1, 2).reshape(b, s, h * dh)


class GPT2Block(nn.Module):
    """Pre-LayerNorm block: fused qkv projection with bias, causal SDPA, GELU-tanh MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        h = self.heads
        att = F.scaled_dot_product_attention(_heads(q, h), _heads(k, h), _heads(v, h), is_causal=True)
        x = x + self.proj(_merge(att))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """A stack of GPT-2 blocks, the final LayerNorm and an untied LM head (no bias)."""

    def __init__(self, d: int, heads: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, q/k/v/o without bias, rotary embeddings, grouped-query causal attention,
    RMSNorm, SwiGLU MLP without bias."""

    def __init__(self, d: int, heads: int, kv_heads: int, f: int, max_seq: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, dh = heads, kv_heads, d // heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.k, self.v = nn.Linear(d, kv_heads * dh, bias=False), nn.Linear(d, kv_heads * dh, bias=False)
        self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def rope(self, t: torch.Tensor) -> torch.Tensor:
        s = t.shape[-2]
        return t * self.cos[:s] + _rotate_half(t) * self.sin[:s]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q = self.rope(_heads(self.q(h), self.heads))
        k = self.rope(_heads(self.k(h), self.kv_heads))
        v = _heads(self.v(h), self.kv_heads)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        x = x + self.o(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class BertLayer(nn.Module):
    """Post-LayerNorm encoder layer: separate q/k/v with biases, bidirectional attention,
    GELU (erf) MLP."""

    def __init__(self, d: int, heads: int, f: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc, self.out = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heads
        att = F.scaled_dot_product_attention(_heads(self.q(x), h), _heads(self.k(x), h), _heads(self.v(x), h))
        x = self.ln1(x + self.o(_merge(att)))
        return self.ln2(x + self.out(F.gelu(self.fc(x))))


class Bert(nn.Module):
    def __init__(self, d: int, heads: int, f: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(BertLayer(d, heads, f) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class MoE(nn.Module):
    """A top-k routed mixture of SwiGLU experts, computed densely with batched matmuls
    (every expert sees every token; the gates are zero outside each token's top k). The
    router runs in float32, as in most MoE code, so that rounding cannot change the routing."""

    def __init__(self, d: int, f: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d, experts, bias=False)
        scale = d**-0.5
        self.w_gate = nn.Parameter(torch.randn(experts, d, f) * scale)
        self.w_up = nn.Parameter(torch.randn(experts, d, f) * scale)
        self.w_down = nn.Parameter(torch.randn(experts, f, d) * f**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        logits = F.linear(tokens.float(), self.router.weight.float())
        weights, chosen = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        gates = torch.zeros_like(logits).scatter(1, chosen, weights / weights.sum(-1, keepdim=True))
        h = tokens.unsqueeze(0).expand(self.w_gate.shape[0], b * s, d)  # [E, T, D]
        y = torch.bmm(F.silu(torch.bmm(h, self.w_gate)) * torch.bmm(h, self.w_up), self.w_down)
        out = (y.float() * gates.t().unsqueeze(-1)).sum(0)
        return x + out.to(x.dtype).view(b, s, d)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm``; for the float64 reference, which it does not take, the loop over
    the experts it computes."""
    if a.dtype != torch.float64:
        return torch._grouped_mm(a, b, offs=offs)
    out, start = a.new_zeros(a.shape[0], b.shape[-1]), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end] @ b[e]
        start = end
    return out


class GroupedMoE(nn.Module):
    """A top-k routed mixture of SwiGLU experts as serving code runs it (torchtitan, recent
    transformers): each token's k rows sorted by expert, one ``torch._grouped_mm`` per
    projection over the experts' offsets (weights stored [E, out, in], as nn.Linear stores
    them), the down projection's rows scaled by their routing weights and added back in token
    order. The router runs in float32, as in the dense ``MoE``."""

    def __init__(self, d: int, f: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k, self.experts = top_k, experts
        self.router = nn.Linear(d, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, f, d) * d**-0.5)
        self.w_up = nn.Parameter(torch.randn(experts, f, d) * d**-0.5)
        self.w_down = nn.Parameter(torch.randn(experts, d, f) * f**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        logits = F.linear(tokens.float(), self.router.weight.float())
        weights, chosen = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = torch.argsort(chosen.flatten(), stable=True)  # the rows, grouped by expert
        token = order // self.top_k
        counts = F.one_hot(chosen.flatten(), self.experts).sum(0)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        rows = tokens[token]
        gate = grouped_mm(rows, self.w_gate.transpose(-2, -1), offs)
        up = grouped_mm(rows, self.w_up.transpose(-2, -1), offs)
        y = grouped_mm(F.silu(gate) * up, self.w_down.transpose(-2, -1), offs)
        y = y * weights.flatten()[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros(b * s, d, dtype=torch.float32, device=x.device).index_add(0, token, y.float())
        return x + out.to(x.dtype).view(b, s, d)


class ViT(nn.Module):
    """Patch embedding (a 16x16 stride-16 convolution), a class token and learned positions,
    pre-LayerNorm encoder layers with a fused qkv and GELU MLP, a classifier on the class token."""

    def __init__(self, image: int, d: int, heads: int, f: int, layers: int, classes: int) -> None:
        super().__init__()
        self.heads = heads
        self.patch = nn.Conv2d(3, d, 16, stride=16)
        tokens = (image // 16) ** 2 + 1
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "qkv": nn.Linear(d, 3 * d),
                    "proj": nn.Linear(d, d),
                    "ln2": nn.LayerNorm(d),
                    "fc": nn.Linear(d, f),
                    "out": nn.Linear(f, d),
                }
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        h = self.heads
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln1"](x)).split(x.shape[-1], dim=-1)
            att = F.scaled_dot_product_attention(_heads(q, h), _heads(k, h), _heads(v, h))
            x = x + layer["proj"](_merge(att))
            x = x + layer["out"](F.gelu(layer["fc"](layer["ln2"](x))))
        return self.head(self.ln(x[:, 0]))
