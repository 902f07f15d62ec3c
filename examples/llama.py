"""A Llama-style decoder built from torch.nn, compiled whole with ``torch.compile(backend="kf")``.

RMSNorm, rotary position embedding, grouped-query attention (fewer key/value heads than
query heads) through ``F.scaled_dot_product_attention(is_causal=True)``, and a SwiGLU MLP;
random weights, no downloads.

    python examples/llama.py                        # forward and 5 training steps beside eager
    python examples/llama.py --target vulkan --steps 3 --seq 64
    python examples/llama.py --fallback eager       # ops kf leaves run eagerly (default: Inductor)

whole_model.py has the loop both this and gpt2.py run: the same model compiled with kf and
run eagerly from the same weights on the same batches, the losses and gradients side by
side, then what ran in kf (``kf.explain``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 128
    width: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 176  # SwiGLU's inner width
    max_seq: int = 2048
    eps: float = 1e-5
    rope_base: float = 10000.0


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.dim = cfg.heads, cfg.kv_heads, cfg.width // cfg.heads
        self.q = torch.nn.Linear(cfg.width, cfg.heads * self.dim, bias=False)
        self.k = torch.nn.Linear(cfg.width, cfg.kv_heads * self.dim, bias=False)
        self.v = torch.nn.Linear(cfg.width, cfg.kv_heads * self.dim, bias=False)
        self.o = torch.nn.Linear(cfg.heads * self.dim, cfg.width, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads  # grouped-query attention: each kv head serves `groups` q heads
        k = k[:, :, None].expand(b, self.kv_heads, groups, t, self.dim).reshape(b, self.heads, t, self.dim)
        v = v[:, :, None].expand(b, self.kv_heads, groups, t, self.dim).reshape(b, self.heads, t, self.dim)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, self.heads * self.dim))


class SwiGLU(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate = torch.nn.Linear(cfg.width, cfg.hidden, bias=False)
        self.up = torch.nn.Linear(cfg.width, cfg.hidden, bias=False)
        self.down = torch.nn.Linear(cfg.hidden, cfg.width, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.norm1, self.attn = RMSNorm(cfg.width, cfg.eps), Attention(cfg)
        self.norm2, self.mlp = RMSNorm(cfg.width, cfg.eps), SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Llama(torch.nn.Module):
    """Token embedding, pre-norm decoder blocks, a final RMSNorm and an untied head. The
    rotary tables are buffers computed once for ``max_seq`` positions."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.width, cfg.eps)
        self.head = torch.nn.Linear(cfg.width, cfg.vocab, bias=False)
        dim = cfg.width // cfg.heads
        inv_freq = 1.0 / cfg.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.5 / math.sqrt(p.shape[-1]))

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        cos, sin = self.cos[:t].to(self.embed.weight.dtype), self.sin[:t].to(self.embed.weight.dtype)
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        # the loss as language models compute it: the logits' rows in float32; under
        # torch.compile(backend="kf") this becomes kf's fused linear cross-entropy
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main(argv=None) -> int:
    import whole_model

    return whole_model.main(lambda: Llama(), "Llama-style decoder", argv)


if __name__ == "__main__":
    raise SystemExit(main())
