"""Layout ops' copy forms, unbind and roll (compiler/aten/layout.py): view_copy, permute_copy,
narrow_copy (a negative start counts from the end), unbind, unbind_copy and roll against torch
on cpu and vulkan, at odd and empty sizes, through non-contiguous views, for every dtype
kf takes, and as PTX for cuda."""

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


def _fn(x):
    n = x.shape[1]
    return (torch.view_copy(x, (-1,)), torch.permute_copy(x, (1, 2, 0)),
            torch.narrow_copy(x, 1, -n, n), torch.narrow(x, 1, -1, 1) if n else x[:, :0],
            *torch.unbind_copy(x, 2), *torch.unbind(x, -1))


def _check(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
def test_follows_torch(n, target):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, 2, generator=gen)
    _check(kf.jit(_fn, target=target)(x), _fn(x))


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous(target):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 14, generator=gen)[:, :, ::2].transpose(0, 2)  # (7, 2, 5)
    _check(kf.jit(_fn, target=target)(x), _fn(x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool], ids=str)
def test_every_dtype(dtype, target):
    x = (torch.randn(3, 5, 4) * 5).to(dtype)
    _check(kf.jit(_fn, target=target)(x), _fn(x))


@pytest.mark.parametrize("target", TARGETS)
def test_narrow_negative_start(target):
    """narrow's negative start counts from the end of the dim (it was taken as a slice
    from that negative index)."""
    x = torch.randn(4, 9)

    def fn(x):
        return torch.narrow(x, 1, -5, 3), torch.narrow(x, -2, -4, 2)

    _check(kf.jit(fn, target=target)(x), fn(x))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    x = torch.randn(3, 7, 2)
    assert ".entry" in kf.inspect(kf.jit(lambda x: _fn(x)[:5], target="cuda"), x).stages["ptx"]


def _rolls(x):
    return (torch.roll(x, 2, 0), torch.roll(x, -3, 1), torch.roll(x, (1, 300), (1, -1)), torch.roll(x, 5),
            torch.roll(x, 0, 2))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 2), (2, 257, 3), (3, 0, 2)], ids=str)
def test_roll_follows_torch(shape, target):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    _check(kf.jit(_rolls, target=target)(x), _rolls(x))


@pytest.mark.parametrize("target", TARGETS)
def test_roll_of_a_scalar_a_view_and_integers(target):
    x = torch.randn(5, 2, 14)[:, :, ::2].transpose(0, 2)
    _check(kf.jit(_rolls, target=target)(x), _rolls(x))
    y = torch.randint(-9, 9, (4, 5, 3), dtype=torch.int32)
    _check(kf.jit(_rolls, target=target)(y), _rolls(y))
    s = torch.randn(())
    _check(kf.jit(lambda s: (torch.roll(s, 3), torch.roll(s, -1)), target=target)(s),
           (torch.roll(s, 3), torch.roll(s, -1)))


@pytest.mark.parametrize("target", TARGETS)
def test_cat_with_empty_tensors_first_and_last(target):
    def fn(a, b, e):
        return torch.cat([e, a, b, e], 1), torch.cat([a, e], 1), torch.block_diag(a, e)

    gen = torch.Generator().manual_seed(3)
    args = (torch.randn(2, 3, generator=gen), torch.randn(2, 5, generator=gen), torch.randn(2, 0))
    _check(kf.jit(fn, target=target)(*args), fn(*args))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,offset,dim1,dim2", [
    ((5, 7), 0, 0, 1), ((5, 7), 2, 0, 1), ((5, 7), -3, 1, 0), ((3, 4, 6), 1, 2, 0), ((2, 0, 3), 0, 0, 2),
    ((4, 4), 9, 0, 1), ((1, 257), 0, -1, -2)])
def test_diagonal(shape, offset, dim1, dim2, target):
    gen = torch.Generator().manual_seed(sum(shape) + offset)
    x = torch.randn(shape, generator=gen)

    def fn(x):
        return torch.diagonal(x, offset, dim1, dim2) * 2, torch.diagonal_copy(x, offset, dim1, dim2)

    _check(kf.jit(fn, target=target)(x), fn(x))
    if len(shape) == 2:
        xt = torch.randn(tuple(reversed(shape)), generator=gen).t()  # strided
        _check(kf.jit(fn, target=target)(xt), fn(xt))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (3, 257), (0, 4)], ids=str)
def test_constant_pad_nd_and_flip(shape, target):
    """constant_pad_nd (positive amounts join fills, negative ones slice) and flip (an
    index_select of n - 1 - i per dim) against torch, on odd sizes, size 0 and views."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen)

    def fn(x):
        return (torch.constant_pad_nd(x, (1, 2)), torch.constant_pad_nd(x, (0, -1, 2, 0), 1.5),
                torch.constant_pad_nd(x, (-1, 3)), torch.flip(x, [0]), torch.flip(x, [-1, 0]))

    f = kf.jit(fn, target=target)
    for v in (x, x.t().contiguous().t(), torch.randn(shape[0], 2 * shape[1], generator=gen)[:, ::2]):
        for g, w in zip(f(v), fn(v), strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
