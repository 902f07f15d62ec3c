"""compiler/aten_to_kf.py: ATen handlers against torch eager on fresh random inputs."""

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                  reason="no Vulkan device"))]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def gather_0d(x, i):
    return torch.gather(x, 0, i) * 2


def index_select_0d(x, i):
    return torch.index_select(x, -1, i) + 1


def scatter_add_0d(x, i, s):
    return torch.scatter_add(x, 0, i, s)


def topk_0d(x):
    return torch.topk(x, 1).values * 3


def transpose_0d(x, y):
    return x.transpose(0, -1) + y


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn,make", [
    (gather_0d, lambda: (torch.randn(()), torch.zeros((), dtype=torch.int64))),
    (index_select_0d, lambda: (torch.randn(()), torch.zeros(1, dtype=torch.int64))),
    (scatter_add_0d, lambda: (torch.randn(()), torch.zeros((), dtype=torch.int64), torch.randn(()))),
    (topk_0d, lambda: (torch.randn(()),)),
    (transpose_0d, lambda: (torch.randn(()), torch.randn(3))),
], ids=lambda v: getattr(v, "__name__", ""))
def test_zero_dim_operands_of_indexing_ops(target, fn, make):
    """dim 0 (or -1) of a 0-dim tensor is its one element in torch; the handlers took
    ``dim % rank`` and divided by zero (an internal compiler error)."""
    args = make()
    out = kf.jit(target=target)(fn)(*args)
    want = fn(*args)
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want)
