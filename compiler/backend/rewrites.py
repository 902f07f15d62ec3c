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

``cross_entropy(linear(h, W, b) [-> view/reshape/float], target)``, the loss as language
models write it, becomes kf's fused linear cross-entropy (``kf.nn``, ``loss="chunked"``,
the default) where nothing else reads the logits: one op in the forward graph that
computes the loss and the gradients chunk by chunk, and their scaling in the backward
graph, so no tokens x vocabulary tensor exists in either. Done here, on Dynamo's graph,
because the pattern is still whole: AOTAutograd would split it into a matmul, a
log-softmax and an NLL in the forward and their gradients in the backward.
"""

from __future__ import annotations

import inspect
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


def kf_attention(kfn, options=None):
    """An SDPA-signature call of the attention kf function ``kfn`` (attention.py); where a
    gradient is wanted (and not the mask's), ``attention_train``, whose forward saves O and
    the row logsumexp for the fused backward."""
    def call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        if (options is not None and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
                and (attn_mask is None or not attn_mask.requires_grad)):
            from .attention import attention_train

            return attention_train(options, query, key, value, attn_mask, s, bool(is_causal))
        return kfn(query, key, value, attn_mask, s, bool(is_causal))

    call.__name__ = "kf_attention"
    return call


def attention(gm: torch.fx.GraphModule, how: str, options=None) -> int:
    """Point each dropout-free SDPA call of gm at kf's attention function (``how="kf"``)
    or at ``sdpa_math`` (``how="math"``); the number rewritten."""
    target = sdpa_math
    if how == "kf":
        from .attention import for_options

        target = kf_attention(for_options(options), options)
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA and not _dropout(node):
            node.target = target
            n += 1
    if n:
        gm.recompile()
    return n


# ------------------------------------------------------------------ the loss

_CROSS_ENTROPY = {F.cross_entropy}
_LINEAR = {F.linear, torch._C._nn.linear}
#: methods between the last linear and the cross-entropy that keep each logit row a row
_RESHAPES = {"view", "reshape", "contiguous"}
_CE_PARAMS = inspect.signature(F.cross_entropy)


def kf_linear_cross_entropy(options):
    """A call of kf.nn.fused_linear_cross_entropy on the backend's target and precision,
    taking the pattern's pieces."""
    from ..nn import fused_linear_cross_entropy

    def call(hidden, weight, bias, target, ignore_index, reduction, label_smoothing, loss_dtype):
        hidden = hidden.reshape(-1, hidden.shape[-1])  # the logits' rows, as cross_entropy reads them
        return fused_linear_cross_entropy(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                                          loss_dtype=loss_dtype, target_name=options.target,
                                          precision=options.precision)

    call.__name__ = "kf_linear_cross_entropy"
    return call


def _val(node):
    v = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _match_loss(node: torch.fx.Node):
    """(linear node, the loss's dtype or None, the nodes between, the bound arguments) where
    ``node`` is ``cross_entropy(linear(h, W, b) [-> view/reshape/float], target)`` with class
    indices, no class weights, mean or sum, and logits used by nothing else; else a reason
    (str) why not, or None where node is no such pattern at all."""
    try:
        args = _CE_PARAMS.bind(*node.args, **node.kwargs).arguments
    except TypeError:
        return None
    x, between, dtype = args["input"], [], None
    while isinstance(x, torch.fx.Node) and x.op == "call_method" and (
            x.target in _RESHAPES or x.target == "float"
            or (x.target == "to" and len(x.args) == 2 and not x.kwargs and x.args[1] == torch.float32)):
        if x.target in ("float", "to"):
            dtype = torch.float32
        between.append(x)
        x = x.args[0]
    if not (isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in _LINEAR):
        return None
    logits, ce_in, target = _val(x), _val(args["input"]), _val(args["target"])
    if any(len(n.users) != 1 for n in [x, *between]):
        return "the logits are used besides the loss (returned or read elsewhere): they exist whole anyway"
    if args.get("weight") is not None or args.get("size_average") is not None or args.get("reduce") is not None:
        return "cross_entropy with class weights or the old size_average/reduce arguments"
    if args.get("reduction", "mean") not in ("mean", "sum"):
        return f"reduction={args.get('reduction')!r} (the fused loss reduces: mean or sum)"
    if not isinstance(args.get("ignore_index", -100), int) or not isinstance(args.get("label_smoothing", 0.0),
                                                                              (int, float)):
        return "ignore_index or label_smoothing is not a constant"
    if logits is None or ce_in is None or target is None:
        return "no example values on the graph's nodes"
    if ce_in.dim() != 2 or target.dim() != 1 or target.dtype.is_floating_point or ce_in.shape[-1] != logits.shape[-1]:
        return "cross_entropy's input is not the logits' rows (N, vocab) with class indices"
    return x, dtype, between, args


def linear_cross_entropy(gm: torch.fx.GraphModule, how: str, options=None) -> int:
    """With ``how="chunked"``, each ``cross_entropy(linear(h, W, b) [-> view/reshape/float],
    target)`` of gm whose logits nothing else reads becomes one call of kf's fused linear
    cross-entropy (kf.nn): no vocabulary-sized logits in either graph. The number rewritten;
    patterns left as they are are logged with the reason."""
    from .. import logs

    if how != "chunked":
        return 0
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _CROSS_ENTROPY:
            continue
        found = _match_loss(node)
        if found is None:
            continue
        if isinstance(found, str):
            logs.backend_log.info("cross_entropy (%s) keeps its logits: %s", node.name, found)
            continue
        linear, dtype, between, args = found
        hidden, weight = linear.args[0], linear.args[1]
        bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
        loss_dtype = dtype or _val(linear).dtype
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(
                kf_linear_cross_entropy(options),
                (hidden, weight, bias, args["target"], args.get("ignore_index", -100),
                 args.get("reduction", "mean"), float(args.get("label_smoothing", 0.0)), loss_dtype))
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        for dead in [node, *between, linear]:
            gm.graph.erase_node(dead)
        logs.backend_log.info("cross_entropy (%s) and its linear (%s) run as kf's fused linear cross-entropy",
                              node.name, linear.name)
        n += 1
    if n:
        gm.recompile()
    return n
