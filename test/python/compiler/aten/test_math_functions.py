"""Elementwise math made of kf's own ops (compiler/aten/math_functions.py): floor, ceil,
square, log2, log10, exp2, log1p, expm1, sinh, cosh, tan, asinh, acosh, atanh and the
logical ops against torch at float32's default tolerance, on fresh random inputs with
the functions' hard cases (near 0 for log1p/expm1/sinh, near overflow, infinities,
NaN), odd sizes, size 0 and non-contiguous views, on cpu and vulkan with torch-mlir
hidden (so that nothing falls back to it); PTX that ptxas assembles for sm_90a."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")
INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def _no_torch_mlir(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_mlir", None)


def _tiny(gen, n):
    """Magnitudes from 1e-10 to 1e-2, both signs."""
    return torch.sign(torch.randn(n, generator=gen)) * 10 ** (torch.rand(n, generator=gen) * -8 - 2)


#: name -> (torch function, inputs from a generator and a size, the fixed hard cases)
CASES = {
    "floor": (torch.floor, lambda g, n: torch.randn(n, generator=g) * 100, [-0.5, 0.5, -0.0, 2.0, -3.0, INF, -INF,
                                                                           NAN, 1e30]),
    "ceil": (torch.ceil, lambda g, n: torch.randn(n, generator=g) * 100, [-0.5, 0.5, -0.0, 2.0, -3.0, INF, -INF,
                                                                         NAN, -1e30]),
    "square": (torch.square, lambda g, n: torch.randn(n, generator=g) * 10, [0.0, INF, NAN, 1e20]),
    "log2": (torch.log2, lambda g, n: torch.rand(n, generator=g) * 100, [1.0, 2.0, 1024.0, 0.0, -1.0, INF, 1e-30]),
    "log10": (torch.log10, lambda g, n: torch.rand(n, generator=g) * 100, [1.0, 10.0, 1000.0, 0.0, -1.0, INF]),
    "exp2": (torch.exp2, lambda g, n: torch.randn(n, generator=g) * 20, [0.0, 10.0, 127.5, -126.0, -INF, INF, 200.0]),
    "log1p": (torch.log1p, lambda g, n: torch.cat([_tiny(g, n), torch.rand(n, generator=g) * 20 - 0.99]),
              [0.0, -1.0, -2.0, INF, 1e30, -0.999999, 1e-38]),
    "expm1": (torch.expm1, lambda g, n: torch.cat([_tiny(g, n), torch.randn(n, generator=g) * 10]),
              [0.0, 88.0, 89.0, -100.0, INF, -INF, 1e-38]),
    "sinh": (torch.sinh, lambda g, n: torch.cat([_tiny(g, n), torch.randn(n, generator=g) * 5]),
             [0.0, 9.99, 10.0, 80.0, -89.0, 90.0, INF, -INF]),
    "cosh": (torch.cosh, lambda g, n: torch.randn(n, generator=g) * 5, [0.0, 10.0, -80.0, 89.0, 90.0, INF, -INF]),
    "tan": (torch.tan, lambda g, n: torch.randn(n, generator=g) * 3, [0.0, 1.5, -1.5]),
    "asinh": (torch.asinh, lambda g, n: torch.cat([_tiny(g, n), torch.randn(n, generator=g) * 100]),
              [0.0, 4095.0, 4097.0, -1e20, 1e38, INF, -INF]),
    "acosh": (torch.acosh, lambda g, n: 1 + torch.rand(n, generator=g) * 10 ** torch.rand(n, generator=g) * 3,
              [1.0, 1.0000001, 0.5, 4096.0, 1e20, INF]),
    "atan": (torch.atan, lambda g, n: torch.cat([_tiny(g, n),
                                                 torch.randn(n, generator=g) * 10 ** torch.randn(n, generator=g)]),
             [0.0, 0.2679, 0.268, 1.0, -1.0, 1e30, INF, -INF]),
    "asin": (torch.asin, lambda g, n: torch.cat([_tiny(g, n), torch.rand(n, generator=g) * 2 - 1]),
             [0.0, 1.0, -1.0, 0.9999999, 1.5]),
    "acos": (torch.acos, lambda g, n: torch.cat([_tiny(g, n), torch.rand(n, generator=g) * 2 - 1]),
             [0.0, 1.0, -1.0, 0.9999999, -0.9999999, 1.5]),
    "atanh": (torch.atanh, lambda g, n: torch.cat([_tiny(g, n), torch.rand(n, generator=g) * 2 - 1]),
              [0.0, 0.9999999, -0.9999999, 1.0, -1.0, 2.0]),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_function(name, target):
    fn, draw, hard = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    f = kf.jit(lambda x: fn(x), target=target)
    # lavapipe's own exp is off by up to 1.7e-6 relative near its overflow (e^88)
    rtol = {"rtol": 2e-6, "atol": 1e-5} if target == "vulkan" and name in ("expm1", "sinh", "cosh") else {}
    for n in (1, 7, 257):
        x = torch.cat([draw(gen, n), torch.tensor(hard)])
        torch.testing.assert_close(f(x), fn(x), equal_nan=True, **rtol)
    x = draw(gen, 24).reshape(4, -1)
    torch.testing.assert_close(f(x.t()), fn(x.t()), equal_nan=True)  # not contiguous
    torch.testing.assert_close(f(x[:, ::2]), fn(x[:, ::2]), equal_nan=True)
    empty = torch.empty(0, 3)
    assert f(empty).shape == (0, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_atan2(target):
    gen = torch.Generator().manual_seed(5)
    y, x = torch.randn(7, 5, generator=gen), torch.randn(5, generator=gen)
    f = kf.jit(lambda y, x: torch.atan2(y, x), target=target)
    torch.testing.assert_close(f(y, x), torch.atan2(y, x))
    torch.testing.assert_close(f(y.t(), x[:, None]), torch.atan2(y.t(), x[:, None]))
    corners = torch.tensor([0.0, -0.0, 1.0, -1.0, INF, -INF, NAN])
    ys, xs = corners[:, None].expand(7, 7).reshape(-1), corners[None, :].expand(7, 7).reshape(-1)
    torch.testing.assert_close(f(ys, xs), torch.atan2(ys, xs), equal_nan=True)
    assert f(torch.empty(0, 5), x).shape == (0, 5)


@pytest.mark.parametrize("target", TARGETS)
def test_integer_inputs(target):
    x = torch.randint(-50, 50, (2, 7))
    for fn in (torch.floor, torch.ceil, torch.square):
        got, want = kf.jit(lambda x: fn(x), target=target)(x), fn(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(kf.jit(lambda x: torch.log1p(x), target=target)(x.abs()), torch.log1p(x.abs()))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [torch.logical_and, torch.logical_or, torch.logical_xor], ids=lambda f: f.__name__)
def test_logical(fn, target):
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(5, 7, generator=gen) > 0).float() * torch.randn(5, 7, generator=gen)
    b = torch.randint(-1, 2, (7,), generator=gen)
    f = kf.jit(lambda a, b: fn(a, b), target=target)
    for x, y in ((a, b), (a.t().contiguous().t(), b), (a > 0, b > 0), (a[:, ::2], b[::2]), (a[:0], b)):
        got, want = f(x, y), fn(x, y)
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_functions_assemble_for_cuda():
    def fn(x, y):
        return ([CASES[n][0](x) for n in CASES], torch.logical_xor(x, y), torch.atan2(x, y))

    args = (torch.rand(33) + 1, torch.randn(33))
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a"), *args).ptx


@pytest.mark.parametrize("target", TARGETS)
def test_bitwise_of_booleans_and_log_sigmoid(target):
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(5, 7, generator=gen) > 0, torch.randn(7, generator=gen) > 0

    def bits(a, b):
        return a & b, a | b, a ^ b, a & True, a ^ True

    f = kf.jit(bits, target=target)
    for x, y in ((a, b), (a.t().contiguous().t(), b), (a[:, ::2], b[::2]), (a[:0], b)):
        for g, w in zip(f(x, y), bits(x, y), strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)
    x = torch.cat([torch.randn(257, generator=gen) * 30, torch.tensor([0.0, -100.0, 100.0, INF, -INF, 1e-8])])
    ls = kf.jit(lambda x: (torch.nn.functional.logsigmoid(x), torch.nn.functional.binary_cross_entropy_with_logits(
        x, torch.sigmoid(-x))), target=target)
    for g, w in zip(ls(x), (torch.nn.functional.logsigmoid(x),
                            torch.nn.functional.binary_cross_entropy_with_logits(x, torch.sigmoid(-x))), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)  # the loss of an infinite logit is NaN in torch too
    assert ls(torch.empty(0))[0].shape == (0,)
