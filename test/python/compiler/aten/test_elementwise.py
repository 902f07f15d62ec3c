"""Special values and roundings (compiler/aten/elementwise.py; kf.erfc, kf.trunc,
kf.round, kf.signbit in passes/scalar_math.py): isnan, isinf, isfinite, sign, trunc,
frac, round (ties to even, with decimals), erfc, sin, cos, hypot, copysign, signbit, and
16-bit products with Python numbers, against torch
on cpu and vulkan, with NaN, infinities and signed zeros among fresh random values, at
odd and empty sizes and through non-contiguous views, and as PTX for cuda."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")

SPECIALS = [float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 2.5, -3.5, 0.5, -0.5, 1.5, 1e30, -1e-30]


def _values(n: int, dtype, gen) -> torch.Tensor:
    x = torch.randn(n, generator=gen) * 4
    k = min(n, len(SPECIALS))
    x[:k] = torch.tensor(SPECIALS[:k])
    return x[torch.randperm(n, generator=gen)].to(dtype)


def _py(op):
    """op as a Python function of one tensor (kf.jit reads a function's code)."""
    return lambda x: op(x)


def _py2(op):
    return lambda x, y: op(x, y)


UNARY = {
    **{name: _py(getattr(torch, name)) for name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
                                                     "sign", "trunc", "fix", "frac", "round", "erfc",
                                                     "angle")},
    "round_2": lambda x: torch.round(x, decimals=2), "round_-1": lambda x: torch.round(x * 10, decimals=-1),
}
BINARY = {"hypot": _py2(torch.hypot), "copysign": _py2(torch.copysign), "fmax": _py2(torch.fmax),
          "fmin": _py2(torch.fmin), "clamp_min": _py2(torch.clamp_min), "clamp_max": _py2(torch.clamp_max)}


def _check(got, want, exact: bool):
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-6, atol=1e-6, equal_nan=True)


def _same_sign_bits(got, want):
    """-0.0 and 0.0 apart (assert_close takes them as equal)."""
    finite = ~want.isnan()
    assert torch.equal(got[finite].signbit(), want[finite].signbit())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_specials_follow_torch(name, n, target):
    gen = torch.Generator().manual_seed(n + len(name))
    fn = UNARY[name]
    x = _values(n, torch.float32, gen)
    got, want = kf.jit(fn, target=target)(x), fn(x)
    _check(got, want, exact=name not in ("erfc", "round_2", "round_-1"))
    if name in ("trunc", "round", "fix") and n:
        _same_sign_bits(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_specials_follow_torch(name, n, target):
    gen = torch.Generator().manual_seed(n + 100)
    fn = BINARY[name]
    x, y = _values(n, torch.float32, gen), _values(n, torch.float32, gen)
    got, want = kf.jit(fn, target=target)(x, y), fn(x, y)
    _check(got, want, exact=name != "hypot")
    if name == "copysign" and n:
        _same_sign_bits(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_hypot_does_not_overflow_or_underflow(target):
    x = torch.tensor([3e38, 3e-39, 3.0, 0.0, float("inf"), float("nan"), float("nan")])
    y = torch.tensor([3e38, 4e-39, 4.0, 0.0, float("nan"), float("inf"), 1.0])
    _check(kf.jit(BINARY["hypot"], target=target)(x, y), torch.hypot(x, y), exact=False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite", "sign", "trunc", "round", "frac", "signbit"])
def test_every_dtype(name, dtype, target):
    fn = UNARY[name]
    gen = torch.Generator().manual_seed(3)
    if dtype.is_floating_point:
        x = _values(37, dtype, gen)
    elif dtype == torch.bool:
        x = torch.rand(37, generator=gen) > 0.5
    else:
        x = torch.randint(-50, 50, (37,), generator=gen, dtype=dtype)
    try:
        want = fn(x)
    except (RuntimeError, NotImplementedError):
        pytest.skip(f"torch has no {name} for {dtype}")
    _check(kf.jit(fn, target=target)(x), want, exact=True)


@pytest.mark.parametrize("target", TARGETS)
def test_round_ties_to_even(target):
    x = torch.arange(-20, 21, dtype=torch.float32) / 2 + torch.tensor(0.0)  # every half
    _check(kf.jit(UNARY["round"], target=target)(x), torch.round(x), exact=True)
    big = torch.tensor([2.0 ** 23 + 1, 2.0 ** 24, -(2.0 ** 23) - 1, 8388607.5, -8388607.5])
    _check(kf.jit(UNARY["round"], target=target)(big), torch.round(big), exact=True)


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous(target):
    gen = torch.Generator().manual_seed(5)
    x = _values(13 * 9, torch.float32, gen).reshape(9, 13).t()
    y = _values(13 * 18, torch.float32, gen).reshape(13, 18)[:, ::2]

    def fn(x, y):
        return torch.hypot(x, y) + torch.frac(x) * torch.copysign(torch.ones_like(x), y), torch.isfinite(x)

    for got, want in zip(kf.jit(fn, target=target)(x, y), fn(x, y)):
        _check(got, want, exact=False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_products_with_python_numbers(dtype, target):
    """A 16-bit tensor times or over a Python number the 16-bit type cannot hold: the
    number in float32, as torch's kernels take it. In half, 1e5 and 70000 are inf and
    1e-6 is subnormal: ``a * 1e5`` was inf where torch gives 11584, ``a / 1e5`` 0 or
    NaN where torch gives a subnormal."""
    x = torch.randn(257, generator=torch.Generator().manual_seed(6)).mul(4).to(dtype)
    for fn in (lambda a: a * 1e5, lambda a: a / 1e5, lambda a: a * 70000, lambda a: 1e-6 * a, lambda a: a / 1e-6,
               lambda a: a * 1e39):
        got, want = kf.jit(fn, target=target)(x), fn(x)
        assert got.dtype == want.dtype and torch.equal(torch.isfinite(got), torch.isfinite(want))
        ulp = 2.0 ** (-10 if dtype == torch.float16 else -7)
        torch.testing.assert_close(got, want, rtol=2 * ulp, atol=1e-7, equal_nan=True)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_specials_assemble_for_cuda():
    """Without a GPU: the specials lower to PTX that ptxas assembles (kf.trunc as floor
    or ceil: NVVM has no pattern for math.trunc)."""
    def fn(x, y):
        return (torch.isnan(x), torch.isfinite(x), torch.sign(x), torch.trunc(x), torch.frac(x),
                torch.round(x, decimals=1), torch.erfc(x), torch.hypot(x, y), torch.copysign(x, y),
                torch.fmax(x, y), torch.fmin(x, y), torch.angle(x))

    x, y = torch.randn(257), torch.randn(257)
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), x, y).stages["ptx"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_follow_torch(name, n, target):
    """kf.sin and kf.cos (rotary embeddings compute them in the model) on NaN, infinities,
    signed zeros and arguments up to 1e6 in magnitude, and their gradients."""
    gen = torch.Generator().manual_seed(n + 3)
    fn = _py(getattr(torch, name))
    x = _values(n, torch.float32, gen)
    x = torch.where(x.abs() > 1e6, x.sign() * 1e6 * torch.rand(n, generator=gen), x)  # keeps NaN
    x[2::3] = (torch.rand(x[2::3].shape, generator=gen) * 2 - 1) * 1e6  # far from 0: an exact range reduction
    _check(kf.jit(fn, target=target)(x), fn(x), exact=False)
    y = torch.randn(n, 5, generator=gen).requires_grad_()
    got = torch.autograd.grad(kf.jit(fn, target=target)(y).sum(), y)[0]
    torch.testing.assert_close(got, torch.autograd.grad(fn(y).sum(), y)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_sin_of_huge_arguments_on_vulkan():
    x = torch.tensor([1e8, -3e9, 1e20, 1e30, 3.0e38])
    got = kf.jit(_py(torch.sin), target="vulkan")(x)
    torch.testing.assert_close(got.double(), torch.sin(x.double()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [1, 7, 257, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64], ids=str)
def test_div_rounding_modes(dtype, n, target):
    """trunc of float32 and both modes of integers (every sign of both operands), through a
    non-contiguous divisor; torch-mlir's lowering is torch's rule for these."""
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=gen) * 50
    b = (torch.randn(2 * n, generator=gen) * 5)[::2]
    if dtype.is_floating_point:
        k = min(n, len(SPECIALS))
        a[:k] = torch.tensor(SPECIALS[:k])
        b[:k] = torch.tensor(SPECIALS[::-1][:k])
        modes = ["trunc"]
    else:
        a, b = a.to(dtype), b.to(dtype)
        b = torch.where(b == 0, torch.full_like(b, -3), b)  # integer division by zero is undefined
        modes = ["trunc", "floor"]
    for mode in modes:
        fn = lambda a, b: torch.div(a, b, rounding_mode=mode)  # noqa: E731
        _check(kf.jit(fn, target=target)(a, b), fn(a, b), exact=True)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_div_rounding_modes_assemble_for_cuda():
    def fn(a, b):
        return torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor")

    def integers(a, b):
        return torch.div(a.long(), b.long().clamp(min=1), rounding_mode="floor"), a.long() % 3

    x = torch.randn(257)
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), x, x).stages["ptx"]
    assert ".entry" in kf.inspect(kf.jit(integers, target="cuda"), x, x).stages["ptx"]


FLOAT_MODULO = {
    "floordiv": lambda a, b: a // b, "fmod": lambda a, b: torch.fmod(a, b), "mod": lambda a, b: a % b,
    "remainder": lambda a, b: torch.remainder(a, b), "fmod_scalar": lambda a, b: torch.fmod(a, 0.3),
    "floor_divide_scalar": lambda a, b: torch.floor_divide(a, 0.1), "rmod": lambda a, b: 5.5 % b,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
}
#: operands where a rounded quotient goes wrong (1.0 // 0.1 is 9, fmod(1.0, 0.1) is 0.1 less
#: an ulp), of huge and subnormal ratio, signed zeros, infinities and NaN
MODULO_CASES = [(1.0, 0.1), (-1.0, 0.1), (1.0, -0.1), (0.3, 0.1), (5.5, 2.0), (-5.5, 2.0), (5.5, -2.0),
                (1e30, 3.0), (3.0e38, 1e-38), (2.0 ** -140, 2.0 ** -148), (1e-38, 3e-39), (7.0, 0.0), (0.0, 1.0),
                (-0.0, 1.0), (0.0, -1.0), (math.inf, 1.0), (7.0, math.inf), (-7.0, math.inf), (math.nan, 1.0),
                (1.0, math.nan), (100.0, -7.0), (16777215.0, 0.5), (-0.0, -3.0)]


def _same(got, want):
    """Equal values, NaN where torch has NaN (its sign aside), and zeros of torch's sign."""
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), (got, want)
    assert torch.equal(got[~nan], want[~nan]), (got, want)
    assert torch.equal(got[~nan].signbit(), want[~nan].signbit()), (got, want)


GPU_TARGETS = TARGETS + [pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                       reason="no CUDA device"))]


def _on(target, *tensors):
    return [t.cuda() for t in tensors] if target == "cuda" else list(tensors)


def _flushes_subnormals(target) -> bool:
    """Whether the target's device reads and writes float32 subnormals as zero: a Vulkan
    device without shaderDenormPreserveFloat32 (NVIDIA's driver; kf declares DenormPreserve
    where the device has it, and lavapipe does)."""
    return target == "vulkan" and not vulkan.device().features.get("shaderDenormPreserveFloat32", False)


def _normal_only(target, want, *operands):
    """The positions where no operand and no expected result is a subnormal, on a device
    that flushes them (every position elsewhere)."""
    keep = torch.ones(want.shape, dtype=torch.bool)
    if _flushes_subnormals(target):
        for t in (want, *operands):
            keep &= ~((t != 0) & (t.abs() < torch.finfo(torch.float32).tiny))
    return keep


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("name", sorted(FLOAT_MODULO))
def test_float_modulo_is_torch_exactly(name, target):
    """torch's float fmod, remainder and floor division start from an exact fmod
    (kf.fmod): the special operands, then random ones of every magnitude through a strided
    divisor, bit for bit."""
    fn = FLOAT_MODULO[name]
    a = torch.tensor([p[0] for p in MODULO_CASES])
    b = torch.tensor([p[1] for p in MODULO_CASES])
    # torch's vectorized float32 kernel gives NaN where |a / b| is past float range (kf
    # gives C's fmod there: test_fmod_past_float_range_is_c_fmod)
    quotient = (a.double() if name != "rmod" else torch.full_like(a, 5.5).double()) / b.double()
    a, b = a[~(quotient.abs() > 3e38)], b[~(quotient.abs() > 3e38)]
    keep = _normal_only(target, fn(a, b), a, b)
    a, b = a[keep], b[keep]
    _same(kf.jit(fn, target=target)(*_on(target, a, b)).cpu(), fn(a, b))
    gen = torch.Generator().manual_seed(len(name))
    a = torch.randn(257, generator=gen) * torch.exp2(torch.randint(-30, 30, (257,), generator=gen).float())
    b = (torch.randn(514, generator=gen) * torch.exp2(torch.randint(-30, 30, (514,), generator=gen).float()))[::2]
    keep = _normal_only(target, fn(a, b), a, b)
    _same(kf.jit(fn, target=target)(*_on(target, a, b)).cpu()[keep], fn(a, b)[keep])


@pytest.mark.parametrize("target", TARGETS)
def test_fmod_past_float_range_is_c_fmod(target):
    a = torch.tensor([3.0e38, -5.5, 1e30, 2.0 ** 100] * 8)
    b = torch.tensor([1e-38, 2.0 ** -148, 3e-39, -(2.0 ** -30)] * 8)
    want = torch.fmod(a.double(), b.double()).float()
    keep = _normal_only(target, want, a, b)
    assert keep.any()
    got = kf.jit(FLOAT_MODULO["fmod"], target=target)(a, b)
    assert torch.equal(got[keep], want[keep])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_float_modulo_of_other_widths(dtype, target):
    """fmod and remainder of 16-bit floats are computed in float32 and rounded once (fmod
    is exact in every width); float64 on the cpu target (the SPIR-V targets have no
    float64). A 16-bit floor or truncating division is refused: torch's CPU and CUDA
    kernels round it differently."""
    if dtype == torch.float64 and target != "cpu":
        pytest.skip("float64 runs on the cpu target")
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(2, 257, generator=gen) * 20).to(dtype)
    for name in ("fmod", "mod", "remainder") + (("floordiv", "div_floor", "div_trunc") if dtype == torch.float64 else ()):
        fn = FLOAT_MODULO[name]
        _same(kf.jit(fn, target=target)(a, b), fn(a, b))
    if dtype != torch.float64:
        for name in ("floordiv", "div_floor", "div_trunc"):
            with pytest.raises(kf.UnsupportedOpError, match="of b?f16 is not supported by kf(.|\n)*test_elementwise.py(.|\n)*rounds a / b to the 16-bit"):
                kf.jit(FLOAT_MODULO[name], target=target)(a, b)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
@pytest.mark.parametrize("name", ["mod", "floordiv"])
def test_float_modulo_assembles_for_cuda(name):
    """sm_90a PTX of the elementwise kernel and of a row-wise one (vectors of remf)."""
    x = torch.randn(257, 64)
    fn = FLOAT_MODULO[name]
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a"), x, x).stages["ptx"]
    row = kf.jit(lambda a, b: fn(a, b) + a.sum(-1, keepdim=True), target="cuda", arch="sm_90a")
    assert ".entry" in kf.inspect(row, x, x).stages["ptx"]


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
@pytest.mark.parametrize("n", [1, 7, 257])
def test_integer_modulo_follows_torch(n, target):
    """Integer floor division, fmod and remainder of every sign, a strided divisor."""
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(n)
    a = torch.randint(-50, 50, (n,), generator=gen)
    b = (torch.randint(1, 9, (2 * n,), generator=gen) * torch.where(torch.rand(2 * n, generator=gen) < 0.5, -1, 1))[::2]
    for fn in (lambda a, b: a // b, lambda a, b: torch.fmod(a, b), lambda a, b: torch.remainder(a, b),
               lambda a, b: a % 7, lambda a, b: torch.remainder(a, -3)):
        assert torch.equal(kf.jit(fn, target=target)(a, b), fn(a, b))


INTEGER_DIVISION = {
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "fmod": lambda a, b: torch.fmod(a, b),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "scalars": lambda a, b: (a % 3) + (a // 7) * b - torch.fmod(a, -4), "rmod": lambda a, b: 100 % b}


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
def test_integer_division_of_every_integer_type(target, dtype):
    """Integer division and remainders are kf ops (kf.div and kf.fmod of integers), so
    they compile without torch-mlir and on every target: every sign, a divisor of -1,
    int8's -128 // -1 (wraps to -128, as torch), uint8 values past 127, and int64
    values past 2**53, which a division through double would round."""
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(dtype.itemsize)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -100), min(info.max, 100) + 1
    a = torch.randint(lo, hi, (257,), generator=gen, dtype=dtype)
    b = torch.randint(lo, hi, (257,), generator=gen, dtype=dtype)
    b[b == 0] = 3
    if dtype == torch.uint8:
        a[:3] = torch.tensor([255, 200, 129], dtype=dtype)
    else:
        # torch's CPU traps on INT32_MIN // -1 and INT64_MIN // -1 (narrower types are promoted)
        a[:2], b[:2] = info.min + (dtype.itemsize >= 4), -1
    if dtype == torch.int64:
        a[2:4], b[2:4] = torch.tensor([2 ** 62 + 1, -(2 ** 60) - 3]), torch.tensor([3, 7])
    for name, fn in INTEGER_DIVISION.items():
        got, want = kf.jit(fn, target=target)(a, b), fn(a, b)
        assert got.dtype == want.dtype and torch.equal(got, want), name


BITWISE = {
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "not": lambda a, b: ~a + b,
    "shl": lambda a, b: torch.bitwise_left_shift(a, b), "shr": lambda a, b: torch.bitwise_right_shift(a, b),
    "operators": lambda a, b: (a << 2) + (a >> 1) + (a & 0x0F) + (3 << b),
    # int4 weights packed two to a byte, as quantized checkpoints keep them
    "unpack_int4": lambda a, b: (((a >> 4) & 0xF).float() - 8) * 0.5 + ((a & 0xF).float() - 8)}


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
def test_bitwise_ops_of_every_integer_type(target, dtype):
    """Integer and, or, xor, not and shifts are kf ops (kf.bitwise): shifts by a negative
    amount or past the type's width give torch's 0 or sign (LLVM, PTX and SPIR-V leave
    them undefined), uint8 shifts right zero-filled."""
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(dtype.itemsize + 1)
    info = torch.iinfo(dtype)
    a = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, (257,), generator=gen, dtype=dtype)
    b = torch.randint(0 if dtype == torch.uint8 else -3, min(info.max, 70), (257,), generator=gen, dtype=dtype)
    b[:4] = torch.tensor([0, dtype.itemsize * 8 - 1, dtype.itemsize * 8, min(info.max, 70)], dtype=dtype)
    for name, fn in BITWISE.items():
        got, want = kf.jit(fn, target=target)(a, b), fn(a, b)
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
def test_integer_power_of_every_integer_type(target, dtype):
    """x ** y of integers wraps as torch's, and a negative exponent gives torch's 0, 1 or
    -1 (never the division by 0 of ipowi's expansion, which traps on the CPU); a uint8
    exponent past 127 is not negative."""
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(dtype.itemsize + 2)
    info = torch.iinfo(dtype)
    a = torch.randint(max(info.min, -5), 6, (257,), generator=gen, dtype=dtype)
    b = torch.randint(0 if dtype == torch.uint8 else -3, 9, (257,), generator=gen, dtype=dtype)
    a[:5] = torch.tensor([0, 1, 255 if dtype == torch.uint8 else -1, 2, 3], dtype=dtype)
    b[:5] = torch.tensor([200, 3, 2, 130, 5] if dtype == torch.uint8 else [-1, -3, -3, -2, 5], dtype=dtype)
    for fn in (lambda a, b: torch.pow(a, b), lambda a, b: 3 ** b, lambda a, b: a ** 3 + a ** 2):
        got, want = kf.jit(fn, target=target)(a, b), fn(a, b)
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_integer_ops_assemble_for_cuda_without_torch_mlir():
    """Integer division, remainders and bit ops are kf ops, not torch-mlir's functions
    (``kf.aten``, which GPU targets run only on the cpu): their cuda kernels build."""
    a, b = torch.randint(0, 255, (257,), dtype=torch.uint8), torch.randint(1, 7, (257,), dtype=torch.uint8)
    for fn in (BITWISE["unpack_int4"], BITWISE["operators"], BITWISE["not"], INTEGER_DIVISION["scalars"],
               lambda a, b: a ** b):
        stages = kf.inspect(kf.jit(fn, target="cuda"), a, b).stages
        assert "kf.aten" not in stages["kf"] and ".entry" in stages["ptx"]


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
def test_integer_division_by_zero_follows_kfs_rule(target):
    """A divisor of 0 never traps (a CPU's integer division by 0 kills the process):
    the quotient is the dividend and the remainder 0, kf.div's documented rule."""
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    a = torch.tensor([7, -7, 0, 5])
    b = torch.tensor([0, 0, 0, 2])
    got = kf.jit(lambda a, b: (a // b, a % b, torch.fmod(a, b)), target=target)(a, b)
    assert got[0].tolist() == [7, -7, 0, 2] and got[1].tolist() == [0, 0, 0, 1] and got[2].tolist() == [0, 0, 0, 1]


def test_integer_division_of_constants_folds_exactly():
    """kf-canonicalize folds integer kf.div and kf.fmod of constants with C's rule
    (toward zero, the dividend's sign), not through floats."""
    def fn(x):
        n = torch.full((3,), -7)
        return x + n // 2 + n % 3 + torch.fmod(n, 4) + torch.div(n, -1, rounding_mode="trunc")

    x = torch.arange(3)
    assert torch.equal(kf.jit(fn, target="cpu")(x), fn(x))
    linalg = str(kf.inspect(kf.jit(fn, target="cpu"), x).stages["linalg"])
    assert "arith.divsi" not in linalg and "arith.remsi" not in linalg


@pytest.mark.parametrize("target", TARGETS)
def test_fmax_fmin_angle_of_views_and_integers(target):
    """NaN on either side, broadcast, non-contiguous and integer operands."""
    gen = torch.Generator().manual_seed(9)
    x = _values(13 * 9, torch.float32, gen).reshape(9, 13).t()
    y = _values(13, torch.float32, gen)[:, None]
    i, j = torch.randint(-5, 5, (7,), generator=gen), torch.randint(-5, 5, (7,), generator=gen)

    def fn(x, y, i, j):
        return torch.fmax(x, y), torch.fmin(y, x), torch.angle(x), torch.fmax(i, j), torch.fmin(i, j), torch.angle(i)

    for got, want in zip(kf.jit(fn, target=target)(x, y, i, j), fn(x, y, i, j)):
        _check(got, want, exact=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shapes", [((5,), (5, 5)), ((1,), (7, 1)), ((257,), (3, 257)), ((3, 1), (3, 13)),
                                    ((0,), (2, 0))], ids=str)
@pytest.mark.parametrize("tensor_value", [False, True])
def test_masked_fill_broadcasts_the_input_to_the_mask(target, shapes, tensor_value):
    """torch.masked_fill (out of place) broadcasts the input and the mask together: a
    mask larger than the input gives a result of the mask's shape."""
    xs, ms = shapes
    gen = torch.Generator().manual_seed(sum(ms))
    x = torch.randn(xs, generator=gen)
    mask = (torch.rand(ms[::-1], generator=gen) > 0.5).t() if len(ms) == 2 else torch.rand(ms, generator=gen) > 0.5
    if tensor_value:
        fn = lambda x, m, v: torch.masked_fill(x, m, v)  # noqa: E731
        args = (x, mask, torch.tensor(-3.5))
    else:
        fn = lambda x, m: torch.masked_fill(x, m, 2.25)  # noqa: E731
        args = (x, mask)
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1,), (7,), (2, 3, 257), (0, 3), (2, 5, 4, 3)], ids=str)
def test_prelu(shape, target):
    """prelu with one weight, and one per channel (dim 1; a 1-D input has one)."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen)
    channels = shape[1] if len(shape) >= 2 else 1
    one, per = torch.rand(1, generator=gen), torch.rand(channels, generator=gen)

    def fn(x, one, per):
        return torch.nn.functional.prelu(x, one), torch.nn.functional.prelu(x, per)

    f = kf.jit(fn, target=target)
    for v in (x, x.flip(0) if x.numel() else x):
        for got, want in zip(f(v, one, per), fn(v, one, per), strict=True):
            torch.testing.assert_close(got, want)


def test_prelu_assembles_for_cuda():
    import os
    import shutil

    if shutil.which("ptxas") is None and not os.path.exists("/usr/local/cuda/bin/ptxas"):
        pytest.skip("needs ptxas")
    fn = kf.jit(lambda x, w: torch.nn.functional.prelu(x, w), target="cuda", arch="sm_90a")
    assert ".entry" in kf.inspect(fn, torch.randn(2, 5, 9), torch.rand(5)).ptx
