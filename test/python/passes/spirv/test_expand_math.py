"""sin and cos expanded by kf-to-spirv (``passes/spirv/expand_math.py``) run on Vulkan
(lavapipe here) against float64 torch: random f32 bit patterns of every exponent, the special
values, f16 and odd sizes. GLSL's Sin/Cos reduce large arguments inexactly; kf's expansion
reduces exactly (Payne-Hanek) for every finite argument. The other expansions on the
vectors a row-wise kernel loads (one expansion per lane)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kf
from kf.runtime import vulkan

pytestmark = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")

FUNCS = {"sin": torch.sin, "cos": torch.cos}

#: the error bound in ulps of the correctly rounded f32 (lavapipe measures 0.88 over the bit
#: patterns below: Cephes' polynomials on the reduced argument carried as two floats)
MAX_ULPS = 1.5


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _sin(x):
    return torch.sin(x)


def _cos(x):
    return torch.cos(x)


KERNELS = {"sin": _sin, "cos": _cos}


def ulp_error(x: torch.Tensor, got: torch.Tensor, name: str) -> torch.Tensor:
    """|got - f(x)| in ulps of f32(f(x)), f in float64."""
    want = FUNCS[name](x.double())
    w = want.float().abs()
    ulp = (w.nextafter(torch.tensor(math.inf)) - w).double()
    return (got.double() - want).abs() / ulp


def random_bit_patterns(n: int, seed: int) -> torch.Tensor:
    """n finite f32 values with uniformly random bits: every exponent equally often."""
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2 ** 31, 2 ** 31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    return x[torch.isfinite(x)]


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_random_bit_patterns_of_every_exponent(name):
    x = random_bit_patterns(1_000_000, seed=len(name) + ord(name[0]))
    x = torch.cat([x, torch.tensor([1e8, -3e9, 1e20, 1e30, 3.0e38, -3.4028235e38, 16367173 * 2.0 ** 72,
                                    math.pi / 4, 0.7853982, -0.7853982, 2.0 ** -7, 1e-40, 1e-45])])
    got = kf.jit(KERNELS[name], target="vulkan")(x)
    err = ulp_error(x, got, name)
    i = int(err.argmax())
    assert float(err.max()) <= MAX_ULPS, f"{name}({float(x[i])!r}) = {float(got[i])!r}: {float(err[i]):.2f} ulp"


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_special_values(name):
    x = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38])
    got = kf.jit(KERNELS[name], target="vulkan")(x)
    assert torch.isnan(got[:3]).all(), got
    want = FUNCS[name](x[3:])
    assert torch.equal(got[3:], want), (got, want)
    assert torch.equal(torch.signbit(got[3:]), torch.signbit(want)), (got, want)  # sin(-0) = -0


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("n", [0, 1, 7, 257])
def test_odd_sizes_and_strided_views(name, n):
    gen = torch.Generator().manual_seed(n)
    x = ((torch.rand(2 * n, generator=gen) * 2 - 1) * 1e6)[::2]
    got = kf.jit(KERNELS[name], target="vulkan")(x)
    assert got.shape == x.shape
    if n:
        assert float(ulp_error(x, got, name).max()) <= MAX_ULPS


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_f16_is_computed_in_f32(name):
    gen = torch.Generator().manual_seed(3)
    x = ((torch.rand(1001, generator=gen) * 2 - 1) * 6e4).half()
    got = kf.jit(KERNELS[name], target="vulkan")(x)
    assert got.dtype == torch.float16
    want = FUNCS[name](x.double()).half()  # the correctly rounded f16, within one f16 ulp
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def _asin(x):
    return torch.asin(x)


def _acos(x):
    return torch.acos(x)


@pytest.mark.parametrize("name,fn", [("asin", _asin), ("acos", _acos)])
def test_asin_acos_within_three_ulp(name, fn):
    """asin and acos (torch-mlir's lowering reaches kf-to-spirv as math.asin/acos; GLSL's
    Asin and Acos erred by up to 4e-4 on lavapipe) over [-1, 1] densely, the branch
    points +-0.5, signed zeros, and NaN outside [-1, 1], against float64 torch."""
    x = torch.cat([torch.linspace(-1, 1, 200001), torch.rand(4001) * 2 - 1,
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.4999999, -0.50000006, 1e-30, -1e-38,
                                 1.0000001, -1.5, 3e38, float("inf"), -float("inf"), float("nan")])])
    got = kf.jit(fn, target="vulkan")(x)
    want = fn(x.double())
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    ulp = torch.finfo(torch.float32).eps * want[~nan].abs().clamp(min=torch.finfo(torch.float32).tiny)
    err = (got[~nan].double() - want[~nan]).abs()
    assert bool((err <= 3 * ulp + 1e-45).all()), (err / ulp).max()
    if name == "asin":
        assert torch.equal(got[x == 0].signbit(), x[x == 0].signbit())


@pytest.mark.parametrize("name", ["sin", "cos", "asin", "acos"])
def test_no_product_may_be_fused(name):
    """The expansions need each product rounded on its own (the reduction's exact two-float
    products, Cephes' corrections): every float multiply, add and subtract of the kernel is
    decorated NoContraction, so a driver that fuses a * b + c into an fma (NVIDIA's) may not.
    lavapipe never fuses, so this is checked in the SPIR-V."""
    import re

    op = getattr(torch, name)
    spirv = kf.inspect(kf.jit(lambda x: op(x), target="vulkan"), torch.ones(257)).stages["spirv"]
    arithmetic = set(re.findall(r"(%\w+) = Op(?:FMul|FAdd|FSub|VectorTimesScalar) ", spirv))
    decorated = set(re.findall(r"OpDecorate (%\w+) NoContraction", spirv))
    assert len(arithmetic) > 20 and arithmetic <= decorated, sorted(arithmetic - decorated)[:5]


def _fmod(x, y):
    return torch.fmod(x, y)


@pytest.mark.parametrize("seed", [1, 2])
def test_fmod_is_exact_for_random_bit_patterns(seed):
    """arith.remf expanded exactly (integer significands, 2^(kx - ky) mod my by squaring):
    bit for bit C's fmod (numpy's) over f32 pairs of random bits -- every exponent
    difference, subnormals -- and pairs of near magnitude, where a rounded quotient goes
    wrong. (torch's vectorized CPU kernel for float32 gives NaN once x / y is past float
    range, about one pair in eight here; its float64 kernel and its scalar path are C's.)"""
    x = random_bit_patterns(300_000, seed)
    y = random_bit_patterns(300_000, seed + 100)[: len(x)]
    x = x[: len(y)]
    near = x * (1 + torch.rand(len(x), generator=torch.Generator().manual_seed(seed)) / 8)
    x, y = torch.cat([x, near]), torch.cat([y, x])
    got = kf.jit(_fmod, target="vulkan")(x, y)
    want = torch.from_numpy(np.fmod(x.numpy(), y.numpy()))
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    bad = (got[~nan].view(torch.int32) != want[~nan].view(torch.int32)).nonzero()
    if len(bad):
        i = int(bad[0])
        a, b = x[~nan][i], y[~nan][i]
        raise AssertionError(f"{len(bad)} differ; fmod({float(a)!r}, {float(b)!r}) = {float(got[~nan][i])!r}, "
                             f"torch {float(want[~nan][i])!r}")


def test_fmod_of_f16_is_computed_in_f32():
    x = random_bit_patterns(100_000, 5).half()
    y = random_bit_patterns(100_000, 6).half()[: len(x)]
    x = x[: len(y)]
    keep = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[keep], y[keep]
    got = kf.jit(_fmod, target="vulkan")(x, y)
    want = torch.fmod(x, y)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan], want[~nan])


def _row_power_sums(x):
    return (x.abs() ** 3.0).sum(-1), (x.abs() ** 0.5).sum(-1), torch.atan2(x, x + 1).sum(-1)


@pytest.mark.parametrize("n", [1, 7, 257])
def test_expanded_ops_on_the_vectors_a_row_kernel_loads(n):
    """A row-wise kernel applies its prologue to the vectors it loads: powf and atan2 on
    vectors are unrolled to one expansion per lane (kf-to-spirv refused them)."""
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(n))
    got, want = kf.jit(_row_power_sums, target="vulkan")(x), _row_power_sums(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
