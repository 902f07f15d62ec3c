"""Reductions (compiler/aten/reductions.py) against torch on fresh random inputs, on cpu
and vulkan: argmin, aminmax, all / any over dims, prod and the vector norms of every order
(every dim, keepdim, the whole tensor, NaN, integer extremes, booleans, odd sizes (1, 7,
257), 0-d and empty tensors, non-contiguous views, and as PTX that ptxas assembles for
sm_90a); torch.cov and torch.corrcoef without weights (one variable and several,
corrections that leave no degrees of freedom: inf and NaN as torch), weights refused.
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")
SHAPES = [(), (1,), (7,), (3, 5), (1, 13), (257, 2), (2, 257), (4, 1)]



def _flat(out):
    return [t for o in out for t in _flat(o)] if isinstance(out, tuple) else [out]


def _check(fn, x, target, tol=1e-5):
    got, want = _flat(kf.jit(fn, target=target)(x)), _flat(fn(x))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)


def _all_forms(dim):
    return lambda x: (torch.argmin(x, dim), torch.argmin(x, dim, keepdim=True), torch.argmin(x),
                      torch.aminmax(x, dim=dim), torch.aminmax(x, dim=dim, keepdim=True), torch.aminmax(x),
                      x.gt(0).all(dim), x.gt(0).any(dim, keepdim=True), x.ge(-1).all(), x.ge(1).any(),
                      torch.prod(x, dim), torch.prod(x, dim, keepdim=True), torch.prod(x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((257,), -1), ((3, 9), 1), ((9, 4), 0),
                                       ((2, 7, 3), 1)], ids=str)
def test_reductions_match_torch(shape, dim, target):
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    x = 1 + 0.1 * torch.randn(shape, generator=gen)  # products stay finite
    _check(_all_forms(dim), x, target)


@pytest.mark.parametrize("target", TARGETS)
def test_all_any_over_several_dims_and_of_numbers(target):
    x = torch.randint(0, 3, (3, 4, 5), generator=torch.Generator().manual_seed(1)).float()
    _check(lambda x: (x.all(dim=(0, 2)), x.any(dim=(1, 2), keepdim=True), x.all(dim=()), x.int().all(1)), x, target)


@pytest.mark.parametrize("target", TARGETS)
def test_nan_is_the_extreme(target):
    nan = float("nan")
    x = torch.tensor([[3.0, nan, -1.0, nan], [2.0, -1.0, -1.0, 5.0]])
    _check(lambda x: (torch.argmin(x, 1), torch.argmin(x), torch.aminmax(x, dim=1), x.min(1)), x, target)
    # rows long enough for the row kernel's vector loads, a NaN in any lane
    y = torch.randn(9, 257, generator=torch.Generator().manual_seed(6))
    for r in range(8):
        y[r, 31 * r + r % 4] = nan
    _check(lambda y: (torch.amax(y, 1), torch.amin(y, 1), torch.aminmax(y, dim=1), y.max(1).values,
                      torch.linalg.vector_norm(y, float("inf"), dim=1)), y, target)


@pytest.mark.parametrize("target", TARGETS)
def test_integer_extremes_and_booleans(target):
    for dtype in (torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.tensor([[4, info.min, 0, info.min], [info.max, 3, info.max, 7]], dtype=dtype)
        _check(lambda x: (torch.argmin(x, 1), torch.argmin(x), x.min(1), torch.aminmax(x)), x, target)
    b = torch.tensor([[True, False, False], [True, True, True]])
    _check(lambda x: (torch.prod(x, 1), x.all(1), x.any(0)), b, target)


@pytest.mark.parametrize("target", TARGETS)
def test_reductions_of_a_scalar_nothing_and_views(target):
    gen = torch.Generator().manual_seed(2)
    _check(lambda x: (torch.argmin(x), torch.argmin(x, 0, keepdim=True), torch.aminmax(x, dim=0),
                      torch.prod(x, 0, keepdim=True), x.all(), x.gt(0).any(0)), torch.randn((), generator=gen),
           target)
    _check(lambda x: (torch.prod(x, 0), torch.prod(x, 1), x.all(0), x.any(0)), torch.randn(0, 3), target)
    _check(_all_forms(1), 1 + 0.1 * torch.randn(9, 6, generator=gen).t(), target)
    _check(_all_forms(0), 1 + 0.1 * torch.randn(5, 9, generator=gen)[:, ::2], target)


@pytest.mark.parametrize("target", TARGETS)
def test_prod_of_integers_and_dtype(target):
    x = torch.randint(-3, 4, (4, 7), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    _check(lambda x: (torch.prod(x, 1), torch.prod(x), torch.prod(x, 0, dtype=torch.float32)), x, target)
    _check(lambda x: torch.prod(x, 1, dtype=torch.float32), torch.randn(3, 5).half(), target, tol=1e-3)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_reductions_assemble_for_cuda():
    assert ".entry" in kf.inspect(kf.jit(_all_forms(1), target="cuda"), torch.randn(7, 257)).stages["ptx"]


def _norms(x):
    inf = float("inf")
    return (torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, inf, dim=1),
            torch.linalg.vector_norm(x, -inf, dim=(0,), keepdim=True), torch.linalg.vector_norm(x, 0, dim=-1),
            torch.linalg.vector_norm(x, 1, dim=1), torch.linalg.vector_norm(x, 3.5, dim=0),
            torch.norm(x, inf), torch.norm(x, 2, dim=1), torch.norm(x, 0.5, dim=[0, 1], keepdim=True),
            torch.ops.aten.norm.Scalar(x, inf), torch.ops.aten.norm.Scalar(x, -inf), torch.ops.aten.norm.Scalar(x, 0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (3, 257)], ids=str)
def test_vector_norms(shape, target):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    x[0, 0] = 0.0
    _check(_norms, x, target, tol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_vector_norms_of_views_16_bit_scalars_and_nothing(target):
    gen = torch.Generator().manual_seed(4)
    _check(_norms, torch.randn(9, 6, generator=gen).t(), target, tol=1e-4)
    _check(lambda x: (torch.linalg.vector_norm(x, 2, dim=1), torch.linalg.vector_norm(x, 3.0, dim=1,
                                                                                        dtype=torch.float32)),
           torch.randn(4, 33, generator=gen).half(), target, tol=2e-3)
    _check(lambda x: (torch.linalg.vector_norm(x), torch.ops.aten.norm.Scalar(x, float("inf"))),
           torch.randn((), generator=gen), target)
    _check(lambda x: (torch.linalg.vector_norm(x, dim=0), torch.linalg.vector_norm(x, 1)), torch.randn(0, 3), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, float("inf"), 1.5])
@pytest.mark.parametrize("s1,s2", [((7, 5), (3, 5)), ((1, 1), (1, 1)), ((2, 1, 30, 4), (3, 27, 4)),
                                   ((4, 0), (2, 0))], ids=str)
def test_cdist(s1, s2, p, target):
    gen = torch.Generator().manual_seed(sum(s1) + sum(s2))
    a, b = torch.randn(s1, generator=gen), torch.randn(s2, generator=gen)
    got, want = kf.jit(lambda a, b: torch.cdist(a, b, p), target=target)(a, b), torch.cdist(a, b, p)
    # torch's Euclidean distances past 25 rows come from a product (x^2 + y^2 - 2xy):
    # kf's direct differences are compared with float64's
    ref = torch.cdist(a.double(), b.double(), p).float()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_cdist_of_views(target):
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(5, 9, generator=gen).t(), torch.randn(9, 4, generator=gen)[::2].t().contiguous().t()
    got = kf.jit(lambda a, b: torch.cdist(a, b.t()), target=target)(a, b)
    torch.testing.assert_close(got, torch.cdist(a.double(), b.t().double()).float(), rtol=1e-5, atol=1e-5)


def _matrix_norms(x):
    inf = float("inf")
    return (torch.linalg.norm(x), torch.linalg.norm(x, inf), torch.linalg.norm(x, -1, keepdim=True),
            torch.linalg.norm(x, "fro"), torch.linalg.norm(x, 3.0, dim=1), torch.linalg.norm(x, dim=(1, 0)),
            torch.linalg.matrix_norm(x, 1), torch.linalg.matrix_norm(x, -inf, dim=(1, 0), keepdim=True),
            torch.linalg.norm(x[0]), torch.linalg.norm(x[0], -2))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (3, 257)], ids=str)
def test_linalg_norms(shape, target):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + 1))
    _check(_matrix_norms, x, target, tol=1e-4)
    _check(_matrix_norms, torch.randn(shape[::-1], generator=torch.Generator().manual_seed(2)).t(), target, tol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_linalg_norms_of_nothing_and_singular_value_orders(target):
    _check(lambda x: (torch.linalg.norm(x, keepdim=True), torch.linalg.norm(x[:, 0], 2, keepdim=True)),
           torch.randn(0, 5, 5), target)
    with pytest.raises(kf.UnsupportedOpError, match="singular values"):
        kf.jit(lambda x: torch.linalg.matrix_norm(x, "nuc"), target=target)(torch.randn(3, 4))


def _input(shape, contiguous: bool):
    gen = torch.Generator().manual_seed(len(shape) * 31 + sum(shape))
    if contiguous or len(shape) < 2:
        return torch.randn(shape, generator=gen) * 3
    return (torch.randn(shape[::-1], generator=gen) * 3).t()


def _close(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("correction", [1, 0, 2, 6])
@pytest.mark.parametrize("contiguous", [True, False])
def test_cov_matches_torch(target, shape, correction, contiguous):
    x = _input(shape, contiguous)
    fn = lambda x: torch.cov(x, correction=correction)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns where no degrees of freedom are left
        want = fn(x)
    _close(kf.jit(fn, target=target)(x), want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("contiguous", [True, False])
def test_corrcoef_matches_torch(target, shape, contiguous):
    x = _input(shape, contiguous)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.corrcoef(x)
    _close(kf.jit(lambda x: torch.corrcoef(x), target=target)(x), want)


def test_corrcoef_of_a_constant_variable_is_nan():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    _close(kf.jit(lambda x: torch.corrcoef(x), target="cpu")(x), torch.corrcoef(x))


def test_cov_with_weights_is_refused():
    x, w = torch.randn(2, 5), torch.rand(5)
    with pytest.raises(kf.CompileError):
        kf.jit(lambda x, w: torch.cov(x, aweights=w), target="cpu")(x, w)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(4, 3), (2, 5, 7), (3, 2, 1, 257), (5, 1, 3, 3)], ids=str)
def test_batch_norm_with_update_matches_torch(shape, target):
    """aten._batch_norm_with_update_functional (a training batch norm that moves its
    running statistics): the output, the saved mean and rstd, the reserve (uint8, no
    elements) and the new running statistics, on contiguous and transposed inputs."""
    g = torch.Generator().manual_seed(sum(shape))
    C = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 1
    w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)
    rm, rv = torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5

    def fn(x, w, b, rm, rv):
        return torch.ops.aten._batch_norm_with_update_functional(x, w, b, rm, rv, 0.3, 1e-5)

    for xin in (x, x.transpose(0, 1).contiguous().transpose(0, 1)):
        got, want = kf.jit(fn, target=target)(xin, w, b, rm, rv), fn(xin, w, b, rm, rv)
        assert len(got) == len(want) == 6
        for g_, w_ in zip(got, want):
            assert g_.dtype == w_.dtype and g_.shape == w_.shape
            torch.testing.assert_close(g_, w_, rtol=1e-4, atol=1e-4)
        assert got[3].dtype == torch.uint8 and got[3].numel() == 0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (4, 5), (257,), (0,), (3, 0)], ids=str)
def test_histc_matches_torch(shape, target):
    """Given ranges (elements outside, and exactly at min and max), the data's own range,
    one distinct value (the range widened by 1), NaN, non-contiguous inputs."""
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    x = torch.randn(shape, generator=g) * 6
    if x.numel() > 2:
        x.view(-1)[0], x.view(-1)[1] = 10.0, 0.0
    for bins, lo, hi in ((5, 0, 10), (7, 0, 0), (100, -3.5, 2.25), (1, -1, 1)):
        _check(lambda x: torch.histc(x, bins, lo, hi), x, target)
    _check(lambda x: torch.histc(x, 4), torch.full(shape, 2.5), target)
    if x.dim() == 2 and x.numel():
        _check(lambda x: torch.histc(x, 6, -5, 5), x.t(), target)
    if x.numel() > 3:
        y = x.clone()
        y.view(-1)[2] = float("nan")
        _check(lambda x: torch.histc(x, 6, -5, 5), y, target)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_histc_assembles_for_cuda():
    from kf.passes.to_cuda import assemble

    info = kf.inspect(kf.jit(lambda x: torch.histc(x, 10), target="cuda", arch="sm_90a"), torch.randn(100))
    assemble(info.stages["ptx"], "sm_90a")
