"""sort and argsort (compiler/aten/sorting.py), and a top-k large enough to take a sort,
against torch on fresh random inputs:
stable order of ties, descending, NaN and infinities where torch puts them, every dim,
integer, bool and 16-bit types, odd sizes (1, 7, 257), 0-d and empty tensors,
non-contiguous views, on cpu and vulkan, and as PTX that ptxas assembles for sm_90a."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")


def _jit(fn, target):
    """fn compiled for target, called with its tensors on the target's device (the GPU's
    for cuda), results on the CPU."""
    compiled = kf.jit(fn, target=target)
    if target != "cuda":
        return compiled

    def call(*args):
        out = compiled(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
        return _to_cpu(out)

    return call


def _to_cpu(out):
    if isinstance(out, torch.Tensor):
        return out.cpu()
    return tuple(_to_cpu(o) for o in out)


def _flat(out):
    return [t for o in out for t in _flat(o)] if isinstance(out, tuple) else [out]


def _check(fn, x, target):
    got, want = _flat(_jit(fn, target)(x)), _flat(fn(x))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def _ties_and_specials(shape, gen):
    """Few distinct values (many ties), with NaN and infinities sprinkled in."""
    x = torch.randint(0, 4, shape, generator=gen).float()
    flat = x.view(-1)
    n = flat.numel()
    if n:
        picks = torch.randint(0, n, (max(n // 5, 1),), generator=gen)
        flat[picks[0::3]] = float("nan")
        flat[picks[1::3]] = float("-inf")
        flat[picks[2::3]] = float("inf")
    return x


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((257,), -1), ((3, 9), 1), ((9, 4), 0),
                                       ((2, 7, 3), 1)], ids=str)
def test_sort_matches_torch(shape, dim, descending, target):
    x = _ties_and_specials(shape, torch.Generator().manual_seed(sum(shape) + dim))
    _check(lambda x: torch.sort(x, dim=dim, descending=descending, stable=True), x, target)
    _check(lambda x: torch.argsort(x, dim=dim, descending=descending, stable=True), x, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16], ids=str)
def test_sort_of_other_types(dtype, target):
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(-5, 5, (4, 33), generator=gen).to(dtype)
    _check(lambda x: torch.sort(x, stable=True), x, target)
    _check(lambda x: torch.sort(x, descending=True, stable=True), x, target)


@pytest.mark.parametrize("target", TARGETS)
def test_sort_of_a_scalar_nothing_and_a_view(target):
    gen = torch.Generator().manual_seed(8)
    _check(lambda x: torch.sort(x), torch.randn((), generator=gen), target)
    _check(lambda x: torch.sort(x, dim=0), torch.randn(0, 4), target)
    _check(lambda x: torch.sort(x, stable=True), torch.randn(5, 7, generator=gen).t(), target)
    _check(lambda x: x.argsort(dim=0), torch.randn(6, 9, generator=gen)[:, ::2], target)


@pytest.mark.parametrize("target", TARGETS)
def test_msort(target):
    _check(lambda x: torch.msort(x), _ties_and_specials((9, 4), torch.Generator().manual_seed(9)), target)
    _check(lambda x: torch.msort(x), torch.randn(7, 3, generator=torch.Generator().manual_seed(10)).t(), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dim", [((1, 8000), -1), ((8197, 2), 0)], ids=str)
def test_sort_of_a_long_row(shape, dim, target):
    """8000 elements (OpInfo's long sample): each rank one sum of comparisons; 8197 along
    dim 0: sums over blocks of ROW_BLOCK, the last padded (padding never counts)."""
    _check(lambda x: torch.sort(x, dim=dim, descending=True, stable=True),
           _ties_and_specials(shape, torch.Generator().manual_seed(11)), target)


def test_sort_of_a_vocabulary():
    """Top-p sampling's sort of a 50257-token vocabulary's logits (cpu: n^2 comparisons
    take seconds on lavapipe's one core)."""
    x = torch.randn(1, 50257, generator=torch.Generator().manual_seed(13))
    _check(lambda x: torch.sort(x, descending=True, stable=True), x, "cpu")


def test_sort_of_a_very_long_row_is_a_clear_error():
    with pytest.raises(kf.UnsupportedOpError, match="rows of 70000 elements"):
        kf.jit(lambda x: torch.sort(x), target="cpu")(torch.randn(70000))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_sort_assembles_for_cuda():
    assert ".entry" in kf.inspect(kf.jit(lambda x: torch.sort(x, dim=0, descending=True), target="cuda"),
                                  torch.randn(257, 3)).stages["ptx"]


def _distinct(shape, gen):
    """Values with no ties (torch names no particular index among equal values)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n, generator=gen).float() - n / 2).reshape(shape)


def _check_picks(fn, x, target, dim):
    """Values as torch's; each index points at its value (any one of equal values)."""
    (gv, gi), (wv, wi) = _jit(fn, target)(x), fn(x)
    assert gv.dtype == wv.dtype and gv.shape == wv.shape and gi.dtype == wi.dtype and gi.shape == wi.shape
    torch.testing.assert_close(gv, wv, rtol=0, atol=0, equal_nan=True)
    at = x.gather(dim, gi if gi.dim() == x.dim() else gi.unsqueeze(dim)) if x.dim() else x
    torch.testing.assert_close(at.reshape(gv.shape), gv, rtol=0, atol=0, equal_nan=True)


ORDER_STATS = {
    "kthvalue": lambda dim: lambda x: torch.kthvalue(x, max(x.shape[dim] // 3, 1) if x.dim() else 1, dim),
    "median": lambda dim: lambda x: torch.median(x, dim),
    "nanmedian": lambda dim: lambda x: torch.nanmedian(x, dim),
    "mode": lambda dim: lambda x: torch.mode(x, dim),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((257,), -1), ((3, 9), 1), ((8, 4), 0),
                                       ((2, 7, 3), 1)], ids=str)
@pytest.mark.parametrize("op", list(ORDER_STATS))
def test_order_statistics_match_torch(op, shape, dim, target):
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    fn = ORDER_STATS[op](dim)
    x = _distinct(shape, gen)
    if op == "mode":  # repeats, so that a mode is more than the smallest value
        x = torch.randint(0, 4, shape, generator=gen).float()
        _check_picks(fn, x, target, dim)
        return
    _check(fn, x, target)
    _check(lambda x: ORDER_STATS[op](dim)(x)[0], _ties_and_specials(shape, gen), target)


@pytest.mark.parametrize("target", TARGETS)
def test_medians_with_nan_keepdim_scalars_and_views(target):
    gen = torch.Generator().manual_seed(11)
    x = _distinct((5, 9), gen)
    x[1, 3] = x[1, 6] = x[4, 0] = float("nan")
    x[3, :] = float("nan")
    _check(lambda x: torch.median(x, 1), x, target)  # a row with a NaN: its first NaN
    _check(lambda x: torch.nanmedian(x, 1)[0], x, target)
    _check(lambda x: torch.nanmedian(x[:3], 1, keepdim=True), x, target)
    _check(lambda x: (torch.median(x), torch.nanmedian(x)), x, target)
    _check(lambda x: (torch.median(x), torch.nanmedian(x)), torch.randn(0, 3), target)
    _check(lambda x: torch.median(x, 0, keepdim=True), _distinct((6, 9), gen).t()[:, ::2], target)
    _check(lambda x: (torch.median(x, 0), torch.kthvalue(x, 1), torch.mode(x)), torch.randn((), generator=gen),
           target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16], ids=str)
def test_order_statistics_of_other_types(dtype, target):
    x = torch.randint(-3, 3, (4, 9), generator=torch.Generator().manual_seed(12)).to(dtype)
    _check_picks(lambda x: torch.median(x, 1), x, target, 1)
    _check_picks(lambda x: torch.kthvalue(x, 4, 1), x, target, 1)
    _check_picks(lambda x: torch.mode(x, 1), x, target, 1)


@pytest.mark.parametrize("target", TARGETS)
def test_mode_of_booleans(target):
    x = torch.rand(5, 8, generator=torch.Generator().manual_seed(13)) > 0.6
    _check_picks(lambda x: torch.mode(x, 1), x, target, 1)


def test_kthvalue_k_out_of_range_is_a_clear_error():
    with pytest.raises(kf.CompileError, match="out of range"):
        kf.jit(lambda x: torch.kthvalue(x, 8), target="cpu")(torch.randn(3, 7))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_order_statistics_assemble_for_cuda():
    fn = kf.jit(lambda x: (torch.median(x, 0), torch.nanmedian(x), torch.kthvalue(x, 3, 1), torch.mode(x, 0)),
                target="cuda")
    assert ".entry" in kf.inspect(fn, torch.randn(257, 5)).stages["ptx"]


def _check_args(fn, args, target):
    got, want = _flat(_jit(fn, target)(*args)), _flat(fn(*args))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seq_shape,values_shape", [((9,), (3, 4)), ((1,), (7,)), ((257,), (2, 5)), ((2, 9), (2, 4)),
                                                    ((3, 1, 7), (3, 1, 5)), ((0,), (3,)), ((5,), (0, 2)), ((5,), ())],
                         ids=str)
def test_searchsorted_and_bucketize_match_torch(seq_shape, values_shape, target):
    """Both sides, int32 results, a sorter, values equal to the sequence's (ties), NaN
    in the values and the sequence, non-contiguous values."""
    g = torch.Generator().manual_seed(sum(seq_shape) + sum(values_shape))
    seq = torch.sort(torch.randint(-4, 5, seq_shape, generator=g).float(), dim=-1)[0]
    values = torch.randint(-5, 6, values_shape, generator=g).float()
    if values.numel() > 1:
        values.view(-1)[1] = float("nan")
    for kw in (dict(), dict(right=True), dict(side="right", out_int32=True)):
        _check_args(lambda s, v: torch.searchsorted(s, v, **kw), (seq, values), target)
    if len(seq_shape) == 1:
        _check_args(lambda v, s: torch.bucketize(v, s, right=True), (values, seq), target)
        _check_args(lambda s: torch.searchsorted(s, 1.5), (seq,), target)
        if seq.numel():
            seq_nan = torch.cat([seq[1:], torch.tensor([float("nan")])])
            _check_args(lambda s, v: torch.searchsorted(s, v), (seq_nan, values), target)
    perm = torch.randperm(seq_shape[-1], generator=g).expand(seq_shape).contiguous()
    shuffled = torch.gather(seq, -1, perm)
    _check_args(lambda s, v, o: torch.searchsorted(s, v, sorter=torch.argsort(o, dim=-1)),
                (shuffled, values, shuffled), target)
    if values.dim() == 2 and len(seq_shape) == 1:
        _check_args(lambda s, v: torch.searchsorted(s, v), (seq, values.t()), target)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_searchsorted_assembles_for_cuda():
    from kf.passes.to_cuda import assemble

    seq, values = torch.sort(torch.randn(2, 33))[0], torch.randn(2, 7)
    info = kf.inspect(kf.jit(lambda s, v: torch.searchsorted(s, v, right=True), target="cuda", arch="sm_90a"),
                      seq, values)
    assemble(info.stages["ptx"], "sm_90a")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,k,dim,largest", [((4, 3000), 100, -1, True), ((4, 3000), 100, -1, False),
                                                 ((2000, 3), 64, 0, True), ((3, 4096), 4096, 1, False)])
def test_large_topk_takes_a_sort(shape, k, dim, largest, target):
    """A top-k of k * n over TOPK_STEPS takes the first k of a stable sort: the same
    values as torch (NaN the largest), indices that point at them, ties in position
    order; the kf.topk loop would take k * n steps a thread (lavapipe refuses past 65535)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(k)).round(decimals=1)
    x.view(-1)[7] = float("nan")
    fn = lambda x: torch.topk(x, k, dim=dim, largest=largest)  # noqa: E731
    values, indices = _jit(fn, target)(x)
    want = fn(x)
    assert torch.equal(values.nan_to_num(99), want.values.nan_to_num(99))
    assert torch.equal(x.gather(dim, indices).nan_to_num(99), values.nan_to_num(99))
    same = values[..., 1:] == values[..., :-1] if dim == -1 or dim == 1 else None
    if same is not None:  # ties listed in position order
        assert bool((indices[..., 1:] > indices[..., :-1])[same].all())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn,shape", [(lambda x: torch.sort(x, dim=-1, stable=True).values.cumsum(-1), (2, 8000)),
                                      (lambda x: torch.topk(x, 100, -1).values * 2, (4, 3000))],
                         ids=["sort", "topk"])
def test_gradients_of_long_rows(fn, shape, target):
    """The backward of sort and top-k scatters the gradients to the indices
    (kf.scatter_reduce), with nothing of n x n (or k x n) in memory: on lavapipe, whose
    storage buffers hold 128 MiB, a one-hot scatter of 8000-wide rows (512 MB) was refused."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(12), requires_grad=True)
    g = torch.randn_like(fn(x))
    (got,) = torch.autograd.grad(_jit(fn, target)(x), x, g)
    xd = x.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(fn(xd), xd, g.double())
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-5
