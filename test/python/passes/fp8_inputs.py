"""Inputs of the fp8 attention callers (examples/fp8_caller.py) that the passes' tests
share: importable from every test module below this directory (its conftest)."""

from __future__ import annotations

import math

import torch


def caller_inputs(b, h, s, d, device="cpu"):
    """q8, k8, v8 (E4M3FN, per-tensor scaled to 448) and their dequantization factors,
    and the float64 attention of the values they hold."""
    out, deq = [], []
    for _ in range(3):
        x = torch.randn(b, h, s, d, device=device)
        scale = 448 / x.abs().max()
        x8 = (x * scale).to(torch.float8_e4m3fn)
        out.append(x8)
        deq.append((1 / scale).reshape(()).float())
    qd, kd, vd = (x8.double() * f.double() for x8, f in zip(out, deq))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(d), -1) @ vd
    return (*out, *deq), ref
