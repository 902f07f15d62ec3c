"""Attention on fp8 tensors you quantized yourself, for ``precision="fp8"``.

torch has no fp8 matmul, so the operands are widened where they are used; under
``precision="fp8"`` kf sees through the widening and gives the E4M3FN tensors to its fp8
attention kernel as they are, with the scales you pass (passes/apply_precision.py). V
given K-major (``[.., D, S]``, how fp8 tensor cores read it) needs no copy at all;
given row-major it takes one transpose kernel. bench/fp8_attention.py times both.
"""

from __future__ import annotations

import math

import torch


def caller_attention(q8, k8, v8, sq, sk, sv):
    """softmax(q k^T / sqrt(d)) v on E4M3FN q8, k8, v8 and their dequantization factors."""
    d = q8.shape[-1]
    s = torch.matmul(q8.float(), k8.float().transpose(-2, -1)) * (sq * sk / math.sqrt(d))
    return (torch.matmul(torch.softmax(s, dim=-1), v8.float()) * sv).to(torch.bfloat16)


def caller_attention_vt(q8, k8, v8t, sq, sk, sv):
    """caller_attention with V stored K-major ([.., D, S])."""
    d = q8.shape[-1]
    s = torch.matmul(q8.float(), k8.float().transpose(-2, -1)) * (sq * sk / math.sqrt(d))
    return (torch.matmul(torch.softmax(s, dim=-1), v8t.float().transpose(-2, -1)) * sv).to(torch.bfloat16)
