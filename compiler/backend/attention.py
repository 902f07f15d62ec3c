"""``F.scaled_dot_product_attention`` as a kf function: one op in AOTAutograd's graphs.

Called from a rewritten Dynamo graph (rewrites.py), ``attention`` is a kf function --
a ``torch.library`` custom op with kf's own backward (compiler/autograd.py) -- so
AOTAutograd's forward graph holds one ``kf::attention_<hash>`` op and its backward
graph one ``kf::attention_<hash>_backward``. Each op is its own kf program (compiled
per shape by the kf function); the backend leaves it to the fallback, which calls it as
it is.

A kf function's op under torch.compile saves only its inputs: its split into a forward
that returns what the backward needs and that backward is made at one concrete shape
(compiler/torch_ops.py), and AOTAutograd traces it at symbolic ones, so its backward
recomputes the forward -- for attention, the score matrix, and for every key block
again. Attention's saved values are known without the split: O and the row logsumexp
(f32; f64 for f64). So where a gradient is wanted, the rewritten SDPA call is
``kf::attention_train`` (``attention_train``). Its forward is the kf function
``attention_lse``, which returns both (one attention kernel that also writes the
logsumexp; its program serves new lengths). Its backward, ``kf::attention_train_backward``,
runs the backward of the split kf's autograd makes at the call's concrete shape
(FlashAttention's scheme: D = rowsum(dO * O), dK/dV and dQ from P recomputed with the
logsumexp). A call whose split saves anything else falls back to the recomputing
backward.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..api import KfFunction
from ..options import Options
from ..partition import lse_dtype


def attention(q, k, v, mask, scale: float, causal: bool):
    """softmax(q k^T * scale, masked) v: the top-left causal mask where ``causal``, and a
    boolean (keep where True) or additive ``mask`` where given; 0 in a query row that the
    mask masks everywhere, as torch's safe softmax."""
    out = attention_rows(q, k, v, mask, scale, causal)
    return out if mask is None else out.masked_fill(_live_rows(mask).logical_not(), 0.0)


def attention_rows(q, k, v, mask, scale: float, causal: bool):
    """``attention`` but for the rows the mask masks everywhere, which hold the mean of v
    (their scores are uniform, see ``_scores``). The training path's split is of this
    function: its forward saves only O and the logsumexp, and ``attention_train`` zeroes
    those rows and their gradient outside it."""
    scores = _scores(q, k, mask, scale, causal)
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), _heads(v, q))


def attention_lse(q, k, v, mask, scale: float, causal: bool):
    """(``attention_rows``, the row logsumexp of its scaled and masked scores): what the
    split forward returns, as a kf function of its own, so that new lengths reuse its
    program (kf's automatic dynamic) instead of tracing and compiling a split at each."""
    from ..partition import logsumexp

    scores = _scores(q, k, mask, scale, causal)
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), _heads(v, q)), logsumexp(scores, [-1], True)


def _heads(t, q):
    """k or v with q's heads: grouped-query attention's each k/v head serves q.shape[-3] //
    t.shape[-3] of them."""
    return t if t.shape[-3] == q.shape[-3] else t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)


def _scores(q, k, mask, scale: float, causal: bool):
    """The scaled and masked scores. The mask fills with the type's lowest finite value,
    not -inf: a query row that it masks everywhere (a left-padded batch's first rows
    under a padding mask) stays finite, and so do its logsumexp and gradients."""
    k = _heads(k, q)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:  # top-left: every row keeps its first key
        keep = torch.arange(q.shape[-2], device=q.device)[:, None] >= torch.arange(k.shape[-2], device=q.device)[None, :]
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if mask is not None:
        low = torch.finfo(scores.dtype).min
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), low)
        else:
            # an f32 mask on 16-bit scores is added in f32, as torch's fused kernels add it
            wide = torch.promote_types(scores.dtype, mask.dtype)
            scores = scores.to(wide) + mask.to(wide).clamp_min(torch.finfo(wide).min)
    return scores


def _live_rows(mask):
    """Where the mask keeps some key of a query row ([..., Sq, 1], bool)."""
    keep = mask if mask.dtype == torch.bool else mask != float("-inf")
    return keep.amax(-1, keepdim=True)


def _lse_shape(q) -> tuple:
    """The row logsumexp's shape, as kf's autograd saves it: [..., Sq, 1]."""
    return (*q.shape[:-1], 1)


_FUNCTIONS: dict[tuple, KfFunction] = {}


def for_options(options: Options, fn=attention) -> KfFunction:
    """The attention kf function (or ``attention_lse``'s) for a target and precision (one
    torch op each)."""
    key = (fn.__name__, options.target, options.precision)
    kfn = _FUNCTIONS.get(key)
    if kfn is None:
        kfn = _FUNCTIONS[key] = KfFunction(fn, Options(target=options.target, precision=options.precision))
    return kfn


def _split(q, k, v, mask, scale: float, causal: bool, target: str, precision: str):
    """(the attention kf function, its flat tensors, the split training at their shapes, or
    None where that split saves more than O and the logsumexp)."""
    from .. import torch_ops

    fn = for_options(Options(target=target, precision=precision), attention_rows)
    tensors, structure = torch_ops.flatten_call(fn, (q, k, v, mask, scale, causal), {})
    wants = tuple(t.is_floating_point() and i < 3 for i, t in enumerate(tensors))
    with torch_ops._opaque():  # a custom op's body runs below autograd; the split traces with it
        training, _ = torch_ops.training_of(fn, structure, tensors, wants)
    lse = (_lse_shape(q), lse_dtype(q.dtype))
    fits = (training.forward is not None and training.n_outputs == 1 and tuple(training.saved_outputs) == (0,)
            and [(tuple(shape), dtype) for shape, dtype, _ in training.extras] == [lse])
    return fn, tensors, structure, wants, (training if fits else None)


@torch.library.custom_op("kf::attention_train", mutates_args=())
def _attention_train(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                     scale: float, causal: bool, target: str, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, the row logsumexp of the scaled and masked scores). O is 0 in the rows that the
    mask masks everywhere."""
    from .. import torch_ops

    fn, tensors, _, _, training = _split(q, k, v, mask, scale, causal, target, precision)
    if training is None:  # the backward recomputes: no logsumexp to give it
        with torch_ops._opaque():
            out = fn(q, k, v, mask, scale, causal)
        lse = q.new_empty(_lse_shape(q), dtype=lse_dtype(q.dtype))
    else:
        with torch_ops._opaque():
            out, lse = for_options(Options(target=target, precision=precision), attention_lse)(
                q, k, v, mask, scale, causal)
    out = out.contiguous()
    if mask is not None:
        out.masked_fill_(_live_rows(mask).logical_not(), 0.0)
    return out, lse.contiguous()


@_attention_train.register_fake
def _(q, k, v, mask, scale, causal, target, precision):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(_lse_shape(q), dtype=lse_dtype(q.dtype)))


@torch.library.custom_op("kf::attention_train_backward", mutates_args=())
def _attention_train_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                              out: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor, scale: float, causal: bool,
                              target: str, precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the forward's O and logsumexp, or by recomputing the forward where
    its split saves more than those.

    Grouped-query attention's k and v (fewer heads than q) are given to the backward with
    q's heads, and their gradients summed over each group after: the backward of the
    heads' repeat inside the function would carry the [..., Sq, Sk] probabilities between
    kernels, which no program of run-time lengths can (kf-tile plans one run-time size a
    result), so each new length would compile."""
    from .. import torch_ops

    kv_heads = k.shape[-3]
    if kv_heads != q.shape[-3]:
        k, v = _heads(k, q), _heads(v, q)
    fn, tensors, structure, wants, training = _split(q, k, v, mask, scale, causal, target, precision)
    if mask is not None:  # the rows the forward zeroed take no gradient
        grad = grad.masked_fill(_live_rows(mask).logical_not(), 0.0)
    with torch_ops._opaque():
        if training is not None:
            got = training.backward(training.saved(tensors, [out, lse]), [grad])
        else:
            got = torch_ops._backward_of(fn, structure, tensors, [grad], wants)(tensors, [grad])
    dq, dk, dv = got[:3]
    if kv_heads != q.shape[-3]:
        dk, dv = (_group_sum(g, kv_heads) for g in (dk, dv))
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


def _group_sum(grad, kv_heads: int):
    """The gradient of ``_heads``' repeat: each kv head's is the sum over the q heads it
    serves (consecutive ones, as ``repeat_interleave`` lays them out)."""
    *batch, heads, n, d = grad.shape
    return grad.reshape(*batch, kv_heads, heads // kv_heads, n, d).sum(-3)


@_attention_train_backward.register_fake
def _(q, k, v, mask, out, lse, grad, scale, causal, target, precision):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # row-major, as the real results


def _setup(ctx, inputs, output):
    q, k, v, mask, scale, causal, target, precision = inputs
    ctx.save_for_backward(q, k, v, mask, output[0], output[1])
    ctx.args = (scale, causal, target, precision)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_train_backward(q, k, v, mask, out, lse, grad_out, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


_attention_train.register_autograd(_backward, setup_context=_setup)


def attention_train(options: Options, q, k, v, mask, scale: float, causal: bool):
    """Attention whose forward saves O and the row logsumexp for its backward (the module
    docstring); for a call where q, k or v wants a gradient and the mask wants none."""
    out, _ = _attention_train(q, k, v, mask, scale, causal, options.target, options.precision)
    return out
