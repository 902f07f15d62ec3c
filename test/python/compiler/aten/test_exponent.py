"""frexp and nextafter (compiler/aten/exponent.py) against torch on cpu and vulkan, bit for
bit: fresh random values over float32's whole range (subnormals too) at odd and empty sizes,
0, +-inf, NaN, powers of two, non-contiguous views, 16-bit frexp, refusals, PTX for cuda."""

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
SPECIALS = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -2.0, 0.5, 2.0 ** -126, 2.0 ** -149,
            -1e-40, 3.4028234663852886e38, 2.0 ** 127, 0.75]



def _values(n: int, gen) -> torch.Tensor:
    x = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 25)
    k = min(n, len(SPECIALS))
    x[:k] = torch.tensor(SPECIALS[:k])
    return x[torch.randperm(n, generator=gen)]


def _fn(x, y):
    m, e = torch.frexp(x)
    return m, e, torch.nextafter(x, y), torch.nextafter(y, x)


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])
    if got.is_floating_point():
        assert torch.equal(got[~want.isnan()].signbit(), want[~want.isnan()].signbit())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
def test_follows_torch_bit_for_bit(n, target):
    gen = torch.Generator().manual_seed(n)
    x, y = _values(n, gen), _values(n, gen)
    y[: n // 4] = x[: n // 4]  # x == y gives y
    for got, want in zip(kf.jit(_fn, target=target)(x, y), _fn(x, y)):
        _same(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_and_16_bit(target):
    gen = torch.Generator().manual_seed(3)
    x = _values(13 * 9, gen).reshape(9, 13).t()
    y = _values(13, gen)[:, None]
    for got, want in zip(kf.jit(_fn, target=target)(x, y), _fn(x, y)):
        _same(got, want)
    for dtype in (torch.float16, torch.bfloat16):
        h = (torch.randn(37, generator=gen) * 100).to(dtype)
        for got, want in zip(kf.jit(lambda h: torch.frexp(h), target=target)(h), torch.frexp(h)):
            _same(got, want)


def test_refusals_name_the_op():
    """nextafter steps by float32's spacing and frexp reads float32's exponent."""
    with pytest.raises(kf.UnsupportedOpError, match=r"nextafter of bf16(.|\n)*test_exponent.py"):
        kf.jit(lambda x: torch.nextafter(x, x + 1))(torch.rand(5, dtype=torch.bfloat16))
    with pytest.raises(kf.UnsupportedOpError, match=r"frexp of float64(.|\n)*test_exponent.py"):
        kf.jit(lambda x: torch.frexp(x))(torch.rand(5, dtype=torch.float64))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    x = torch.randn(257)
    assert ".entry" in kf.inspect(kf.jit(_fn, target="cuda"), x, x + 1).stages["ptx"]
