"""``F.scaled_dot_product_attention`` as a kf function: one op in AOTAutograd's graphs.

Called from a rewritten Dynamo graph (rewrites.py), ``attention`` is a kf function --
a ``torch.library`` custom op with kf's own backward (compiler/autograd.py) -- so
AOTAutograd's forward graph holds one ``kf::attention_<hash>`` op and its backward
graph one ``kf::attention_<hash>_backward``: the forward saves q, k, v, O and the
row logsumexp and the backward recomputes the probabilities inside its kernels, as
FlashAttention does, instead of the math form's score matrix saved between the two
graphs. Each op is its own kf program (compiled per shape by the kf function); the
backend leaves it to the fallback, which calls it as it is.
"""

from __future__ import annotations

import torch

from ..api import KfFunction
from ..options import Options


def attention(q, k, v, mask, scale: float, causal: bool):
    """softmax(q k^T * scale, masked) v: the top-left causal mask where ``causal``, and a
    boolean (keep where True) or additive ``mask`` where given."""
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each k/v head serves q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.arange(q.shape[-2], device=q.device)[:, None] >= torch.arange(k.shape[-2], device=q.device)[None, :]
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


_FUNCTIONS: dict[tuple, KfFunction] = {}


def for_options(options: Options) -> KfFunction:
    """The attention kf function for a target and precision (one torch op each)."""
    key = (options.target, options.precision)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = KfFunction(attention, Options(target=options.target, precision=options.precision))
    return fn
