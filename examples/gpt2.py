"""A GPT-2-style decoder built from torch.nn, compiled whole with ``torch.compile(backend="kf")``.

Learned position embeddings, LayerNorm, one fused q/k/v projection with bias, causal
attention through ``F.scaled_dot_product_attention(is_causal=True)``, a tanh-GELU MLP and
a head tied to the token embedding; random weights, no downloads.

    python examples/gpt2.py                        # forward and 5 training steps beside eager
    python examples/gpt2.py --target vulkan --steps 3 --seq 64

(examples/train_gpt.py is the other way in: a GPT whose pieces are kf functions called
from eager code.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 128
    width: int = 64
    layers: int = 2
    heads: int = 4
    max_seq: int = 2048
    eps: float = 1e-5


class Block(torch.nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = torch.nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.qkv = torch.nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = torch.nn.Linear(cfg.width, cfg.width)
        self.ln2 = torch.nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.fc = torch.nn.Linear(cfg.width, 4 * cfg.width)
        self.out = torch.nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, cfg: GPT2Config = GPT2Config()):
        super().__init__()
        self.cfg = cfg
        self.tok = torch.nn.Embedding(cfg.vocab, cfg.width)
        self.pos = torch.nn.Embedding(cfg.max_seq, cfg.width)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lnf = torch.nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.head = torch.nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2's
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.lnf(x))
        if targets is None:
            return logits
        # the loss as language models compute it: the logits' rows in float32; under
        # torch.compile(backend="kf") this becomes kf's fused linear cross-entropy
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main(argv=None) -> int:
    import whole_model

    return whole_model.main(lambda: GPT2(), "GPT-2-style decoder", argv)


if __name__ == "__main__":
    raise SystemExit(main())
