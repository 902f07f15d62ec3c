"""erfinv, ndtri, log_ndtr and erfcx (compiler/aten/error_function.py) against torch on cpu
and vulkan: fresh random values at odd and empty sizes, through non-contiguous views,
against float64 for accuracy, the limits, and as PTX for cuda."""

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
S = torch.special



def _all(p, y, x):
    """p in (0, 1), y in (-1, 1), x any."""
    return torch.erfinv(y), S.erfinv(y), S.ndtri(p), S.log_ndtr(x), S.erfcx(x)


def _inputs(n: int, gen):
    p = torch.rand(n, generator=gen)
    p[: n // 3] = 10 ** (-torch.rand(n // 3, generator=gen) * 37)  # the lower tail, normal floats
    y = torch.rand(n, generator=gen) * 2 - 1
    y[: n // 3] = 1 - p[: n // 3].clamp(min=6e-8)  # near 1
    x = torch.randn(n, generator=gen) * 4
    x[: n // 3] = torch.rand(n // 3, generator=gen) * 60 - 30
    return p, y, x


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
def test_follows_torch(n, target):
    """torch's tolerance, or no further from float64 than torch's float32 (which loses up to
    2e-5 in erfcx's e^(x^2) below -3)."""
    p, y, x = _inputs(n, torch.Generator().manual_seed(n))
    exact = _all(p.double(), y.double(), x.double())
    for got, want, w in zip(kf.jit(_all, target=target)(p, y, x), _all(p, y, x), exact):
        assert got.dtype == want.dtype and got.shape == want.shape
        near = (got.double() - w).abs() <= (want.double() - w).abs()
        torch.testing.assert_close(torch.where(near, want, got), want, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
def test_within_a_few_ulp_of_float64(target):
    """Within 8 ulp of float64 (log_ndtr's tail too, where computing erfc(x / sqrt 2) in
    float32 loses up to 80 ulp)."""
    p, y, x = _inputs(30000, torch.Generator().manual_seed(2))
    got = kf.jit(_all, target=target)(p, y, x)
    want = _all(p.double(), y.double(), x.double())
    for name, g, w in zip(["erfinv", "special.erfinv", "ndtri", "log_ndtr", "erfcx"], got, want):
        keep = w.isfinite() & (w.abs() < 3e38) & (w.abs() > 1.2e-38)
        err = ((g.double() - w).abs() / w.abs())[keep].max() / 2 ** -23
        assert err <= 8, (name, err)


@pytest.mark.parametrize("target", TARGETS)
def test_limits(target):
    inf, nan = float("inf"), float("nan")
    p = torch.tensor([0.0, 1.0, -0.5, 1.5, nan, 0.5])
    y = torch.tensor([1.0, -1.0, 1.5, -2.0, nan, -0.0])
    x = torch.tensor([inf, -inf, nan, 0.0, -30.0, 1e30])
    got = kf.jit(_all, target=target)(p, y, x)
    want = [[inf, -inf, nan, nan, nan, -0.0], None, [-inf, inf, nan, nan, nan, 0.0],
            [0.0, -inf, nan, -0.6931472, -454.3213, 0.0], [0.0, inf, nan, 1.0, inf, 5.641896e-31]]
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i], torch.tensor(w if w else want[0]), equal_nan=True, msg=str(i))
    assert bool(got[0][-1].signbit())


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_and_integers(target):
    gen = torch.Generator().manual_seed(5)
    p = torch.rand(9, 26, generator=gen)[:, ::2]
    y = (torch.rand(13, 9, generator=gen) * 2 - 1).t()
    x = torch.randint(-20, 20, (9, 13), generator=gen)
    for got, want in zip(kf.jit(_all, target=target)(p, y, x), _all(p, y, x)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_float64_is_refused():
    with pytest.raises(kf.UnsupportedOpError, match=r"erfinv of float64(.|\n)*test_error_function.py"):
        kf.jit(lambda y: torch.erfinv(y))(torch.rand(5, dtype=torch.float64))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    p, y, x = _inputs(257, torch.Generator().manual_seed(0))
    assert ".entry" in kf.inspect(kf.jit(_all, target="cuda"), p, y, x).stages["ptx"]
