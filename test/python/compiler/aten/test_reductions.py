"""torch.cov and torch.corrcoef (compiler/aten/reductions.py) without weights, against
torch on cpu and vulkan: one variable (rank 0 and 1), several, corrections that leave no
degrees of freedom (inf and NaN as torch), odd sizes and non-contiguous inputs; and
weights refused with a clear error."""

from __future__ import annotations

import warnings

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
SHAPES = [(), (1,), (7,), (3, 5), (1, 13), (257, 2), (2, 257), (4, 1)]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


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
