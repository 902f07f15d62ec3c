"""The seed attention's backward from a user function of torch ops, through the whole
compiler (capture, kf-fuse, the attention_backward strategy, the back ends): the form
kf's autograd gives it -- the forward saved q, k, v, the mask, O and the row logsumexp
lse (f32), and the backward recomputes the scores with the forward's ops, then
P = exp(scores - lse) in the softmax's type, D = rowsum(dO * O) in f32,
dS = P (dP - D), the mask's zeroing of dS and the scale's division. On sm_90a it is
three kernels (the wgmma backward, with and without the mask); on the CPU and on Vulkan
its gradients match float64 autograd of the seed at odd shapes, and on a GPU too."""

from __future__ import annotations

import pytest
import torch

import kf
import seed_examples as se
from kf.runtime import vulkan


def seed_attention_backward(q, k, v, mask, o, lse, do):
    """dq, dk, dv of ``se.fused_attention`` from what its forward saved."""
    d = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / (d ** 0.5)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p = torch.exp(scores.float() - lse.unsqueeze(-1)).to(q.dtype)
    dv = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, v.transpose(-2, -1))
    dsum = (do.float() * o.float()).sum(-1, keepdim=True)
    ds = (p.float() * (dp.float() - dsum)).to(q.dtype)
    if mask is not None:
        ds = ds.masked_fill(mask == 0, 0.0)
    ds = ds / (d ** 0.5)
    return torch.matmul(ds, k), torch.matmul(ds.transpose(-2, -1), q), dv


def _inputs(b, h, s, d, dtype, mask_kind, seed=0):
    """(q, k, v, mask, o, lse, do) as the forward saves them, and the float64 gradients of
    the seed attention. ``mask_kind``: None, "causal", "random" (70% kept), or "dead row"
    (random, and a row masked everywhere)."""
    gen = torch.Generator().manual_seed(seed + s + 7 * d)
    q, k, v, do = (torch.randn(b, h, s, d, generator=gen).to(dtype) for _ in range(4))
    mask = None
    if mask_kind == "causal":
        mask = torch.ones(s, s).tril()
    elif mask_kind in ("random", "dead row"):
        mask = (torch.rand(s, s, generator=gen) > 0.3).float()
        if mask_kind == "dead row":
            mask[s // 2] = 0
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    md = None if mask is None else mask.double()
    o = se.fused_attention.fn(qd, kd, vd, md)
    o.backward(do.double())
    x = qd @ kd.transpose(-1, -2) / d ** 0.5
    if md is not None:
        x = x.masked_fill(md == 0, -1e9)
    lse = torch.logsumexp(x, -1).detach().float()
    return (q, k, v, mask, o.detach().to(dtype), lse, do), (qd.grad, kd.grad, vd.grad)


def _check(outs, want, tol):
    for name, got, ref in zip(("dq", "dk", "dv"), outs, want):
        assert got.shape == ref.shape, name
        err = (got.double() - ref).abs().max().item()
        scale = ref.abs().max().item() + 1e-6
        assert err <= tol * scale, f"{name}: max error {err:.3g} against {scale:.3g}"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask_kind", [None, "causal"])
def test_sm90a_three_kernels(d, mask_kind):
    """bf16 on sm_90a: the wgmma backward's preprocess, main kernel and postprocess, and
    nothing else (the duplicate ``mask == 0`` of the backward is the forward's mask)."""
    args, _ = _inputs(1, 2, 257, d, torch.bfloat16, mask_kind)
    fn = kf.jit(seed_attention_backward, target="cuda", arch="sm_90a")
    stages = kf.inspect(fn, *args).stages
    entries = [line for line in stages["ptx"].splitlines() if ".entry" in line]
    assert len(entries) == 3, entries
    assert 'kernel = "hopper"' in stages["gpu"]
    assert ("masked = true" in stages["gpu"]) == (mask_kind is not None)


@pytest.mark.parametrize("d", [40, 65])
@pytest.mark.parametrize("mask_kind", [None, "random"])
def test_gradients_cpu(d, mask_kind):
    """The CPU computes the function as written (no kernel strategy): a row the mask
    masks everywhere is left out, its exp(fill - lse) is 1 in f32 where the forward's
    softmax gave 1 / Sk (lse = fill + log Sk rounds to the fill)."""
    args, want = _inputs(1, 2, 257, d, torch.float32, mask_kind)
    outs = kf.jit(seed_attention_backward, target="cpu")(*args)
    _check(outs, want, 1e-4)


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")
@pytest.mark.parametrize("d", [40, 65])
@pytest.mark.parametrize("mask_kind", [None, "random", "dead row"])
def test_gradients_vulkan(d, mask_kind):
    args, want = _inputs(1, 2, 257, d, torch.float32, mask_kind)
    outs = kf.jit(seed_attention_backward, target="vulkan")(*args)
    _check(outs, want, 1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("d", [40, 64, 65, 128])
@pytest.mark.parametrize("mask_kind", [None, "causal", "random", "dead row"])
def test_gradients_cuda(d, mask_kind):
    """bf16 on the GPU: the wgmma kernel at head dims 64 and 128 on an H200, the SIMT one
    otherwise."""
    args, want = _inputs(1, 2, 257, d, torch.bfloat16, mask_kind)
    outs = kf.jit(seed_attention_backward)(*(None if a is None else a.cuda() for a in args))
    _check([o.cpu() for o in outs], want, 3e-2)


def _saves_logsumexp() -> bool:
    """Whether kf's autograd splits a forward so that it saves attention's logsumexp
    (``compiler/partition.py``); before, the backward recomputes the forward."""
    from kf import autograd

    return hasattr(autograd, "derive_training")


@pytest.mark.skipif(not _saves_logsumexp(), reason="kf's autograd recomputes the forward in the backward")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", [None, "float", "bool"])
def test_autograd_backward_sm90a(d, mask):
    """The seed attention's backward as kf's autograd derives it is, on sm_90a, the three
    kernels of the wgmma backward and nothing else: a float mask that does not require
    grad gets no gradient kernel."""
    from kf import autograd

    q, k, v = (torch.randn(1, 2, 257, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    m = None if mask is None else torch.ones(257, 257).tril()
    m = m.bool() if mask == "bool" else m
    bwd = autograd.backward_of(se.fused_attention.with_options(target="cpu"), q, k, v, m)
    stages = bwd.inspect(target="cuda", arch="sm_90a").stages
    entries = [line for line in stages["ptx"].splitlines() if ".entry" in line]
    assert 'kernel = "hopper"' in stages["gpu"]
    assert len(entries) <= 3, entries


@pytest.mark.skipif(not _saves_logsumexp(), reason="kf's autograd recomputes the forward in the backward")
@pytest.mark.parametrize("target", ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
    not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)"))])
@pytest.mark.parametrize("d", [40, 65])
@pytest.mark.parametrize("masked", [False, True])
def test_autograd_gradients(target, d, masked):
    """Gradients of the seed attention under autograd (seq 257, batch 1, f32) against
    float64."""
    gen = torch.Generator().manual_seed(d)
    q, k, v, g = (torch.randn(1, 2, 257, d, generator=gen) for _ in range(4))
    mask = (torch.rand(257, 257, generator=gen) > 0.3).float() if masked else None
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    out = se.fused_attention.with_options(target=target)(*ins, mask)
    got = torch.autograd.grad(out, ins, g)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(se.fused_attention.fn(*ref, None if mask is None else mask.double()), ref, g.double())
    _check(got, want, 1e-4)
