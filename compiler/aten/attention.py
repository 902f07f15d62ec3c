"""The handler of ``F.scaled_dot_product_attention``: the attention chain kf-fuse
recognizes (passes/fuse.py), ``softmax(q @ k^T * scale [masked]) @ v``, so SDPA is one
attention kernel on the GPU targets and linalg on the cpu.

The causal mask is ``key > query`` over two ``kf.iota`` (torch's ``ones(L, S).tril()``,
top-left aligned) filled with -inf, computed in the kernel (the block table of the
Hopper kernel skips the blocks above the diagonal); a bool ``attn_mask`` fills with -inf
where it is False, a float one is added. torch gives 0, not NaN, for a query row whose
every score is -inf (its safe softmax): with a bool mask kf zeroes the rows the mask
masks everywhere, with a float mask the rows where it is -inf everywhere."""

from __future__ import annotations

import math

import torch

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import handles, rank_of, shape_of
from .reductions import bound_args


def _repeat_heads(x, groups: int):
    """x [..., H, S, E] with each head repeated groups times in place ([..., H * groups,
    S, E]): torch's repeat_interleave along the heads for grouped-query attention."""
    *lead, h, s, e = shape_of(x)
    x = kb.reshape(x, (*lead, h, 1, s, e))
    x = kb.broadcast_to(x, (*lead, h, groups, s, e))
    return kb.reshape(x, (*lead, h * groups, s, e))


@handles("aten.scaled_dot_product_attention.default")
def _sdpa(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    q, k, v, mask = p["query"], p["key"], p["value"], p["attn_mask"]
    if float(p["dropout_p"] or 0.0) != 0.0:
        raise Unsupported(f"scaled_dot_product_attention with dropout_p={p['dropout_p']} is not supported by kf",
                          cause="pass dropout_p=0.0 (a module passes it only while training: "
                                "call model.eval()), or apply F.dropout to the attention weights")
    if p["is_causal"] and mask is not None:
        raise Unsupported("scaled_dot_product_attention with both attn_mask and is_causal=True",
                          cause="torch refuses it too: fold the causal mask into attn_mask")
    elem = c.out_elem(node)
    q, k, v = (c.tensor(t, elem) for t in (q, k, v))
    if min(rank_of(q), rank_of(k), rank_of(v)) < 2:
        raise Unsupported("scaled_dot_product_attention needs query, key and value of 2 or more dimensions")
    if p.get("enable_gqa") and rank_of(q) >= 3 and rank_of(k) >= 3:
        hq, hk = shape_of(q)[-3], shape_of(k)[-3]
        if hq != hk and (hk == 0 or hq % hk):
            raise Unsupported(f"scaled_dot_product_attention with {hq} query heads and {hk} key heads",
                              cause="enable_gqa needs the query heads to be a multiple of the key heads")
        if hq != hk:
            k, v = _repeat_heads(k, hq // hk), _repeat_heads(v, hq // hk)
    scale = p["scale"]
    scale = 1.0 / math.sqrt(shape_of(q)[-1]) if scale is None else float(scale)
    kt = kb.transpose(k, perm=[*range(rank_of(k) - 2), rank_of(k) - 1, rank_of(k) - 2])
    # 16-bit inputs: the scores, the mask and the softmax in f32, P rounded to the type
    # for the second product, as torch's fused kernels compute them (rounding the scores
    # to bf16 put kf's results ten times further from float64 than eager's)
    inner = "f32" if elem in ("bf16", "f16") else elem
    qk = kb.matmul(q, kt)
    if inner != elem:  # the same product, accumulated and kept in f32
        narrow = qk
        qk = kb.build("matmul", [q, kt], None, [spec_of(narrow.type).with_elem(inner)]).result
        narrow.owner.erase()
    scores = kb.mul(qk, kb.scalar(scale, inner))
    rows, cols = shape_of(scores)[-2:]
    keep = None  # where the bool mask keeps a score
    if p["is_causal"]:
        above = kb.cmp(kb.sub(kb.iota((1, cols), 1), kb.iota((rows, 1), 0)), kb.scalar(0, "i64"), predicate="gt")
        scores = kb.masked_fill(scores, above, value=float("-inf"))
    elif mask is not None and spec_of(mask.type).elem == "i1":
        keep = mask
        scores = kb.masked_fill(scores, kb.cmp(mask, kb.scalar(False, "i1"), predicate="eq"), value=float("-inf"))
    elif mask is not None:
        mask = c.tensor(mask, elem)
        scores = kb.add(scores, mask if inner == elem else kb.cast(mask, inner))
        keep = kb.cmp(mask, kb.scalar(float("-inf"), elem), predicate="ne")
    probs = kb.softmax(scores, dim=-1)
    out = kb.matmul(probs if inner == elem else kb.cast(probs, elem), v)
    if keep is not None:
        # rows with a score the mask keeps: any over the keys, as a max of 0/1
        live = kb.reduce_max(kb.cast(keep, "i32"), dims=[rank_of(keep) - 1], keepdim=True)
        live = kb.cmp(live, kb.scalar(0, "i32"), predicate="gt")
        out = kb.select(live, out, kb.scalar(0.0, elem))
    return out


def sdpa_in_torch_ops(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                      enable_gqa=False):
    """scaled_dot_product_attention written with the torch ops kf's attention chain is
    made of: the decomposition kf's autograd traces the joint graph with (torch's own
    goes through its fused CPU kernel, whose backward kf has no op for), so the forward
    is the attention kernel and its backward the ops kf differentiates it into. Masked
    scores take the type's lowest finite value, not -inf, so that a row masked everywhere
    is finite (uniform) before it is zeroed, and its gradients are 0 rather than NaN."""
    if dropout_p or (is_causal and attn_mask is not None) or query.dim() < 3:
        return NotImplemented
    if enable_gqa and query.shape[-3] != key.shape[-3]:
        if key.shape[-3] == 0 or query.shape[-3] % key.shape[-3]:
            return NotImplemented
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    rows, cols = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    low = torch.finfo(scores.dtype).min
    live = None
    if is_causal:
        # key > query, from two aranges (torch's tril decomposes into ops kf lacks)
        above = torch.arange(cols, device=query.device) > torch.arange(rows, device=query.device)[:, None]
        scores = scores.masked_fill(above, low)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(attn_mask.logical_not(), low)
        live = attn_mask.amax(-1, keepdim=True)
    elif attn_mask is not None:
        scores = scores + attn_mask.clamp_min(low).to(scores.dtype)
        live = (attn_mask != float("-inf")).amax(-1, keepdim=True)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    return out if live is None else out.masked_fill(live.logical_not(), 0.0)


class SdpaAsTorchOps(torch.overrides.TorchFunctionMode):
    """Calls of F.scaled_dot_product_attention run as ``sdpa_in_torch_ops`` (where it
    applies): the mode kf's autograd traces the joint graph in. A decomposition table
    cannot do it: the op decomposes into torch's fused CPU kernel before it reaches one."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            out = sdpa_in_torch_ops(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)
