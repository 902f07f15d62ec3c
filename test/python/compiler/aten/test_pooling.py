"""max_unpool (compiler/aten/pooling.py) against torch on fresh random inputs: the
indices of max_pool (1-d, 2-d, 3-d; overlapping windows, whose repeated indices carry
one value), an output_size larger than the default, odd sizes, no batch dim, an empty
batch, non-contiguous inputs, on cpu and vulkan; an index outside its plane an error;
PTX that ptxas assembles for sm_90a."""

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
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)


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
