"""Lowerings of kf ops to linalg (passes/linalg/ops.py) and their GPU counterparts
(passes/strategies/generic.py), run end to end through kf.jit against torch on every
target present: edge cases whose answer is not a constant."""

from __future__ import annotations

import math

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu",
           pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]

SPECIAL = [-8.478, 0.0, 3e38, math.inf, -math.inf, math.nan]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)


def _softmaxes(x):
    return torch.softmax(x, 0), torch.log_softmax(x, 0), torch.softmax(-x, -1)


def _masked(x, m):
    return (torch.masked.softmax(x, 0, mask=m), torch.masked.log_softmax(x, 0, mask=m),
            torch.masked.softmin(x, 0, mask=m))


@pytest.mark.parametrize("target", TARGETS)
def test_softmax_of_one_element_is_nan_where_torchs_is(target):
    """Softmax over a 0-d tensor is exp(x - x): 1 for a finite x, NaN for +-inf and NaN
    (log_softmax: 0 or NaN), as torch computes it -- not the constant 1 (0)."""
    f = kf.jit(_softmaxes, target=target)
    for v in SPECIAL:
        x = torch.tensor(v, device=_device(target))
        for got, want in zip(f(x), _softmaxes(x)):
            _same(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_masked_softmax_of_a_masked_scalar_is_nan(target):
    """torch.masked.softmax / log_softmax / softmin of a 0-d input under a 0-d mask (the
    OpInfo sample masked.softmax#23): a False mask gives NaN, a True one 1 (log: 0)."""
    f = kf.jit(_masked, target=target)
    dev = _device(target)
    for v in (-8.478373527526855, 2.5):
        for m in (True, False):
            x, mask = torch.tensor(v, device=dev), torch.tensor(m, device=dev)
            for got, want in zip(f(x, mask), _masked(x, mask)):
                _same(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("target", TARGETS)
def test_softmax_of_one_element_other_dtypes(target, dtype):
    f = kf.jit(_softmaxes, target=target)
    x = torch.tensor([1.5, math.inf, -math.inf, math.nan], dtype=dtype, device=_device(target))
    for i in range(len(x)):
        for got, want in zip(f(x[i].clone()), _softmaxes(x[i].clone())):
            _same(got, want)


def test_cuda_softmax_of_one_element_computes_x_minus_x():
    """Without a GPU: the CUDA kernel of a 0-d softmax subtracts the element from itself
    (what makes +-inf and NaN give NaN) rather than storing a constant."""

    ins = kf.inspect(kf.jit(_masked, target="cuda", arch="sm_90a"), torch.tensor(1.0), torch.tensor(False))
    ptx = str(ins.stages["ptx"])
    assert ptx.count("sub.rn.f32") >= 3, ptx
