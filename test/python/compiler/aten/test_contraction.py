"""F.linear with 1-d operands (compiler/aten/contraction.py): a 1-d input (in_features,)
and a 1-d weight (in_features,) drop their dim from the result, as in matmul, with and
without a bias, against torch on cpu and vulkan at odd sizes and through non-contiguous
views."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]

#: (input shape, weight shape); the bias, where given, has the weight's leading dims
SHAPES = [((5,), (3, 5)), ((1,), (1, 1)), ((257,), (7, 257)), ((4, 5), (5,)), ((5,), (5,)), ((2, 4, 13), (13,)),
          ((2, 4, 13), (3, 13)), ((0, 5), (3, 5)), ((5,), (0, 5))]



def _linear(x, w):
    return F.linear(x, w)


def _linear_bias(x, w, b):
    return F.linear(x, w, b)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}-{s[1]}")
def test_linear_of_1d_operands(target, bias, shapes):
    xs, ws = shapes
    if bias and len(xs) == 2 and len(ws) == 1:
        pytest.skip("eager refuses it too (addmm: mat2 must be a matrix)")
    gen = torch.Generator().manual_seed(hash((xs, ws, bias)) % 2**31)
    x = torch.randn(xs, generator=gen)
    w = torch.randn(tuple(reversed(ws)), generator=gen).t() if len(ws) == 2 else torch.randn(ws, generator=gen)
    args = (x, w, torch.randn(ws[:-1], generator=gen)) if bias else (x, w)
    got = kf.jit(_linear_bias if bias else _linear, target=target)(*args)
    want = F.linear(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257])
def test_mv_and_dot(n, target):
    gen = torch.Generator().manual_seed(n)
    a, v, y = torch.randn(5, n, generator=gen), torch.randn(n, generator=gen), torch.randn(5, generator=gen)

    def fn(a, v, y):
        return torch.mv(a, v), torch.dot(v, v), torch.addmv(y, a, v, beta=0.5, alpha=2.0)

    for got, want in zip(kf.jit(fn, target=target)(a, v, y), fn(a, v, y), strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("b,n,k,m", [(1, 1, 1, 1), (3, 7, 5, 2), (2, 4, 257, 3), (0, 3, 2, 4), (2, 3, 0, 4)], ids=str)
def test_addbmm(b, n, k, m, target):
    gen = torch.Generator().manual_seed(b + n + k + m)
    x, a, bb = torch.randn(n, m, generator=gen), torch.randn(b, n, k, generator=gen), torch.randn(b, k, m, generator=gen)

    def fn(x, a, bb):
        return torch.addbmm(x, a, bb), torch.addbmm(x[:1], a, bb, beta=0.5, alpha=-2.0), torch.addbmm(x, a, bb, beta=0)

    f = kf.jit(fn, target=target)
    for args in ((x, a, bb), (x.t().contiguous().t(), a.transpose(1, 2).contiguous().transpose(1, 2), bb)):
        for got, want in zip(f(*args), fn(*args), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_addbmm_assembles_for_cuda():
    import os
    import shutil

    if shutil.which("ptxas") is None and not os.path.exists("/usr/local/cuda/bin/ptxas"):
        pytest.skip("needs ptxas")
    args = (torch.randn(7, 3), torch.randn(2, 7, 5), torch.randn(2, 5, 3))
    fn = kf.jit(lambda x, a, b: torch.addbmm(x, a, b, alpha=0.5), target="cuda", arch="sm_90a")
    assert ".entry" in kf.inspect(fn, *args).ptx
