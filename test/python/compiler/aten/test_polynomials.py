"""The orthogonal polynomials of torch.special (compiler/aten/polynomials.py) with a Python
number n, against torch on cpu and vulkan: fresh random x at odd and empty sizes, through
non-contiguous views, against float64, with a tensor n refused, and as PTX for cuda."""

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
NAMES = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
         "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
         "legendre_polynomial_p"]
DEGREES = [-2, 0, 1, 2, 3, 7, 12]



def _all(x):
    return tuple(getattr(torch.special, name)(x, n) for name in NAMES for n in DEGREES)


def _values(n: int, gen) -> torch.Tensor:
    x = torch.rand(n, generator=gen) * 2 - 1  # the orthogonality interval
    x[n // 2:] = torch.randn(n - n // 2, generator=gen) * 2
    x[: min(n, 3)] = torch.tensor([1.0, -1.0, 0.0][: min(n, 3)])
    return x


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
def test_follows_torch(n, target):
    """torch's tolerance, or no further from float64 than torch's float32 (torch takes
    cos(n acos x) inside [-1, 1] for n > 6); Hermite's within 2e-5: its recurrence cancels
    outside [-1, 1], and torch's compiled loop fuses its multiply-adds, which kf's does not."""
    x = _values(n, torch.Generator().manual_seed(n))
    labels = [m for m in NAMES for _ in DEGREES]
    for name, got, want, exact in zip(labels, kf.jit(_all, target=target)(x), _all(x), _all(x.double())):
        assert got.dtype == want.dtype and got.shape == want.shape
        near = (got.double() - exact).abs() <= 2 * (want.double() - exact).abs()
        rtol = 2e-5 if name.startswith("hermite") else 1.3e-6
        torch.testing.assert_close(torch.where(near, want, got), want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_nan_and_views(target):
    """NaN gives NaN from degree 1 on (torch's values there vary: 0.0035, 2, -1), 1 at degree
    0 and 0 below, as torch."""
    x = torch.tensor([float("nan")] * 3)
    got = kf.jit(lambda x: tuple(getattr(torch.special, m)(x, n) for m in NAMES for n in (-1, 0, 2)),
                 target=target)(x)
    for i, g in enumerate(got):
        want = [0.0, 1.0, float("nan")][i % 3]
        torch.testing.assert_close(g, torch.full((3,), want), equal_nan=True)
    v = (torch.rand(9, 26, generator=torch.Generator().manual_seed(2)) * 2 - 1)[:, ::2].t()
    fn = lambda v: (torch.special.legendre_polynomial_p(v, 5), torch.special.hermite_polynomial_h(v, 4))  # noqa: E731
    for g, w in zip(kf.jit(fn, target=target)(v), fn(v)):
        torch.testing.assert_close(g, w)


def test_tensor_degree_is_refused():
    with pytest.raises(kf.UnsupportedOpError, match=r"n a tensor(.|\n)*test_polynomials.py"):
        kf.jit(lambda x, n: torch.special.chebyshev_polynomial_t(x, n))(torch.rand(5), torch.tensor(3.0))
    with pytest.raises(kf.UnsupportedOpError, match=r"degree 1000(.|\n)*test_polynomials.py"):
        kf.jit(lambda x: torch.special.legendre_polynomial_p(x, 1000))(torch.rand(5))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    fn = lambda x: (torch.special.chebyshev_polynomial_w(x, 9), torch.special.laguerre_polynomial_l(x, 4))  # noqa: E731
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), torch.rand(257)).stages["ptx"]
