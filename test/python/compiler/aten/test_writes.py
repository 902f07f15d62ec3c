"""masked_scatter and diagonal_scatter (compiler/aten/writes.py) against torch on fresh
random inputs: masks that broadcast, more source than places, diagonals of every offset
and pair of dims, odd sizes (1, 7, 257), no elements, booleans and integers,
non-contiguous inputs, on cpu and vulkan; a source shorter than the mask's places an
error; PTX that ptxas assembles for sm_90a."""

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



def _check(fn, args, target):
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


def _scatter(x, m, s):
    return x.masked_scatter(m, s)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,mask_shape", [((1,), (1,)), ((7, 5), (7, 5)), ((3, 257), (257,)), ((4, 1), (4, 6)),
                                              ((0, 3), (0, 3))], ids=str)
def test_masked_scatter(shape, mask_shape, target):
    gen = torch.Generator().manual_seed(sum(shape) + sum(mask_shape))
    x, mask = torch.randn(shape, generator=gen), torch.rand(mask_shape, generator=gen) > 0.4
    source = torch.randn(int(torch.broadcast_shapes(shape, mask_shape).numel()) + 3, generator=gen)
    _check(_scatter, (x, mask, source), target)


@pytest.mark.parametrize("target", TARGETS)
def test_masked_scatter_of_other_types_and_views(target):
    gen = torch.Generator().manual_seed(2)
    mask = torch.rand(9, 6, generator=gen).t() > 0.5
    _check(_scatter, (torch.randint(-9, 9, (6, 9), generator=gen, dtype=torch.int32), mask,
                      torch.randint(-9, 9, (8, 9), generator=gen, dtype=torch.int32)), target)
    _check(_scatter, (torch.rand(6, 9, generator=gen) > 0.5, mask, torch.rand(60, generator=gen) > 0.5), target)
    _check(_scatter, (torch.randn(9, 6, generator=gen).t(), mask, torch.randn(7, 9, generator=gen)[:, ::2]), target)


@pytest.mark.parametrize("target", TARGETS)
def test_masked_scatter_short_source_is_an_error(target):
    mask = torch.tensor([True, False, True, True])
    with pytest.raises(kf.IndexOutOfRange, match="index 2 is out of range"):
        kf.jit(_scatter, target=target)(torch.zeros(4), mask, torch.ones(2))
    with pytest.raises(kf.IndexOutOfRange, match="index 1 is out of range"):
        kf.jit(_scatter, target=target)(torch.zeros(4), mask, torch.ones(0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,offset,d1,d2", [((1, 1), 0, 0, 1), ((7, 5), 2, 0, 1), ((7, 5), -3, 1, 0),
                                                ((3, 4, 257), 1, -1, 1), ((2, 3, 4), 5, 1, 2),
                                                ((4, 6, 2), -1, 0, 1)], ids=str)
def test_diagonal_scatter(shape, offset, d1, d2, target):
    gen = torch.Generator().manual_seed(sum(shape) + offset)
    x = torch.randn(shape, generator=gen)
    src = torch.randn(torch.diagonal(x, offset, d1, d2).shape, generator=gen)
    _check(lambda x, s: torch.diagonal_scatter(x, s, offset, d1, d2), (x, src), target)


@pytest.mark.parametrize("target", TARGETS)
def test_diagonal_scatter_of_views_and_integers(target):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 6, generator=gen).t()
    _check(lambda x, s: torch.diagonal_scatter(x, s, 1), (x, torch.randn(6, 5, generator=gen)[:, 1]), target)
    y = torch.randint(-5, 5, (5, 5), generator=gen, dtype=torch.int64)
    _check(lambda y, s: torch.diagonal_scatter(y, s), (y, torch.arange(5)), target)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_masked_and_diagonal_scatter_assemble_for_cuda():
    def fn(x, m, s):
        return _scatter(x, m, s), torch.diagonal_scatter(x, s[:7], -1, 1, 0)

    args = (torch.randn(7, 257), torch.rand(7, 257) > 0.5, torch.randn(2000))
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), *args).stages["ptx"]
