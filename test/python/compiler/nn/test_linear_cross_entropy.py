"""kf.nn.fused_linear_cross_entropy against torch's ``F.cross_entropy(F.linear(...))`` on
cpu and vulkan: the loss and the gradients of hidden, weight and bias on fresh random
inputs (odd sizes, ignored rows, both reductions, all rows ignored, no rows, label
smoothing, bf16), errors for bad input, and the memory it allocates: never a tensor as
large as the logits."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kf
import kf.nn
from kf.nn import linear_cross_entropy as lce
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                    reason="no Vulkan device"))]


def _inputs(tokens, vocab, hidden, bias, dtype=torch.float32, ignored=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) / math.sqrt(hidden)).to(dtype).requires_grad_()
    b = torch.randn(vocab, generator=g).to(dtype).requires_grad_() if bias else None
    t = torch.randint(0, vocab, (tokens,), generator=g)
    if ignored:
        t[::ignored] = -100
    return h, w, b, t


def _grads(loss, xs):
    return torch.autograd.grad(loss, [x for x in xs if x is not None])


def _compare(target, tokens, vocab, hidden, bias, reduction, ignored=3, smoothing=0.0, chunk_rows=0):
    h, w, b, t = _inputs(tokens, vocab, hidden, bias, ignored=ignored)
    loss = kf.nn.fused_linear_cross_entropy(h, w, t, b, reduction=reduction, label_smoothing=smoothing,
                                            target_name=target, chunk_rows=chunk_rows)
    want = F.cross_entropy(F.linear(h, w, b), t, reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    g = torch.rand(()) + 0.5  # the backward scales by the incoming gradient
    for got, ref in zip(_grads(loss * g, (h, w, b)), _grads(want * g, (h, w, b))):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tokens,vocab,hidden,bias", [(1, 33, 8, False), (7, 1, 5, True), (7, 33, 16, False),
                                                       (257, 1000, 16, True), (257, 33, 3, False)])
def test_matches_torch(target, tokens, vocab, hidden, bias):
    for reduction in ("mean", "sum"):
        _compare(target, tokens, vocab, hidden, bias, reduction)


@pytest.mark.parametrize("target", TARGETS)
def test_chunks_of_one_row_and_one_chunk(target):
    """The result does not depend on the cut: one row a chunk, and all rows in one."""
    for rows in (1, 64):
        _compare(target, 13, 33, 8, True, "mean", chunk_rows=rows)


def test_odd_sizes_cpu():
    for tokens in (1, 7, 257):
        for vocab in (1, 33, 1000):
            _compare("cpu", tokens, vocab, 16, vocab == 33, "mean")


@pytest.mark.parametrize("target", TARGETS)
def test_every_row_ignored(target):
    """torch's mean over no rows is nan and its gradients zero; the sum is 0."""
    for reduction in ("mean", "sum"):
        h, w, b, t = _inputs(7, 33, 8, True, ignored=1)
        loss = kf.nn.fused_linear_cross_entropy(h, w, t, b, reduction=reduction, target_name=target)
        want = F.cross_entropy(F.linear(h, w, b), t, reduction=reduction)
        torch.testing.assert_close(loss, want, equal_nan=True)
        assert math.isnan(loss.item()) == (reduction == "mean")
        for got, ref in zip(_grads(loss, (h, w, b)), _grads(want, (h, w, b))):
            torch.testing.assert_close(got, ref)


def test_no_rows():
    for reduction in ("mean", "sum"):
        h, w, b, t = _inputs(0, 33, 8, True, ignored=0)
        loss = kf.nn.fused_linear_cross_entropy(h, w, t, b, reduction=reduction, target_name="cpu")
        want = F.cross_entropy(F.linear(h, w, b), t, reduction=reduction)
        torch.testing.assert_close(loss, want, equal_nan=True)
        for got, ref in zip(_grads(loss, (h, w, b)), _grads(want, (h, w, b))):
            torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("target", TARGETS)
def test_label_smoothing(target):
    _compare(target, 19, 33, 8, True, "mean", smoothing=0.1)
    _compare(target, 19, 33, 8, False, "sum", smoothing=0.25)


@pytest.mark.parametrize("target", TARGETS)
def test_batched_hidden_and_float32_loss(target):
    """(batch, seq, H) hidden with (batch, seq) targets, the loss in float32 as
    ``F.cross_entropy(logits.float(), ...)``; no gradient wanted: only the loss."""
    h, w, b, t = _inputs(2 * 9, 33, 8, False)
    h, t = h.detach().view(2, 9, 8), t.view(2, 9)
    with torch.no_grad():
        loss = kf.nn.fused_linear_cross_entropy(h, w, t, loss_dtype=torch.float32, target_name=target)
    want = F.cross_entropy(F.linear(h, w).view(-1, 33).float(), t.view(-1))
    assert loss.dtype == torch.float32 and not loss.requires_grad
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_within_eager_rounding(target):
    """bf16 inputs: kf's loss and gradients are as close to float64's as eager's bf16 ones."""
    h, w, b, t = _inputs(37, 100, 16, True, dtype=torch.bfloat16)
    loss = kf.nn.fused_linear_cross_entropy(h, w, t, b, target_name=target)
    assert loss.dtype == torch.bfloat16
    eager = F.cross_entropy(F.linear(h, w, b), t)
    exact_in = [x.detach().double().requires_grad_() for x in (h, w, b)]
    exact = F.cross_entropy(F.linear(*exact_in), t)
    assert abs(loss.double() - exact).item() <= 2 * abs(eager.double() - exact).item() + 1e-2
    for got, ref, ex in zip(_grads(loss, (h, w, b)), _grads(eager, (h, w, b)), _grads(exact, exact_in)):
        assert got.dtype == torch.bfloat16
        scale = ex.abs().max()
        assert (got.double() - ex).abs().max() / scale <= 2 * (ref.double() - ex).abs().max() / scale + 1e-2


class _Largest(TorchDispatchMode):
    """The largest tensor any torch op of the op's own makes (the kf programs run outside
    modes: their sizes are checked by their signatures)."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0
        self.allocations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o._base is None:
                self.allocations += 1
                self.nbytes = max(self.nbytes, o.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("target", TARGETS)
def test_never_allocates_the_logits(target):
    """Every tensor the op makes is smaller than the logits (here 8x: the largest is the
    weight's gradient), and every kf program it runs reads one chunk of rows (so its
    logits, inside it, are one chunk's, at most an eighth of them all, and its outputs no
    larger than the weight)."""
    tokens, vocab, hidden = 256, 4096, 32
    h, w, _, t = _inputs(tokens, vocab, hidden, False)
    plan = lce.plan_chunks(tokens, vocab, hidden)
    assert plan.rows * lce.MIN_CHUNKS <= tokens  # a chunk's logits: at most an eighth of them
    mode = _Largest()
    with mode:
        loss, dh, dw, _ = lce._op._init_fn(h.detach(), w.detach(), None, t, -100, "mean", 0.0, torch.float32,
                                            True, target, "auto", 0)
    logits = tokens * vocab * 4
    assert mode.allocations >= 3  # the accumulators and dh
    assert mode.nbytes <= vocab * hidden * 4 < logits
    chunk = lce.functions(target)["_chunk"]
    rows = {int(m.group(1)) for r in chunk.compiles
            for m in [re.match(rf"\(h: \w+\[(\d+), {hidden}\]@\w+, w: \w+\[{vocab}, ", r.signature)] if m}
    assert rows and max(rows) <= plan.rows, rows
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w), t))


def test_new_token_counts_reuse_the_chunk_programs(monkeypatch):
    """A training loop whose batches bring 19 token counts (320 to 2048): every chunk,
    the last one padded with ignored rows, has one of a few power-of-two row counts, so
    the chunk function compiles a handful of programs, not one per count, and the count
    of targets one program of run-time length after the first; each loss and gradient
    is torch's."""
    monkeypatch.setattr(lce, "_FUNCTIONS", {})
    vocab, hidden = 96, 16
    for tokens in range(320, 2049, 96):
        h, w, _, t = _inputs(tokens, vocab, hidden, False)
        h.requires_grad_(True)
        loss = kf.nn.fused_linear_cross_entropy(h, w, t, target_name="cpu")
        loss.backward()
        hr = h.detach().clone().requires_grad_(True)
        want = F.cross_entropy(F.linear(hr, w.detach()), t)
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h.grad, hr.grad, rtol=1e-4, atol=1e-6)
    fns = lce.functions("cpu")
    assert len(fns["_chunk"].compiles) <= 4, [c.signature for c in fns["_chunk"].compiles]
    assert len(fns["_mean_scale"].compiles) <= 2, [c.signature for c in fns["_mean_scale"].compiles]


def test_plan_chunks():
    assert lce.plan_chunks(4096, 32000, 2048).rows == 512  # Liger's 256 rows, but 8 chunks at most
    assert lce.plan_chunks(8192, 50257, 768).rows == 1024  # GPT-2: not 128 (the dh GEMM's 6 tiles)
    assert lce.plan_chunks(2048, 32000, 2048).rows == 256
    assert lce.plan_chunks(7, 33, 16).rows == 4
    assert lce.plan_chunks(1, 10**6, 1).rows == 1
    assert lce.plan_chunks(5, 1, 64).rows == 5
    assert lce.ChunkPlan(4).chunks(9) == [(0, 4), (4, 8), (8, 9)]


def test_target_out_of_range_is_an_error():
    h, w, b, t = _inputs(7, 33, 8, False)
    t[4] = 33
    with pytest.raises(kf.IndexOutOfRange, match="33"):
        kf.nn.fused_linear_cross_entropy(h, w, t, target_name="cpu")


@pytest.mark.parametrize("kwargs,match", [({"reduction": "none"}, "reduction"),
                                          ({"label_smoothing": 1.5}, "label_smoothing"),
                                          ({"target_name": "tpu"}, "tpu")])
def test_bad_arguments(kwargs, match):
    h, w, b, t = _inputs(7, 33, 8, False)
    with pytest.raises((kf.SignatureError, ValueError), match=match):
        kf.nn.fused_linear_cross_entropy(h, w, t, **kwargs)


def test_bad_shapes_and_dtypes():
    h, w, b, t = _inputs(7, 33, 8, False)
    with pytest.raises(kf.SignatureError, match="last dim"):
        kf.nn.fused_linear_cross_entropy(h[:, :5], w, t)
    with pytest.raises(kf.SignatureError, match="leading shape"):
        kf.nn.fused_linear_cross_entropy(h, w, t[:5])
    with pytest.raises(kf.SignatureError, match="class indices"):
        kf.nn.fused_linear_cross_entropy(h, w, t.float())
    with pytest.raises(kf.SignatureError, match="one dtype"):
        kf.nn.fused_linear_cross_entropy(h.double(), w, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_chunk_compiles_for_cuda(dtype, bias):
    """Without a GPU: the chunk's program lowers to PTX that ptxas assembles for sm_90a,
    its logits and two gradient products as matmul kernels beside the row-wise one."""
    from kf.passes.to_cuda import assemble, ptxas_path

    h, w, b, t = _inputs(64, 1000, 64, bias, dtype=dtype)
    fn = lce.functions("cuda")["_chunk"]
    f32 = dict(dtype=torch.float32)
    info = kf.inspect(fn, h.detach(), w.detach(), b.detach() if bias else None, t, torch.zeros((), **f32),
                      torch.zeros(1000, 64, **f32), torch.zeros(1000, **f32) if bias else None,
                      torch.ones((), **f32), -100, 0.0)
    ptx = info.ptx
    assert ptx.count("_matmul") >= 3 and "_rowwise" in ptx
    if ptxas_path():
        kernels = assemble(ptx, "sm_90a").kernels
        assert kernels and all(k["spill_store_bytes"] == 0 for k in kernels.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_torch_and_peaks_below_the_logits(dtype):
    """On the GPU: the loss and gradients against torch's (float32 tightly, bf16 within
    eager's rounding of float64), and the peak CUDA memory of the op's forward and backward
    stays below the logits' size (4096 tokens x 32000: 500 MiB in float32)."""
    for tokens, vocab, hidden, bias in ((7, 33, 16, False), (257, 1000, 64, True)):
        h, w, b, t = (x.detach().cuda().requires_grad_(x.requires_grad) if x is not None else None
                      for x in _inputs(tokens, vocab, hidden, bias, dtype=dtype))
        loss = kf.nn.fused_linear_cross_entropy(h, w, t, b, target_name="cuda")
        want = F.cross_entropy(F.linear(h, w, b), t)
        exact_in = [x.detach().double().requires_grad_() for x in (h, w, b) if x is not None]
        exact = F.cross_entropy(F.linear(*exact_in), t)
        tol = 1e-4 if dtype == torch.float32 else 2 * abs(want.double() - exact).item() + 1e-2
        assert abs(loss.double() - exact).item() <= tol
        for got, ref, ex in zip(_grads(loss, (h, w, b)), _grads(want, (h, w, b)), _grads(exact, exact_in)):
            scale = ex.abs().max()
            bound = 1e-4 if dtype == torch.float32 else 2 * ((ref.double() - ex).abs().max() / scale).item() + 1e-2
            assert ((got.double() - ex).abs().max() / scale).item() <= bound
    tokens, vocab, hidden = 4096, 32000, 512
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.float32, requires_grad=True)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    kf.nn.fused_linear_cross_entropy(h, w, t, target_name="cuda").backward()  # compiles
    h.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kf.nn.fused_linear_cross_entropy(h, w, t, target_name="cuda").backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    # the gradients (h's and w's) and the float32 accumulator of w's, not the logits
    assert peak < tokens * vocab * 4, peak
