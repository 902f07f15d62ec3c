"""The backend's attention under training (compiler/backend/attention.py): an SDPA call
whose inputs want gradients becomes ``kf::attention_train``, whose forward saves O and
the row logsumexp and whose backward runs the split backward's kernels instead of
recomputing the forward. Checked against eager on every target the machine has: the
output, the logsumexp and the gradients, at odd lengths, with causal, boolean and
additive masks and grouped-query heads, under Dynamo's static and symbolic sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.backend import attention
from kf.runtime import vulkan

TARGETS = ["cpu",
           pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def _inputs(target, heads, kv_heads, lq, lk, d, dtype=torch.float32):
    g = torch.Generator().manual_seed(lq * 131 + lk)
    make = lambda h, n: torch.randn(2, h, n, d, generator=g, dtype=dtype).to(_device(target))  # noqa: E731
    return make(heads, lq), make(kv_heads, lk), make(kv_heads, lk)


def _mask(kind: str, lq: int, lk: int, device: str):
    """A mask of every row some key ("bool", "additive"), or with query rows that it masks
    everywhere ("..._dead": a left-padded batch's first rows under a padding mask, which
    torch's safe softmax gives 0)."""
    if kind.startswith("bool"):
        keep = torch.rand(lq, lk, generator=torch.Generator().manual_seed(lq + lk)) > 0.3
        keep[:, 0] = True  # no row without a key
        if kind.endswith("_dead"):
            keep[: max(1, lq // 4)] = False
        return keep.to(device)
    if kind.startswith("additive"):
        add = torch.randn(lq, lk, generator=torch.Generator().manual_seed(lq * lk))
        if kind.endswith("_dead"):
            add[: max(1, lq // 4)] = float("-inf")
            add[-1, ::2] = float("-inf")  # a row masked in part
        return add.to(device)
    return None


#: (mask, causal, query length, key length, k/v heads of 4)
CASES = [("none", True, 1, 1, 4), ("none", True, 37, 37, 2), ("none", True, 19, 45, 4), ("none", True, 257, 257, 1),
         ("none", False, 19, 45, 2), ("bool", False, 37, 37, 4), ("bool", False, 19, 45, 1),
         ("additive", False, 1, 1, 2), ("additive", False, 37, 37, 4), ("bool_dead", False, 19, 45, 2),
         ("additive_dead", False, 37, 37, 4), ("bool_dead", False, 1, 7, 4)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask_kind,causal,lq,lk,kv_heads", CASES, ids=str)
def test_saving_forward_and_backward_match_eager(target, mask_kind, causal, lq, lk, kv_heads):
    """Through torch.compile: O, the gradients of q, k and v, and the split being taken
    (the forward's logsumexp is what the backward reads). SDPA's causal mask for unequal
    lengths is the top-left one, as kf's."""
    q, k, v = _inputs(target, 4, kv_heads, lq, lk, 16)
    mask = _mask(mask_kind, lq, lk, q.device.type)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=kv_heads != 4)

    c = torch.compile(f, backend="kf", options={"target": target, "fallback": "eager"})
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    out = c(*ins)
    mask64 = mask.double() if mask is not None and mask.is_floating_point() else mask
    want = F.scaled_dot_product_attention(*refs, attn_mask=mask64, is_causal=causal, enable_gqa=kv_heads != 4)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    grad = torch.randn_like(want)
    got = torch.autograd.grad(out, ins, grad.to(out.dtype))
    wants = torch.autograd.grad(want, refs, grad)
    for a, b in zip(got, wants):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
    scale = 1.0 / math.sqrt(q.shape[-1])
    split = attention._split(q, k, v, mask, scale, causal, target, "auto")[-1]
    assert split is not None, "the forward did not split into O, the logsumexp and their backward"


@pytest.mark.parametrize("target", TARGETS)
def test_logsumexp_is_the_masked_scores(target):
    """The second result of ``kf::attention_train``: log(sum(exp(scaled, masked scores)))
    of each query row, in f32, with its kept dim ([..., Sq, 1]) as kf's autograd saves it."""
    q, k, v = _inputs(target, 4, 4, 29, 29, 16)
    scale = 0.3
    out, lse = torch.ops.kf.attention_train(q, k, v, None, scale, True, target, "auto")
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    scores = scores.masked_fill(~torch.ones(29, 29, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 29, 1)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1, keepdim=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), torch.softmax(scores, -1) @ v.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_lengths(target):
    """Under ``dynamic=True`` the op's fake results follow the symbolic lengths; each length's
    gradients are eager's. The queries come as a model's projection gives them (a
    transposed view): from the second length on, the attention's forward and backward
    programs serve every length, so the later lengths compile nothing."""
    def f(q, k, v):
        q = q.transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    # the backend's attention functions as a new process has them (other tests called
    # them at other heads and head dims, whose sizes a function's automatic dynamic counts)
    attention._FUNCTIONS.clear()
    c = torch.compile(f, backend="kf", dynamic=True, options={"target": target, "fallback": "eager"})
    counts = []
    for n in (7, 12, 30, 21, 45):
        q, k, v = _inputs(target, 2, 2, n, n, 8)
        q = q.transpose(1, 2).contiguous().requires_grad_()
        k, v = k.requires_grad_(), v.requires_grad_()
        got = torch.autograd.grad(c(q, k, v), (q, k, v))
        want = torch.autograd.grad(f(q, k, v), (q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        counts.append(_attention_programs())
    assert counts[-1] == counts[2], counts


def _attention_programs() -> int:
    """The programs of the backend's attention functions and of the forwards and backwards
    kf derived for them."""
    seen, n = set(), 0
    for kfn in attention._FUNCTIONS.values():
        fns = [kfn] + [g for training, _ in kfn._trainings.values()
                       for g in (training.forward, training.backward.fn) if g is not None]
        for g in fns:
            if id(g) not in seen:
                seen.add(id(g))
                n += len(g.compiles)
    return n


def test_a_mask_that_wants_a_gradient_takes_the_kf_function():
    """An additive mask that requires grad gets its gradient from the kf function's
    recomputing backward (the saving op gives q, k and v theirs only)."""
    q, k, v = (t.requires_grad_() for t in _inputs("cpu", 2, 2, 11, 11, 8))
    mask = torch.randn(11, 11, requires_grad=True)

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager"})
    grad = torch.randn(2, 2, 11, 8)
    got = torch.autograd.grad(c(q, k, v, mask), (q, k, v, mask), grad)
    want = torch.autograd.grad(f(q, k, v, mask), (q, k, v, mask), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    ops = {fb.op for fb in kf.explain(c, q, k, v, mask, backward=True).fallbacks if fb.to == "kf"}
    assert not any("attention_train" in op for op in ops), ops


def test_inference_keeps_the_plain_function():
    """Without gradients the call stays the kf function (no logsumexp written)."""
    q, k, v = _inputs("cpu", 2, 2, 9, 9, 8)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager"})
    with torch.no_grad():
        torch.testing.assert_close(c(q, k, v), f(q, k, v), rtol=1e-4, atol=1e-5)
        ops = {fb.op for fb in kf.explain(c, q, k, v).fallbacks if fb.to == "kf"}
    assert ops and not any("attention_train" in op for op in ops), ops


@pytest.mark.parametrize("mask_kind,causal", [("none", True), ("bool", False), ("additive", False)])
def test_ops_pass_opcheck(mask_kind, causal):
    """torch.library.opcheck of ``kf::attention_train``: its schema, autograd registration,
    fake results (the real ones' shapes, dtypes and strides) and AOTAutograd at dynamic
    shapes (which runs the backward op too)."""
    q, k, v = (t.requires_grad_() for t in _inputs("cpu", 4, 4, 9, 9, 8))
    mask = _mask(mask_kind, 9, 9, "cpu")
    got = torch.library.opcheck(torch.ops.kf.attention_train.default, (q, k, v, mask, 0.3, causal, "cpu", "auto"))
    assert set(got.values()) == {"SUCCESS"}, got
