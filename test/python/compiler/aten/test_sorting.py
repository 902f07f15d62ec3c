"""sort and argsort (compiler/aten/sorting.py) against torch on fresh random inputs:
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
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")


def _check(fn, x, target):
    got, want = kf.jit(fn, target=target)(x), fn(x)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
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


def test_sort_of_a_very_long_row_is_a_clear_error():
    with pytest.raises(kf.UnsupportedOpError, match="rows of 5000 elements"):
        kf.jit(lambda x: torch.sort(x), target="cpu")(torch.randn(5000))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_sort_assembles_for_cuda():
    assert ".entry" in kf.inspect(kf.jit(lambda x: torch.sort(x, dim=0, descending=True), target="cuda"),
                                  torch.randn(257, 3)).stages["ptx"]
