"""Rewrites of Dynamo's graph before AOTAutograd traces it.

``F.scaled_dot_product_attention`` becomes its math form (scores, scale, causal or given
mask, softmax, product with V). Left alone, AOTAutograd would trace it to the device's
fused attention op (``_scaled_dot_product_flash_attention_for_cpu``, the CUDA flash and
efficient kernels) whose backward is another fused op kf has no table entry for; and the
decomposition torch keeps for the forward returns the attention weights where the backward
expects the row logsumexp (it is meant for export, not training). In the math form autograd
derives the backward from the same ops, and kf-fuse recognizes the attention pattern (and
its backward) in the forward and backward graphs. Calls with dropout keep the fused op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention without dropout, written with ops kf has."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    if is_causal:
        # the top-left causal mask SDPA uses: query i sees keys 0..i
        rows = torch.arange(q_len, device=query.device)
        cols = torch.arange(k_len, device=query.device)
        keep = rows[:, None] >= cols[None, :]
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def _dropout(node: torch.fx.Node) -> bool:
    p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
    return not (isinstance(p, (int, float)) and p == 0.0)


def attention_as_math(gm: torch.fx.GraphModule) -> int:
    """Point each dropout-free SDPA call of gm at ``sdpa_math``; the number rewritten."""
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA and not _dropout(node):
            node.target = sdpa_math
            n += 1
    if n:
        gm.recompile()
    return n
