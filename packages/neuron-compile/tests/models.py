"""Tiny models for the compile tests and benchmark, in plain torch: an MLP, a CNN, and a decoder-only transformer
configurable as the Llama, GPT-2, Mistral and Qwen2 architectures (norm, MLP, positions, grouped KV heads, QKV bias,
sliding-window attention, tied embeddings), as transformers builds them from their configs."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # BatchNorm follows: a bias would get no gradient
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.mean((2, 3)))


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 64
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 64
    max_positions: int = 64
    norm: str = "rms"  # "rms" | "layer"
    mlp: str = "swiglu"  # "swiglu" | "gelu"
    positions: str = "rope"  # "rope" | "learned"
    qkv_bias: bool = False
    sliding_window: int | None = None
    tie_embeddings: bool = False


ARCHITECTURES = {
    "llama": DecoderConfig(kv_heads=2),
    "gpt2": DecoderConfig(norm="layer", mlp="gelu", positions="learned", qkv_bias=True, tie_embeddings=True),
    "mistral": DecoderConfig(kv_heads=2, sliding_window=8),
    "qwen2": DecoderConfig(kv_heads=2, qkv_bias=True, tie_embeddings=True),
}


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _norm(config: DecoderConfig) -> nn.Module:
    return RMSNorm(config.hidden) if config.norm == "rms" else nn.LayerNorm(config.hidden)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.head_dim = config.hidden // config.heads
        self.q = nn.Linear(config.hidden, config.heads * self.head_dim, bias=config.qkv_bias)
        self.k = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o = nn.Linear(config.heads * self.head_dim, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if cos is not None:
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        groups = self.config.heads // self.config.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(config), _norm(config)
        self.attn = Attention(config)
        self.swiglu = config.mlp == "swiglu"
        self.up = nn.Linear(config.hidden, config.intermediate, bias=not self.swiglu)
        self.gate = nn.Linear(config.hidden, config.intermediate, bias=False) if self.swiglu else None
        self.down = nn.Linear(config.intermediate, config.hidden, bias=not self.swiglu)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        h = self.norm2(x)
        h = F.silu(self.gate(h)) * self.up(h) if self.swiglu else F.gelu(self.up(h), approximate="tanh")
        return x + self.down(h)


class Decoder(nn.Module):
    """A causal LM: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.max_positions, config.hidden) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        position = torch.arange(seq, device=ids.device)
        x = self.embed(ids)
        cos = sin = None
        if self.positions is not None:
            x = x + self.positions(position)
        else:
            head_dim = self.config.hidden // self.config.heads
            inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=ids.device, dtype=torch.float32) / head_dim))
            angles = torch.outer(position.float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
        causal = position[None, :] <= position[:, None]
        if self.config.sliding_window is not None:
            causal = causal & (position[:, None] - position[None, :] < self.config.sliding_window)
        for block in self.blocks:
            x = block(x, cos, sin, causal)
        return self.lm_head(self.norm(x))


def decoder(architecture: str, **overrides: int) -> Decoder:
    """A tiny decoder of `architecture` ("llama", "gpt2", "mistral", "qwen2")."""
    return Decoder(dataclasses.replace(ARCHITECTURES[architecture], **overrides))
