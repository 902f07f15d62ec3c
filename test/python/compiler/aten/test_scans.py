"""Scans (compiler/aten/scans.py, kf.scan): cumsum, cumprod, logcumsumexp, cummax and
cummin against
torch on fresh random inputs -- any dim, dtype=, integer and boolean inputs, 16-bit
floats, odd sizes (1, 7, 257), size 0, 0-d, non-contiguous views -- on cpu (linalg)
and vulkan (the generic strategy), and as PTX that ptxas assembles for sm_90a."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")


def cumsum(x, dim):
    return torch.cumsum(x, dim)


def cumprod(x, dim):
    return torch.cumprod(x, dim)


def logcumsumexp(x, dim):
    return torch.logcumsumexp(x, dim)


def cummax(x, dim):
    return torch.cummax(x, dim)


def cummin(x, dim):
    return torch.cummin(x, dim)


SCANS = [cumsum, cumprod, logcumsumexp]


def _check(fn, x, target, tol=1e-5, **kw):
    got = kf.jit(fn, target=target)(x, **kw)
    want = fn(x, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((257,), -1), ((3, 257), 1), ((7, 5), 0),
                                       ((2, 7, 3), 1), ((2, 3, 7), -1)], ids=str)
@pytest.mark.parametrize("fn", SCANS, ids=lambda f: f.__name__)
def test_scan_matches_torch(fn, shape, dim, target):
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    x = torch.randn(shape, generator=gen)
    if fn is cumprod:
        x = 1 + 0.05 * x  # products of a long row stay finite and away from 0
    _check(fn, x, target, dim=dim)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", SCANS, ids=lambda f: f.__name__)
def test_scan_of_nothing_of_a_scalar_and_of_a_view(fn, target):
    _check(fn, torch.randn(0, 3), target, dim=0)
    _check(fn, torch.randn(()), target, dim=0)
    _check(fn, torch.randn(7, 5).t(), target, dim=1)
    _check(fn, torch.randn(4, 9)[:, ::2], target, dim=-1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("fn", [cumsum, cumprod], ids=lambda f: f.__name__)
def test_integer_scans_give_int64_as_torch(fn, dtype, target):
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, (4, 9), generator=gen, dtype=dtype) if dtype != torch.bool else \
        torch.rand(4, 9, generator=gen) > 0.5
    _check(fn, x, target, dim=1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_scans_accumulate_in_f32(dtype, target):
    x = torch.randn(3, 65, generator=torch.Generator().manual_seed(5)).to(dtype)
    got = kf.jit(cumsum, target=target)(x, dim=1)
    # torch accumulates in f32 and rounds each element once, as kf does
    torch.testing.assert_close(got, torch.cumsum(x, 1), rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_cumsum_dtype_argument(target):
    x = torch.randint(-5, 5, (3, 7), dtype=torch.int32)
    _check(lambda x: torch.cumsum(x, 1, dtype=torch.float32), x, target)
    _check(lambda x: x.cumsum(0, dtype=torch.int32), x, target)


@pytest.mark.parametrize("target", TARGETS)
def test_logcumsumexp_infinities_and_nan(target):
    x = torch.tensor([[float("-inf"), float("-inf"), 0.0, float("inf"), 1.0],
                      [1.0, float("nan"), 2.0, -3.0, float("-inf")]])
    _check(logcumsumexp, x, target, dim=1)
    _check(cumsum, x, target, dim=1)


def _check_pair(fn, x, target, **kw):
    got, want = kf.jit(fn, target=target)(x, **kw), fn(x, **kw)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((257,), -1), ((3, 257), 1), ((7, 5), 0),
                                       ((2, 7, 3), 1)], ids=str)
@pytest.mark.parametrize("op", [cummax, cummin], ids=lambda f: f.__name__)
def test_cummax_cummin_match_torch(op, shape, dim, target):
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    _check_pair(op, torch.randn(shape, generator=gen), target, dim=dim)
    # ties move the index on, as torch's
    _check_pair(op, torch.randint(0, 3, shape, generator=gen).float(), target, dim=dim)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", [cummax, cummin], ids=lambda f: f.__name__)
def test_cummax_cummin_nan_types_scalars_and_views(op, target):
    nan, inf = float("nan"), float("inf")
    _check_pair(op, torch.tensor([[1.0, nan, 3.0, nan, -inf], [inf, 2.0, inf, -inf, nan]]), target, dim=1)
    gen = torch.Generator().manual_seed(9)
    for dtype in (torch.int32, torch.int64):
        x = torch.randint(-5, 5, (4, 9), generator=gen, dtype=dtype)
        x[0, 3] = torch.iinfo(dtype).min
        x[1, 4] = torch.iinfo(dtype).max
        _check_pair(op, x, target, dim=1)
    _check_pair(op, torch.rand(4, 9, generator=gen) > 0.5, target, dim=1)
    _check_pair(op, torch.randn(4, 9, generator=gen).half(), target, dim=0)
    _check_pair(op, torch.randn((), generator=gen), target, dim=0)
    _check_pair(op, torch.randn(0, 3), target, dim=0)
    _check_pair(op, torch.randn(7, 5, generator=gen).t(), target, dim=1)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_scans_assemble_for_cuda():
    def fn(x):
        return torch.cumsum(x, 1), torch.cumprod(x, 0), torch.logcumsumexp(x, -1), torch.cummax(x, 1)

    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), torch.randn(7, 257)).stages["ptx"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, n", [((1,), None), ((1,), 3), ((7,), None), ((5,), 2), ((2, 13), 4), ((0,), 3),
                                      ((3, 0), 5), ((257,), 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_vander_matches_torch(target, shape, n, dtype):
    """torch.linalg.vander: ones, then the cumulative product of x (torch's own rounding)."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 2 if dtype.is_floating_point else \
        torch.randint(-5, 6, shape, generator=gen)
    if len(shape) == 2:
        x = x.t().contiguous().t()
    if n is None and shape[-1] < 2:
        pytest.skip("torch needs N > 1")
    fn = lambda x: torch.linalg.vander(x, N=n)  # noqa: E731
    got, want = kf.jit(fn, target=target)(x), fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, dim", [((1,), -1), ((7,), 0), ((3, 13), 1), ((3, 13), 0), ((257,), -1), ((0, 4), 0),
                                        ((4, 2, 5), 1)], ids=str)
@pytest.mark.parametrize("spacing", ["dx", "x1d", "xnd"])
def test_cumulative_trapezoid_matches_torch(target, shape, dim, spacing):
    """torch.cumulative_trapezoid with a spacing and with sample points (1-d, or of y's
    shape), through a non-contiguous y."""
    gen = torch.Generator().manual_seed(sum(shape) + len(spacing))
    y = torch.randn(shape[::-1], generator=gen).permute(*reversed(range(len(shape))))
    n = shape[dim]
    if spacing == "dx":
        fn, args = (lambda y: torch.cumulative_trapezoid(y, dx=0.3, dim=dim)), (y,)
    else:
        x = torch.rand(n if spacing == "x1d" else shape, generator=gen).cumsum(dim=-1 if spacing == "x1d" else dim)
        fn, args = (lambda y, x: torch.cumulative_trapezoid(y, x, dim=dim)), (y, x)
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
