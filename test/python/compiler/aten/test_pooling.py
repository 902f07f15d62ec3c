"""max_pool with and without indices, adaptive_max_pool, max_pool's backward and
max_unpool (compiler/aten/pooling.py) against torch on fresh random inputs: 1-d, 2-d,
3-d; strides, padding, dilation, ceil_mode, overlapping windows (whose repeated indices
carry one value), adaptive windows of unequal sizes, NaN and equal maxima in a window,
-inf beside padding, an output_size larger than the default, odd sizes, no batch dim,
an empty batch, non-contiguous inputs, on cpu and vulkan; an index outside its plane an
error; PTX that ptxas assembles for sm_90a."""

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



def _check(fn, args, target):
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    gots, wants = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(gots, wants, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


POOLS = {1: (F.max_pool1d, F.max_unpool1d), 2: (F.max_pool2d, F.max_unpool2d), 3: (F.max_pool3d, F.max_unpool3d)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,shape,kernel,stride", [
    (1, (2, 3, 7), 2, 2), (1, (1, 257), 3, 2), (2, (2, 3, 7, 5), 2, 2), (2, (3, 9, 8), 3, 2),
    (2, (1, 1, 1, 1), 1, 1), (3, (1, 2, 5, 4, 6), 2, 2), (3, (2, 3, 3, 3), 2, 1)], ids=str)
def test_max_unpool_matches_torch(k, shape, kernel, stride, target):
    pool, unpool = POOLS[k]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + kernel))
    values, indices = pool(x, kernel, stride, return_indices=True)
    # the input's own size: the default output may be smaller than a plane of odd size
    _check(lambda v, i: unpool(v, i, kernel, stride, output_size=shape[-k:]), (values, indices), target)


@pytest.mark.parametrize("target", TARGETS)
def test_max_unpool_output_size_views_and_nothing(target):
    gen = torch.Generator().manual_seed(5)
    values, indices = F.max_pool2d(torch.randn(2, 3, 9, 8, generator=gen), 2, return_indices=True)
    _check(lambda v, i: F.max_unpool2d(v, i, 2, output_size=(9, 9)), (values, indices), target)
    _check(lambda v, i: F.max_unpool2d(v, i, 2), (values.transpose(2, 3), indices.transpose(2, 3)), target)
    _check(lambda v, i: F.max_unpool2d(v, i, 2), (values[:0], indices[:0]), target)


@pytest.mark.parametrize("target", TARGETS)
def test_max_unpool_index_outside_its_plane_is_an_error(target):
    values, indices = F.max_pool2d(torch.randn(2, 3, 4, 4), 2, return_indices=True)
    indices[1, 2, 0, 1] = 16  # inside the tensor, outside its 4x4 plane
    with pytest.raises(kf.IndexOutOfRange, match="index 16 is out of range"):
        kf.jit(lambda v, i: F.max_unpool2d(v, i, 2), target=target)(values, indices)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_max_unpool_assembles_for_cuda():
    values, indices = F.max_pool2d(torch.randn(2, 3, 8, 8), 2, return_indices=True)
    assert ".entry" in kf.inspect(kf.jit(lambda v, i: F.max_unpool2d(v, i, 2), target="cuda"),
                                  values, indices).stages["ptx"]


MAX_POOLS = [
    (F.max_pool1d, (2, 6), dict(kernel_size=3, stride=2, padding=1)),
    (F.max_pool1d, (2, 3, 257), dict(kernel_size=4, stride=3, padding=2, dilation=2, ceil_mode=True)),
    (F.max_pool2d, (2, 3, 7, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2))),
    (F.max_pool2d, (2, 5, 5), dict(kernel_size=3, stride=2, ceil_mode=True)),
    (F.max_pool2d, (1, 2, 9, 9), dict(kernel_size=5, stride=1, padding=2)),
    (F.max_pool2d, (0, 3, 4, 4), dict(kernel_size=2)),
    (F.max_pool3d, (1, 2, 6, 7, 5), dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=1, dilation=(1, 2, 1))),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(MAX_POOLS)))
def test_max_pool_matches_torch(case, target):
    pool, shape, kw = MAX_POOLS[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(case))
    _check(lambda x: pool(x, **kw), (x,), target)
    _check(lambda x: pool(x, return_indices=True, **kw), (x,), target)
    if x.dim() >= 3:
        xt = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        _check(lambda x: pool(x, return_indices=True, **kw), (xt,), target)


@pytest.mark.parametrize("target", TARGETS)
def test_max_pool_ties_nan_and_inf_as_torch(target):
    """Equal maxima: the first in the window's scan; NaN: the maximum, at the last NaN
    of the window; a window of -inf beside padding: its first position."""
    x = torch.tensor([[[[1.0, 1.0, 2.0, 2.0], [1.0, float("nan"), 0.0, 2.0], [float("nan"), 3.0, -float("inf"),
                                                                                  -float("inf")],
                        [float("nan"), 0.0, -float("inf"), -float("inf")]]]])
    _check(lambda x: F.max_pool2d(x, 2, return_indices=True), (x,), target)
    _check(lambda x: F.max_pool2d(x, 3, 1, 1, return_indices=True), (x,), target)


ADAPTIVE = [(F.adaptive_max_pool1d, (3, 4, 7), 3), (F.adaptive_max_pool1d, (2, 5), 1),
            (F.adaptive_max_pool2d, (2, 5, 7), 3), (F.adaptive_max_pool2d, (1, 2, 6, 13), (4, 5)),
            (F.adaptive_max_pool3d, (1, 2, 5, 7, 3), (2, 3, 1))]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(ADAPTIVE)))
def test_adaptive_max_pool_matches_torch(case, target):
    pool, shape, size = ADAPTIVE[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(10 + case))
    _check(lambda x: pool(x, size, return_indices=True), (x,), target)
    _check(lambda x: pool(x, size), (x,), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,shape,kw", [(2, (2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
                                        (2, (3, 5, 5), dict(kernel_size=3, stride=2, ceil_mode=True)),
                                        (3, (1, 2, 5, 4, 6), dict(kernel_size=2, stride=1))], ids=str)
def test_max_pool_backward_matches_torch(k, shape, kw, target):
    pool = F.max_pool2d if k == 2 else F.max_pool3d
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    values, indices = pool(x, return_indices=True, **kw)
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(1))
    backward = torch.ops.aten.max_pool2d_with_indices_backward if k == 2 else \
        torch.ops.aten.max_pool3d_with_indices_backward
    args = [kw["kernel_size"], kw.get("stride", kw["kernel_size"]), kw.get("padding", 0), 1, kw.get("ceil_mode", False)]
    got = kf.jit(lambda g, x, i: backward(g, x, *args, i), target=target)(grad, x, indices)
    torch.testing.assert_close(got, backward(grad, x, *args, indices), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_max_pool_assembles_for_cuda():
    x = torch.randn(2, 3, 9, 8)
    info = kf.inspect(kf.jit(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), target="cuda", arch="sm_90a"),
                      x)
    from kf.passes.to_cuda import assemble

    assemble(info.stages["ptx"], "sm_90a")


@pytest.mark.parametrize("target", TARGETS)
def test_avg_pool_of_int64_divides_toward_zero(target):
    """torch's avg_pool of int64 (its CPU kernels) sums in int64 and divides by the count
    as C does, toward zero: kf.div of integers, over padding and ceil_mode's windows."""
    x = torch.randint(-100, 100, (2, 3, 9, 7), generator=torch.Generator().manual_seed(3))
    for fn in (lambda x: F.avg_pool2d(x, 3), lambda x: F.avg_pool2d(x, 3, 2, 1),
               lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
               lambda x: F.avg_pool1d(x[0], 2)):
        got, want = kf.jit(fn, target=target)(x), fn(x)
        assert got.dtype == want.dtype and torch.equal(got, want)
