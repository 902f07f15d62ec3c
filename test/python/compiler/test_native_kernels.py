"""Calls that launch CUDA code of their own (compiler/native_kernels.py): a
torch.cuda.jiterator function in a kf function is an UnsupportedOpError at the user's
line from either capture path, and the C function it calls is torch's own again after."""

from __future__ import annotations

import pytest
import torch

import kf
from kf import native_kernels

NAME = native_kernels.NAMES[0]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _jitted():
    j = torch.cuda.jiterator._create_jit_fn("template <typename T> T add_twice(T x, T y) { return x + 2 * y; }")
    j.is_cuda_available = True  # reach torch's C function on a machine without CUDA too
    return j


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("capture", ["trace", "export"])
def test_a_jiterator_call_is_refused_at_its_line(capture, monkeypatch):
    if capture == "export":
        monkeypatch.setenv("KF_CAPTURE", "export")
    before = getattr(torch._C, NAME, None)
    j = _jitted()

    def f(x):
        return j(x, x) * 3  # the jiterator line

    with pytest.raises(kf.UnsupportedOpError, match="jiterator") as info:
        kf.jit(f, target="cpu")(torch.randn(5))
    assert info.value.loc is not None and info.value.loc.function == "f"
    assert getattr(torch._C, NAME, None) is before


def test_refusing_nests_and_puts_torch_back():
    before = getattr(torch._C, NAME, None)
    with native_kernels.refusing():
        with native_kernels.refusing():
            assert getattr(torch._C, NAME) is native_kernels._refuse
        assert getattr(torch._C, NAME) is native_kernels._refuse
    assert getattr(torch._C, NAME, None) is before
    assert native_kernels.refused(RuntimeError("x")) is None


@needs_cuda
def test_jiterator_on_cuda_leaves_the_context_usable():
    """On a GPU: the refusal comes before any launch, so the process's CUDA context is
    not poisoned (OpInfo jiterator_2inputs_2outputs#0 once failed with an illegal
    address and every later case of its worker with it)."""
    j = torch.cuda.jiterator._create_jit_fn("template <typename T> T add_twice(T x, T y) { return x + 2 * y; }")
    x = torch.randn(257, device="cuda")
    with pytest.raises(kf.UnsupportedOpError, match="jiterator"):
        kf.jit(lambda t: j(t, t), target="cuda")(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(j(x, x), 3 * x)
    torch.testing.assert_close(kf.jit(lambda t: t * 2 + 1, target="cuda")(x), x * 2 + 1)
