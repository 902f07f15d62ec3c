"""exp, log, log2, log10 and pow of float64 values on Vulkan (passes/spirv/float64_math.py):
GLSL.std.450 has these for 16- and 32-bit floats only, and kf expands them into 64-bit
arithmetic. Checked against torch eager: within 2 ulps (pow: the error of exp(y log|x|),
about |y log|x|| ulps), and eager's inf, NaN, zeros and subnormals, at sizes 1, prime,
257 and 0 and through non-contiguous views; and the row-wise strategy's f64 statistics
(softmax(x, dtype=torch.float64) of float32 rows)."""

from __future__ import annotations

import math

import pytest
import torch

import kf
from kf.runtime import vulkan

pytestmark = pytest.mark.skipif(not vulkan.is_available() or not vulkan.device().features.get("shaderFloat64"),
                                reason="no Vulkan device with shaderFloat64")

SPECIAL = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 709.7, 709.8, -745.0, -746.0, -708.5, -720.0,
           1e-310, 5e-324, 2.0 ** -1022, 0.5, 2.0, 1.5, 1e300, 1e-300]

UNARY = {
    "exp": (lambda x: torch.exp(x), 2),
    "log": (lambda x: torch.log(x), 2),
    "log2": (lambda x: torch.log2(x), 2),
    "log10": (lambda x: torch.log10(x), 3),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _inputs(gen):
    values = torch.cat([torch.randn(300, generator=gen, dtype=torch.float64) * 300,
                        torch.rand(40, generator=gen, dtype=torch.float64) * 3, torch.tensor(SPECIAL, dtype=torch.float64)])
    return [values[:1], values[:13], values[:257], values[:0], values, values.reshape(-1, 1).expand(-1, 2).t()]


def _check(got, want, ulps):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    exact = ~torch.isfinite(want) | (want == 0)
    assert torch.equal(got[exact & ~torch.isnan(want)], want[exact & ~torch.isnan(want)])
    near = ~exact & (want.abs() >= 2.0 ** -1022)
    rel = ((got - want).abs() / want.abs())[near]
    assert rel.numel() == 0 or rel.max().item() <= ulps * 2.0 ** -52, rel.max().item() / 2.0 ** -52
    sub = ~exact & ~near  # subnormal results: within a unit of the last place of the smallest normal
    assert ((got - want).abs()[sub] <= 2.0 ** -1074 * 2).all()


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float64_math_on_vulkan(name):
    fn, ulps = UNARY[name]
    gen = torch.Generator().manual_seed(len(name))
    for x in _inputs(gen):
        for arg in (x, x.abs()):
            _check(kf.jit(fn, target="vulkan")(arg), fn(arg), ulps)


def test_pow_float64_on_vulkan():
    """float_power's pow: C's values for negative and zero bases, infinities and NaN."""
    gen = torch.Generator().manual_seed(7)
    base = torch.cat([torch.randn(300, generator=gen, dtype=torch.float64) * 3,
                      torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, -2.0, 2.0, 0.5, -0.5, 3.0,
                                    -3.0, 1e-300, 10.0, 100.0, 7.0, -7.0, 0.0, 1.0], dtype=torch.float64)])
    exp = torch.randn(320, generator=gen, dtype=torch.float64) * 4
    exp[-20:] = torch.tensor([2.0, 3.0, math.inf, math.inf, 0.5, 3.0, 0.0, 3.0, -2.0, math.nan, 2.5, -1.0, 2.0, -0.5,
                              300.0, 150.0, -0.5, 0.5, -1.0, math.nan], dtype=torch.float64)
    fn = lambda a, b: torch.float_power(a, b)  # noqa: E731
    for n in (1, 13, 257, 320, 0):
        got, want = kf.jit(fn, target="vulkan")(base[:n], exp[:n]), fn(base[:n], exp[:n])
        # the magnitude is exp(y log|x|): |y log|x|| <= 710 ulps of relative error
        _check(got, want, 1024)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(1,), (5,), (50,), (257,), (7, 33)])
def test_float64_softmax_of_float32_rows(op, shape):
    """softmax(x, dtype=torch.float64): the row statistics of float32 inputs cast to f64
    are f64 (the row-wise strategy's scratch is sized for them)."""
    fn = (lambda x: torch.softmax(x, -1, dtype=torch.float64)) if op == "softmax" else \
        (lambda x: torch.log_softmax(x, -1, dtype=torch.float64))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 10
    got, want = kf.jit(fn, target="vulkan")(x), fn(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
