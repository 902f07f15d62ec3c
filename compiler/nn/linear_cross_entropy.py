"""``F.cross_entropy(F.linear(hidden, weight, bias), target)`` without vocabulary-sized logits.

A language model's loss multiplies every token's hidden state by the output embedding
(tokens x vocab logits: 4096 tokens of a 128k vocabulary are 2 GiB in float32, and the
softmax and its gradient as much again). Here the rows (tokens) go in chunks, as Liger
Kernel's fused linear cross-entropy does: for each chunk one kf program computes the
chunk's logits, their row logsumexp, the chunk's loss, and the gradient of the logits
(``softmax - onehot``, scaled by the reduction), then at once the chunk's gradient of
``hidden`` (``dlogits @ weight``) and adds ``dlogits^T @ hidden`` to the gradient of
``weight`` (and the column sums to that of ``bias``). Only one chunk's logits exist at a
time. The forward so computes the gradients; the backward only scales them by the
incoming gradient (a scalar: the loss is reduced).

It is one ``torch.library`` custom op, ``kf::linear_cross_entropy``: AOTAutograd's forward
graph holds it whole and its backward graph the scaling, so ``torch.compile(backend="kf")``
can put it in place of the ``linear -> view -> cross_entropy`` pattern (backend/rewrites.py).
The gradients are computed only where one is needed (grad mode on and an input that
requires grad).

Numerics: the logits are rounded to the inputs' dtype (as ``F.linear`` rounds them), the
logsumexp, loss and softmax are float32, the gradient of the logits is rounded to the
inputs' dtype for the two products (as eager's backward does), and the weight's and bias's
gradients add up in float32 across chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..options import Options

REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class ChunkPlan:
    """How the rows are cut: ``rows`` per chunk (the last chunk takes what is left)."""

    rows: int

    def chunks(self, tokens: int) -> list[tuple[int, int]]:
        return [(s, min(s + self.rows, tokens)) for s in range(0, tokens, self.rows)]


#: rows a chunk takes at least where the tokens make MIN_CHUNKS chunks of them: the
#: gradient of the hidden states, rows x hidden, is a GEMM whose reduction runs the whole
#: vocabulary, and kf's GEMM does not split a reduction across blocks, so its output tiles
#: are all the GPU gets (128 rows x 768 are 6 tiles of 128 x 128 for 132 multiprocessors)
FILL_ROWS = 1024
#: chunks a loss takes at least, so that a chunk's logits are at most this part of them all
MIN_CHUNKS = 8


def plan_chunks(tokens: int, vocab: int, hidden: int) -> ChunkPlan:
    """A chunk's logits about as large as ``hidden`` itself (tokens x hidden elements), as
    Liger chooses (``ceil(vocab / hidden)`` chunks), but at least FILL_ROWS rows where
    that leaves MIN_CHUNKS chunks; rows rounded to a power of two (few distinct shapes,
    so few programs)."""
    if tokens <= 0:
        return ChunkPlan(1)
    parts = max(1, math.ceil(vocab / max(hidden, 1)))
    rows = 1 << max(0, math.ceil(tokens / parts) - 1).bit_length()
    fill = min(FILL_ROWS, 1 << max(0, (tokens // MIN_CHUNKS).bit_length() - 1))
    return ChunkPlan(max(1, min(max(rows, fill), tokens)))


# ------------------------------------------------------------------ the kf functions


def _rows(h, w, b, t, ignore_index: int, smoothing: float):
    """A chunk's float32 logits, which rows count, their one-hot targets, row logsumexp
    and row losses (not yet zeroed where ignored). Row statistics keep their row dim
    (keepdim): they broadcast over the vocabulary without a view between the reduction
    and its users."""
    logits = h @ w.t()
    if b is not None:
        logits = logits + b
    z = logits.float()
    valid = t[:, None] != ignore_index
    safe = torch.where(t != ignore_index, t, torch.zeros_like(t))
    onehot = torch.nn.functional.one_hot(safe, z.shape[1]).float()  # checks each target's range
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    picked = (z * onehot).sum(dim=-1, keepdim=True)
    row = lse - (1.0 - smoothing) * picked - smoothing * z.mean(dim=-1, keepdim=True)
    return z, valid, onehot, lse, row


def _chunk(h, w, b, t, loss_acc, dw_acc, db_acc, scale, ignore_index: int, smoothing: float):
    """One chunk: the loss added to ``loss_acc`` (already scaled by ``scale``), the
    gradient of ``h``, and those of ``w`` and ``b`` added to their float32 accumulators."""
    z, valid, onehot, lse, row = _rows(h, w, b, t, ignore_index, smoothing)
    target = (1.0 - smoothing) * onehot + smoothing / z.shape[1]
    row = torch.where(valid, row, 0.0)
    g = (torch.exp(z - lse) - target) * torch.where(valid, scale, 0.0)
    g = g.to(h.dtype)
    dh = g @ w
    dw = dw_acc + (g.t() @ h).float()
    loss = loss_acc + row.sum() * scale
    if b is None:
        return loss, dh, dw
    return loss, dh, dw, db_acc + g.float().sum(dim=0)


def _loss_only(h, w, b, t, loss_acc, scale, ignore_index: int, smoothing: float):
    """One chunk's loss, added to ``loss_acc``, where no gradient is wanted."""
    _, valid, _, _, row = _rows(h, w, b, t, ignore_index, smoothing)
    return loss_acc + torch.where(valid, row, 0.0).sum() * scale


def _mean_scale(t, ignore_index: int):
    """1 / the number of rows not ignored (inf where none is: the mean is then nan, as
    torch's)."""
    return 1.0 / (t != ignore_index).sum().float()


_FUNCTIONS: dict[tuple, dict] = {}


def functions(target: str, precision: str = "auto") -> dict:
    """The kf functions for a target and precision (compiled per shape on first use)."""
    from ..api import KfFunction

    key = (target, precision)
    fns = _FUNCTIONS.get(key)
    if fns is None:
        # the chunks' functions take static sizes: every chunk has the plan's rows (the
        # last one padded, _padded), and the weight's gradient sums over the rows, which a
        # run-time size would keep static; the count of targets takes the tokens' number
        opts = Options(target=target, precision=precision, dynamic=False)
        fns = _FUNCTIONS[key] = {f.__name__: KfFunction(f, opts, torch_op=False) for f in (_chunk, _loss_only)}
        fns["_mean_scale"] = KfFunction(_mean_scale, Options(target=target, precision=precision), torch_op=False)
    return fns


# ------------------------------------------------------------------ the op


def _check(hidden, weight, bias, target, ignore_index, reduction, label_smoothing):
    from ..errors import SignatureError

    where = "kf.nn.fused_linear_cross_entropy"
    if reduction not in REDUCTIONS:
        raise SignatureError(f"{where}: reduction must be 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise SignatureError(f"{where}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if weight.dim() != 2:
        raise SignatureError(f"{where}: weight must be 2-D (vocab, hidden), got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise SignatureError(f"{where}: hidden's last dim must be weight's second, "
                             f"got hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise SignatureError(f"{where}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise SignatureError(f"{where}: target must hold class indices (an integer dtype), got {target.dtype}; "
                             f"class probabilities are not supported")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise SignatureError(f"{where}: target must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
                             f"got {tuple(target.shape)}")
    if hidden.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise SignatureError(f"{where}: hidden, weight and bias must have one dtype, got {hidden.dtype} and "
                             f"{weight.dtype}" + (f" and {bias.dtype}" if bias is not None else ""))


def _run(fn, *args):
    """A kf function called outside the caller's dispatch modes and tracing context (it
    compiles by tracing; AOTAutograd runs its graphs under a mode of its own)."""
    from ..torch_ops import _opaque

    with _opaque():
        return fn(*args)


def _padded(h: torch.Tensor, t: torch.Tensor, s: int, e: int, chunks: list, plan: ChunkPlan,
            ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows s:e of h and t, padded with zero rows whose targets are ``ignore_index`` (they
    add nothing to the loss or the gradients) so that chunks have few row counts, each
    one program whatever the number of tokens: the last of several chunks takes the
    plan's rows, a single chunk the next power of two."""
    n = e - s
    m = plan.rows if len(chunks) > 1 else 1 << (n - 1).bit_length()
    if m <= n:
        return h[s:e], t[s:e]
    h_c = h.new_zeros((m, h.shape[1]))
    h_c[:n].copy_(h[s:e])
    t_c = t.new_full((m,), ignore_index)
    t_c[:n].copy_(t[s:e])
    return h_c, t_c


def _nothing(like: torch.Tensor) -> torch.Tensor:
    """A fresh empty tensor for a gradient not computed (a custom op's outputs may not
    alias one another)."""
    return like.new_empty(0)


@torch.library.custom_op("kf::linear_cross_entropy", mutates_args=())
def _op(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
        ignore_index: int, reduction: str, label_smoothing: float, loss_dtype: torch.dtype, grads: bool,
        kf_target: str, precision: str, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
    """(loss, grad of hidden, grad of weight, grad of bias) for a loss gradient of 1; the
    three gradients empty where ``grads`` is false, and the bias's where there is none."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1)
    tokens, vocab = h.shape[0], weight.shape[0]
    fns = functions(kf_target, precision)
    f32 = dict(dtype=torch.float32, device=hidden.device)
    if tokens == 0:  # torch: the mean over no rows is nan, the sum 0; nothing to differentiate
        loss = torch.full((), math.nan if reduction == "mean" else 0.0, **f32).to(loss_dtype)
        if not grads:
            return loss, _nothing(hidden), _nothing(hidden), _nothing(hidden)
        return (loss, torch.zeros_like(hidden), torch.zeros_like(weight),
                torch.zeros_like(bias) if bias is not None else _nothing(hidden))
    h = h.contiguous()
    t = t.contiguous().long()  # one_hot takes int64 indices
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else None
    scale = _run(fns["_mean_scale"], t, ignore_index) if reduction == "mean" else torch.ones((), **f32)
    plan = ChunkPlan(chunk_rows) if chunk_rows > 0 else plan_chunks(tokens, vocab, h.shape[1])
    loss = torch.zeros((), **f32)
    chunks = plan.chunks(tokens)
    if not grads:
        for s, e in chunks:
            h_c, t_c = _padded(h, t, s, e, chunks, plan, ignore_index)
            loss = _run(fns["_loss_only"], h_c, w, b, t_c, loss, scale, ignore_index, float(label_smoothing))
        return loss.to(loss_dtype), _nothing(hidden), _nothing(hidden), _nothing(hidden)
    dh = torch.empty_like(h)
    dw = torch.zeros(w.shape, **f32)
    db = torch.zeros((vocab,), **f32) if b is not None else None
    for s, e in chunks:
        h_c, t_c = _padded(h, t, s, e, chunks, plan, ignore_index)
        out = _run(fns["_chunk"], h_c, w, b, t_c, loss, dw, db, scale, ignore_index, float(label_smoothing))
        loss, dh_c, dw = out[:3]
        if b is not None:
            db = out[3]
        dh[s:e].copy_(dh_c[:e - s])
    return (loss.to(loss_dtype), dh.view(hidden.shape), dw.to(weight.dtype),
            db.to(bias.dtype) if b is not None else _nothing(hidden))


@_op.register_fake
def _(hidden, weight, bias, target, ignore_index, reduction, label_smoothing, loss_dtype, grads, kf_target,
      precision, chunk_rows):
    loss = hidden.new_empty((), dtype=loss_dtype)
    if not grads:
        return loss, _nothing(hidden), _nothing(hidden), _nothing(hidden)
    return (loss, torch.empty_like(hidden), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else _nothing(hidden))


def _setup(ctx, inputs, output):
    ctx.has_bias = inputs[2] is not None
    ctx.save_for_backward(*output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_loss, *_):
    dh, dw, db = ctx.saved_tensors
    g = grad_loss.float()
    # the loss is a scalar: its gradient scales each saved one
    return ((dh * g).to(dh.dtype), (dw * g).to(dw.dtype), (db * g).to(db.dtype) if ctx.has_bias else None,
            None, None, None, None, None, None, None, None, None)


_op.register_autograd(_backward, setup_context=_setup)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: torch.Tensor | None = None, ignore_index: int = -100,
                               reduction: str = "mean", label_smoothing: float = 0.0, *,
                               loss_dtype: torch.dtype | None = None, target_name: str | None = None,
                               precision: str = "auto", chunk_rows: int = 0) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).flatten(0, -2), target.flatten(),
    ignore_index=, reduction=, label_smoothing=)`` computed in chunks of rows (the module
    docstring says how), differentiable in ``hidden``, ``weight`` and ``bias``.

    ``hidden`` is ``(..., H)``, ``weight`` ``(V, H)``, ``bias`` ``(V,)``, ``target`` the
    class indices ``(...)``. The loss has the logits' dtype, or ``loss_dtype`` (float32:
    as ``F.cross_entropy(logits.float(), ...)``). ``target_name`` is the kf target (by
    default the tensors' device's, as ``kf.jit``'s: cuda, metal for mps, cpu);
    ``chunk_rows`` fixes the rows per chunk (0: ``plan_chunks``)."""
    _check(hidden, weight, bias, target, ignore_index, reduction, label_smoothing)
    kf_target = target_name or "auto"
    Options(target=kf_target, precision=precision)  # checks both
    grads = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (hidden, weight, bias))
    out = _op(hidden, weight, bias, target, int(ignore_index), reduction, float(label_smoothing),
              loss_dtype or hidden.dtype, grads, kf_target, precision, int(chunk_rows))
    return out[0]
