"""Rewrites of Dynamo's graph before AOTAutograd traces it.

``F.scaled_dot_product_attention`` without dropout becomes kf's attention: by default
(``attention="kf"``) a call of the kf function of attention.py, one op with kf's fused
backward; with ``attention="math"`` its math form (scores, scale, causal or given mask,
softmax, product with V), which AOTAutograd differentiates op by op and the partitioner
puts into kf regions with the ops around it. Left alone, AOTAutograd would trace it to the
device's fused attention op (``_scaled_dot_product_flash_attention_for_cpu``, the CUDA
flash and efficient kernels), whose backward is another fused op kf has no table entry
for; and the decomposition torch keeps for the forward returns the attention weights
where the backward expects the row logsumexp (it is meant for export, not training).
Calls with dropout keep the fused op.
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


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def kf_attention(kfn):
    """An SDPA-signature call of the attention kf function ``kfn`` (attention.py)."""
    def call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        return kfn(query, key, value, attn_mask, s, bool(is_causal))

    call.__name__ = "kf_attention"
    return call


def attention(gm: torch.fx.GraphModule, how: str, options=None) -> int:
    """Point each dropout-free SDPA call of gm at kf's attention function (``how="kf"``)
    or at ``sdpa_math`` (``how="math"``); the number rewritten."""
    target = sdpa_math
    if how == "kf":
        from .attention import for_options

        target = kf_attention(for_options(options))
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA and not _dropout(node):
            node.target = target
            n += 1
    if n:
        gm.recompile()
    return n
