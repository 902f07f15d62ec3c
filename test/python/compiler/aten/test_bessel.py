"""The Bessel functions (compiler/aten/bessel.py) against torch on cpu and vulkan: fresh
random values at odd and empty sizes, through non-contiguous views, from integer and
16-bit dtypes, against float64 for accuracy, the limits at 0, +-inf and NaN, and as PTX
for cuda."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

_NO_VULKAN = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
TARGETS = ["cpu", pytest.param("vulkan", marks=_NO_VULKAN)]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")
S = torch.special

OPS = {
    "i0": lambda x: torch.i0(x), "special_i0": lambda x: S.i0(x), "i0e": lambda x: S.i0e(x),
    "i1": lambda x: S.i1(x), "i1e": lambda x: S.i1e(x),
    "modified_bessel_i0": lambda x: S.modified_bessel_i0(x), "modified_bessel_i1": lambda x: S.modified_bessel_i1(x),
    "modified_bessel_k0": lambda x: S.modified_bessel_k0(x), "modified_bessel_k1": lambda x: S.modified_bessel_k1(x),
    "scaled_modified_bessel_k0": lambda x: S.scaled_modified_bessel_k0(x),
    "scaled_modified_bessel_k1": lambda x: S.scaled_modified_bessel_k1(x),
    "bessel_j0": lambda x: S.bessel_j0(x), "bessel_j1": lambda x: S.bessel_j1(x),
    "bessel_y0": lambda x: S.bessel_y0(x), "bessel_y1": lambda x: S.bessel_y1(x),
    "spherical_bessel_j0": lambda x: S.spherical_bessel_j0(x),
}
# the oscillating ones are accurate to float32's absolute error near their zeros (as torch's)
_ABSOLUTE = {"bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1"}



def _values(n: int, gen) -> torch.Tensor:
    x = torch.randn(n, generator=gen) * 5
    x[n // 2:] = torch.rand(n - n // 2, generator=gen) * 90 - 20
    return x


def _all(x):
    return tuple(f(x) for f in OPS.values())


# Vulkan (lavapipe) takes a minute to compile the sixteen functions' kernel: it runs the
# largest size, the CPU every size
@pytest.mark.parametrize("target, n", [("cpu", 1), ("cpu", 7), ("cpu", 257), ("cpu", 0),
                                       pytest.param("vulkan", 257, marks=_NO_VULKAN)])
def test_follows_torch(n, target):
    gen = torch.Generator().manual_seed(n + 3)
    x = _values(n, gen)
    for name, got, want in zip(OPS, kf.jit(_all, target=target)(x), _all(x)):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, equal_nan=True, msg=name)


@pytest.mark.parametrize("target", TARGETS)
def test_within_a_few_ulp_of_float64(target):
    """Within 16 ulp of the float64 value (the oscillating ones: 16 ulp of 1 absolute below 1, which
    is torch's own float32 accuracy near their zeros); i0 and i1 up to their overflow."""
    gen = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(4000, generator=gen) * 3, torch.rand(4000, generator=gen) * 90,
                   -torch.rand(2000, generator=gen) * 90, torch.tensor([2.0, 8.0, 15.0, 1e-20])])
    for name, got, want in zip(OPS, kf.jit(_all, target=target)(x), _all(x.double())):
        got = got.double()
        keep = want.isfinite() & (want.abs() < 3e38) & (want.abs() > 1.2e-38)  # float32's normal range
        scale = want.abs().clamp(min=1) if name in _ABSOLUTE else want.abs()
        assert bool(((got - want).abs() <= 16 * 2 ** -23 * scale)[keep].all()), \
            (name, ((got - want).abs() / scale)[keep].max() / 2 ** -23)


@pytest.mark.parametrize("target", TARGETS)
def test_limits(target):
    """0, +-inf and NaN: kf gives the functions' limits where torch gives NaN at +-inf (i0,
    i1: +-inf; the J and Y: 0)."""
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0])
    inf, nan = float("inf"), float("nan")
    want = {
        "i0": [1, 1, inf, inf, nan, 1.2660658], "i1": [0, -0.0, inf, -inf, nan, -0.5651591],
        "i0e": [1, 1, 0, 0, nan, 0.4657596], "i1e": [0, 0, 0, 0, nan, -0.2079104],
        "modified_bessel_k0": [inf, inf, 0, nan, nan, nan], "modified_bessel_k1": [inf, inf, 0, nan, nan, nan],
        "scaled_modified_bessel_k0": [inf, inf, 0, nan, nan, nan],
        "bessel_j0": [1, 1, 0, 0, nan, 0.7651977], "bessel_j1": [0, 0, 0, 0, nan, -0.4400506],
        "bessel_y0": [-inf, -inf, 0, nan, nan, nan], "bessel_y1": [-inf, -inf, 0, nan, nan, nan],
        "spherical_bessel_j0": [1, 1, 0, 0, nan, 0.84147096],
    }
    got = kf.jit(lambda x: tuple(OPS[name](x) for name in want), target=target)(x)
    for name, g in zip(want, got):
        torch.testing.assert_close(g, torch.tensor(want[name], dtype=torch.float32), equal_nan=True, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_every_dtype(dtype, target="cpu"):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(37, generator=gen) * 12
    x = x.to(dtype) if dtype.is_floating_point else x.round().to(dtype)

    def fn(x):
        return S.i0e(x), S.bessel_j1(x), S.modified_bessel_k1(x)

    # torch has no 16-bit Bessel functions: kf computes them in float32, rounded once
    wants = fn(x) if not dtype.is_floating_point else tuple(w.to(dtype) for w in fn(x.float()))
    for got, want in zip(kf.jit(fn, target=target)(x), wants):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous(target):
    gen = torch.Generator().manual_seed(5)
    x = _values(13 * 9, gen).reshape(9, 13).t()
    y = (torch.rand(13, 18, generator=gen) * 30)[:, ::2]

    def fn(x, y):
        return torch.i0(x), S.bessel_y0(y), S.modified_bessel_k0(y) + S.bessel_j0(x)

    for got, want in zip(kf.jit(fn, target=target)(x, y), fn(x, y)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_float64_is_refused():
    with pytest.raises(kf.UnsupportedOpError, match=r"i0 of float64(.|\n)*test_bessel.py"):
        kf.jit(OPS["i0"])(torch.rand(5, dtype=torch.float64))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    assert ".entry" in kf.inspect(kf.jit(_all, target="cuda"), torch.randn(257)).stages["ptx"]
