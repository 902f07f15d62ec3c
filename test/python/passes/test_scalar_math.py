"""scalar_math's short erf for values stored as bf16/f16: exhaustive accuracy against
float64 math.erf, and bias+GELU through the CPU (linalg) and Vulkan (elementwise
strategy) paths against torch; the PTX of bf16 bias+GELU has no libdevice erf left."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kf
from kf.passes import scalar_math as sm
from kf.runtime import vulkan

needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _all_bf16() -> np.ndarray:
    """Every finite bf16 value, as float32."""
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return x[torch.isfinite(x)].numpy()


def _erf64(x):
    return np.array([math.erf(float(v)) for v in x])


def _gelu64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.array([math.erf(float(v) / math.sqrt(2.0)) for v in x]))


def test_short_erf_is_within_its_documented_error_on_every_bf16():
    x = _all_bf16()
    err = np.abs(sm.erf_narrow_reference(x).astype(np.float64) - _erf64(x))
    assert err.max() <= 2e-5, (err.max(), x[err.argmax()])
    big = np.abs(x) >= sm.NARROW_ERF_CLAMP
    assert (sm.erf_narrow_reference(x[big]) == np.sign(x[big])).all()  # exact limits


def test_short_gelu_is_within_its_documented_error_on_every_bf16():
    x = _all_bf16()
    ref = _gelu64(x)
    got = sm.gelu_narrow_reference(x).astype(np.float64)
    err = np.abs(got - ref)
    assert err.max() <= 4e-5, (err.max(), x[err.argmax()])
    assert (got[x <= -sm.NARROW_GELU_CLAMP] == 0).all()  # exact limits: 0 and x
    assert (got[x >= sm.NARROW_GELU_CLAMP] == x[x >= sm.NARROW_GELU_CLAMP]).all()
    # The rounded results are torch's (f32 erf, then rounded) but for values within the
    # error of a rounding boundary (mostly x < -3, where GELU is tiny and bf16 fine).
    torch_ref = F.gelu(torch.from_numpy(x)).to(torch.bfloat16)
    ours = torch.from_numpy(got.astype(np.float32)).to(torch.bfloat16)
    assert (ours != torch_ref).float().mean() < 5e-3


def test_short_gelu_on_a_dense_f32_grid():
    x = np.linspace(-12, 12, 2_000_001, dtype=np.float32)
    err = np.abs(sm.gelu_narrow_reference(x).astype(np.float64) - _gelu64(x))
    assert err.max() <= 4e-5, (err.max(), x[err.argmax()])


def test_only_narrow_results_take_it():
    assert sm.narrow("bf16") and sm.narrow("f16") and sm.narrow("f8E4M3FN")
    assert not sm.narrow("f32") and not sm.narrow("f64") and not sm.narrow(None)


def bias_gelu(x, b):
    return F.gelu(x + b)


def _inputs(dtype, rows=64, cols=512):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, cols, generator=g) * 3).to(dtype)
    b = torch.randn(cols, generator=g).to(dtype)
    return x, b


def _close(got, x, b, rounded_sum=False):
    # The elementwise strategy rounds once; the CPU's linalg path rounds x + b too.
    want = F.gelu((x + b).float() if rounded_sum else x.float() + b.float()).to(x.dtype)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1.6e-2)
    # Stricter: within one unit in the last place of the output type, or the short
    # GELU's absolute error (4e-5: several units where GELU is tiny, x < -3).
    ulp = want.float().abs() * 2.0 ** -(7 if x.dtype == torch.bfloat16 else 10) + 4e-5
    assert ((got.float() - want.float()).abs() <= ulp).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_gelu_on_cpu_matches_torch(dtype):
    x, b = _inputs(dtype)
    _close(kf.jit(bias_gelu, target="cpu")(x, b), x, b, rounded_sum=True)


def test_every_bf16_through_the_cpu_kernel():
    xs = torch.from_numpy(_all_bf16()).to(torch.bfloat16)
    xs = xs[: xs.numel() // 256 * 256].reshape(-1, 256)
    zero = torch.zeros(256, dtype=torch.bfloat16)
    got = kf.jit(bias_gelu, target="cpu")(xs, zero)
    want = F.gelu(xs.float()).to(torch.bfloat16)
    diff = (got.float() - want.float()).abs()
    assert (diff <= want.float().abs() * 2.0 ** -7 + 4e-5).all()
    assert (got != want).float().mean() < 5e-3


@needs_vulkan
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_gelu_on_vulkan_matches_torch(dtype):
    x, b = _inputs(dtype)
    _close(kf.jit(bias_gelu, target="vulkan")(x, b), x, b)


def _ptx(dtype):
    x = torch.empty(256, 8192, dtype=dtype)
    b = torch.empty(8192, dtype=dtype)
    return kf.inspect(kf.jit(bias_gelu, target="cuda"), x, b).stages["ptx"]


def test_bf16_bias_gelu_ptx_is_short_and_packed():
    ptx = _ptx(torch.bfloat16)
    body = [l.strip() for l in ptx.splitlines() if l.strip().endswith(";") and not l.strip().startswith(".")]
    assert "ex2" not in ptx and "selp" not in ptx and "bra" not in ptx  # no libdevice erff
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == 2 and len(re.findall(r"st\.global\.v4\.b32", ptx)) == 1
    assert len(re.findall(r"cvt\.rn\.bf16x2\.f32", ptx)) == 4  # 8 lanes, packed in pairs
    assert len(body) <= 8 * 23 + 20, len(body)  # 22.2 a element (was 37.2)


def test_f32_bias_gelu_keeps_libdevice_erf():
    assert "ex2.approx" in _ptx(torch.float32)


@pytest.mark.skipif(not __import__("shutil").which("ptxas"), reason="no ptxas")
def test_bf16_bias_gelu_assembles_for_sm90():
    from kf.passes.to_cuda import assemble
    assemble(_ptx(torch.bfloat16), "sm_90a")
