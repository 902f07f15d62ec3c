"""The gamma family (compiler/aten/special.py): lgamma, digamma, polygamma of order 0 and
mvlgamma against torch on cpu and vulkan, with poles, NaN, infinities and signed zeros
among fresh random values, at odd and empty sizes, through non-contiguous views, from
every dtype torch takes, against float64 for accuracy, and as PTX for cuda."""

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

SPECIALS = [float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1.0, 2.0, -1.0, -2.0, -2.5, 1e-30, -1e-30,
            1e30, -1e30, 0.25, -0.25, 0.75, 1.25, 3.0, 10.0, 1e37, 3.4e38]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _values(n: int, gen) -> torch.Tensor:
    x = torch.randn(n, generator=gen) * 6
    x[n // 2:] = torch.rand(n - n // 2, generator=gen) * 4  # around lgamma's and digamma's zeros
    k = min(n, len(SPECIALS))
    x[:k] = torch.tensor(SPECIALS[:k])
    return x[torch.randperm(n, generator=gen)]


OPS = {
    "lgamma": lambda x: torch.lgamma(x),
    "digamma": lambda x: torch.digamma(x),
    "polygamma_0": lambda x: torch.polygamma(0, x),
    "special_gammaln": lambda x: torch.special.gammaln(x),
    "special_psi": lambda x: torch.special.psi(x),
}


def _check(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    # the special values exactly (inf of the right sign, NaN), the rest as torch's tolerance
    same = (got == want) | (got.isnan() & want.isnan())
    assert bool(same[~want.isfinite()].all()), (got[~want.isfinite()], want[~want.isfinite()])
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
@pytest.mark.parametrize("name", list(OPS))
def test_follows_torch(name, n, target):
    gen = torch.Generator().manual_seed(n + 11)
    x = _values(n, gen)
    _check(kf.jit(OPS[name], target=target)(x), OPS[name](x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["lgamma", "digamma"])
def test_within_a_few_ulp_of_float64(name, target):
    """lgamma within 8 ulp of the float64 value for x > 0 (near its zeros at 1 and 2 too,
    where a Stirling or Lanczos form loses every digit); digamma within 8 ulp on [1, 2]
    around its zero at 1.4616 (where torch's float32 loses digits), elsewhere within 24 ulp
    plus twice torch's own float32 error: kf follows torch's recurrence and series, whose
    sum cancels, on targets whose division and log may be off by 2.5 and 3 ulp (Vulkan's
    allowance)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.rand(20000, generator=gen) * 3, torch.rand(20000, generator=gen) * 100,
                   torch.tensor([1.0, 2.0, 1 + 2 ** -20, 2 - 2 ** -20, 2 ** -40, 1e30])])
    fn = OPS[name]
    got, want = kf.jit(fn, target=target)(x).double(), fn(x.double())
    f = want.abs().float()
    ulp = (torch.nextafter(f, torch.tensor(float("inf"))) - f).double()
    allowed = 8 * ulp
    if name == "digamma":
        allowed = torch.where((x >= 1) & (x <= 2), allowed, 3 * allowed + 2 * (fn(x).double() - want).abs())
    assert bool(((got - want).abs() <= allowed).all()), ((got - want).abs() / ulp).max()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [1, 3, 5])
def test_mvlgamma(p, target):
    gen = torch.Generator().manual_seed(p)
    x = (p - 1) / 2 + 0.01 + torch.rand(7, 33, generator=gen) * 20
    fn = {1: lambda x: torch.mvlgamma(x, 1), 3: lambda x: torch.mvlgamma(x, p=3),
          5: lambda x: torch.special.multigammaln(x, 5)}[p]
    torch.testing.assert_close(kf.jit(fn, target=target)(x), fn(x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("name", ["lgamma", "digamma"])
def test_every_dtype(name, dtype, target):
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(37, generator=gen) * 12 - 4)
    x = x.to(dtype) if dtype.is_floating_point else x.round().to(dtype)
    fn = OPS[name]
    _check(kf.jit(fn, target=target)(x), fn(x))


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous(target):
    gen = torch.Generator().manual_seed(5)
    x = _values(13 * 9, gen).reshape(9, 13).t()
    y = (torch.rand(13, 18, generator=gen) * 9)[:, ::2]

    def fn(x, y):
        return torch.lgamma(x) + torch.digamma(y), torch.digamma(x)

    for got, want in zip(kf.jit(fn, target=target)(x, y), fn(x, y)):
        _check(got, want)


def test_refusals_name_the_op():
    """float64 (kf's polynomials are float32's) and polygamma of order 1 or more are kf
    errors naming the op, not float32-accurate or wrong results."""
    with pytest.raises(kf.UnsupportedOpError, match=r"lgamma of float64(.|\n)*test_special.py"):
        kf.jit(OPS["lgamma"])(torch.rand(5, dtype=torch.float64))
    with pytest.raises(kf.UnsupportedOpError, match=r"polygamma of order 2(.|\n)*test_special.py"):
        kf.jit(lambda x: torch.polygamma(2, x))(torch.rand(5))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_assemble_for_cuda():
    def fn(x):
        return torch.lgamma(x), torch.digamma(x), torch.mvlgamma(x.abs() + 2, 2)

    x = torch.randn(257)
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), x).stages["ptx"]
