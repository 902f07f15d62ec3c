"""Ops kf compiles as torch's decomposition of them (compiler/aten/decompositions.py):
addmv, block_diag, dist, isin, multi_margin_loss and pdist against torch on fresh random
inputs (odd sizes, empty blocks, non-contiguous views, the ops' options) on cpu and
vulkan; a target outside the classes an error; PTX that ptxas assembles for sm_90a."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")



def _check(fn, args, target, tol=1e-5):
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,n", [(1, 1), (7, 5), (3, 257)], ids=str)
def test_addmv(m, n, target):
    gen = torch.Generator().manual_seed(m + n)
    a, mat, v = torch.randn(m, generator=gen), torch.randn(m, n, generator=gen), torch.randn(n, generator=gen)
    _check(lambda a, mat, v: (torch.addmv(a, mat, v), torch.addmv(a, mat, v, beta=0.5, alpha=-2.0)),
           (a, mat, v), target, tol=1e-4)
    views = (a, torch.randn(n, m, generator=gen).t(), v[None, :].expand(2, n)[1])
    _check(lambda a, mat, v: torch.addmv(a, mat, v), views, target, tol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_block_diag_with_empty_and_odd_blocks(target):
    gen = torch.Generator().manual_seed(1)
    blocks = (torch.randn(1, 5, generator=gen), torch.randn(2, 3, generator=gen), torch.randn(0, 2),
              torch.randn(3, generator=gen), torch.randn(7, 4, generator=gen)[:, ::2])
    _check(lambda *b: torch.block_diag(*b), blocks, target)
    _check(lambda a, b: torch.block_diag(a, b), (torch.randn(2, 3, generator=gen), torch.randn(4, 0)), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf"), 0.5])
def test_dist_and_pdist(p, target):
    gen = torch.Generator().manual_seed(7 if p == float("inf") else int(p * 10))
    a, b = torch.randn(7, 5, generator=gen), torch.randn(5, generator=gen)
    _check(lambda a, b: torch.dist(a, b, p), (a, b), target, tol=1e-4)
    if p != 0.5:
        _check(lambda a: F.pdist(a, p), (torch.randn(9, 4, generator=gen),), target, tol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_isin(target):
    gen = torch.Generator().manual_seed(3)
    x, t = torch.randint(0, 9, (5, 7), generator=gen), torch.randint(0, 9, (4,), generator=gen)
    _check(lambda x, t: (torch.isin(x, t), torch.isin(x, t, invert=True), torch.isin(x, 3)), (x, t), target)
    _check(lambda x, t: torch.isin(x, t), (x.float().t(), t.float()), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss(reduction, target):
    gen = torch.Generator().manual_seed(len(reduction))
    x, y = torch.randn(7, 5, generator=gen), torch.randint(0, 5, (7,), generator=gen)
    w = torch.rand(5, generator=gen)
    _check(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction), (x, y), target)
    _check(lambda x, y, w: F.multi_margin_loss(x, y, p=2, margin=0.5, weight=w, reduction=reduction), (x, y, w),
           target)
    one = (torch.randn(5, generator=gen), torch.tensor(3))
    if reduction != "none":
        _check(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction), one, target)
    else:  # torch's shape rule (1 element) differs from eager (0-d)
        with pytest.raises(kf.UnsupportedOpError, match="1-D input with reduction='none'"):
            kf.jit(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction), target=target)(*one)


@pytest.mark.parametrize("target", TARGETS)
def test_multi_margin_loss_target_out_of_range_is_an_error(target):
    with pytest.raises(kf.IndexOutOfRange, match="index 5 is out of range"):
        kf.jit(lambda x, y: F.multi_margin_loss(x, y), target=target)(torch.randn(3, 5), torch.tensor([0, 5, 1]))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_decomposed_ops_assemble_for_cuda():
    def fn(a, mat, v, y):
        return torch.addmv(a, mat, v), torch.block_diag(mat, a[None]), F.multi_margin_loss(mat, y), F.pdist(mat)

    args = (torch.randn(7), torch.randn(7, 5), torch.randn(5), torch.randint(0, 5, (7,)))
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), *args).stages["ptx"]
