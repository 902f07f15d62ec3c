"""kf-linalg-to-gpu (passes/linalg_to_gpu.py): the ATen ops kf has no op for, lowered by
torch-mlir, run as GPU kernels. On Vulkan (lavapipe) against torch eager on fresh random
inputs at odd sizes, empty and non-contiguous inputs; for CUDA the same functions' PTX
assembles with ptxas for sm_90a; for Metal SPIRV-Cross writes their MSL."""

import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

pytest.importorskip("torch_mlir")

needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")


@pytest.fixture(autouse=True)
def _through_torch_mlir(monkeypatch):
    """The subject here is torch-mlir's linalg on the GPU targets: ops that kf now
    compiles itself (its own handlers, or torch's decompositions into kf ops) take
    torch-mlir's path in these tests, as an op without either does."""
    from kf.aten import core, decompositions

    monkeypatch.setattr(decompositions, "decomposition_of", lambda target: None)
    for name in ("aten.constant_pad_nd.default", "aten.convolution.default", "aten.flip.default",
                 "aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default",
                 "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor"):
        monkeypatch.delitem(core.HANDLERS, name, raising=False)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _norm_rows(x):
    return torch.linalg.vector_norm(x, dim=-1)


def _norm_all(x):
    return torch.linalg.vector_norm(x)


def _norm_cols(x):  # the reduction loop is the outer one in torch-mlir's generic
    return torch.linalg.vector_norm(x, ord=3, dim=0)


def _nansum_rows(x):
    return torch.nansum(x, dim=-1)


def _nansum_cols(x):  # the reduction loop is the outer one in torch-mlir's generic
    return torch.nansum(x * x, dim=0)


def _pad(x):
    return F.pad(x, (1, 2, 0, 3), value=0.5)


def _pad_reflect(x):
    return F.pad(x.unsqueeze(0), (1, 0), mode="reflect").squeeze(0)


def _broadcast(x):
    a, b = torch.broadcast_tensors(x[:, :1], x[:1, :])
    return a * 2, b


def _logaddexp2(x):
    return torch.logaddexp2(x * 10, x)


def _linspace(x):
    return x + torch.linspace(-1, 3, x.shape[-1], device=x.device)


def _conv(x):  # a named op (linalg.conv_1d_ncw_fcw) with reduction loops, a padded input
    return F.conv1d(x.unsqueeze(1), x.new_ones(2, 1, 3) * 0.5, padding=1)


def _logaddexp(x):
    return torch.logaddexp(x, x.flip(-1))


FUNCTIONS = [_norm_rows, _norm_all, _norm_cols, _nansum_rows, _nansum_cols, _pad, _pad_reflect, _broadcast, _logaddexp2, _linspace,
             _conv, _logaddexp]
SIZES = [(1, 1), (7, 3), (5, 257), (257, 7)]


def _close(got, ref):
    if isinstance(ref, torch.Tensor):
        got, ref = (got,), (ref,)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=2e-5, atol=2e-5)


@needs_vulkan
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_matches_torch_on_vulkan(fn, shape):
    if fn is _pad_reflect and shape[-1] < 2:
        pytest.skip("reflect padding needs two columns")
    x = torch.randn(*shape)
    _close(kf.jit(fn, target="vulkan")(x), fn(x))


@needs_vulkan
@pytest.mark.parametrize("fn", [_norm_rows, _pad, _logaddexp2, _linspace], ids=lambda f: f.__name__.strip("_"))
def test_non_contiguous_input(fn):
    x = torch.randn(13, 7).t()
    assert not x.is_contiguous()
    _close(kf.jit(fn, target="vulkan")(x), fn(x))


@needs_vulkan
@pytest.mark.parametrize("fn", [_norm_rows, _pad, _logaddexp2], ids=lambda f: f.__name__.strip("_"))
def test_empty_input(fn):
    x = torch.randn(0, 5)
    _close(kf.jit(fn, target="vulkan")(x), fn(x))


@needs_vulkan
def test_scalars_ints_and_bools():
    """0-d tensors (a norm of everything, then arithmetic on it) and the i64 and i1
    tensors torch-mlir makes (linspace's iota and its masks) inside one function."""
    def f(x):
        n = torch.linalg.vector_norm(x)
        return torch.remainder((x / n * 1000).round().long(), 7), n

    x = torch.randn(257)
    _close(kf.jit(f, target="vulkan")(x), f(x))


def _remainder(x):
    return torch.remainder(x, 3)


@pytest.fixture
def remainder_through_torch_mlir(monkeypatch, tmp_path):
    """Integer remainder through torch-mlir's lowering rather than kf's own (kf.fmod):
    the torch-mlir path's integer tensors, in and out of GPU kernels."""
    from kf.aten.core import HANDLERS

    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    for name in ("aten.remainder.Scalar", "aten.remainder.Tensor"):
        monkeypatch.delitem(HANDLERS, name)


def _to_3d(x):
    return torch.atleast_3d(x)


def _isclose(x):
    return torch.isclose(x, x.round(), atol=0.3)


INT_BOOL_CASES = [(_remainder, lambda: torch.randint(-50, 50, (7, 257))),
                  (_remainder, lambda: torch.randint(-50, 50, (1,), dtype=torch.int32)),
                  (_to_3d, lambda: torch.rand(7) > 0.5),
                  (_isclose, lambda: torch.randn(257, 3))]


@needs_vulkan
@pytest.mark.parametrize("fn, make", INT_BOOL_CASES, ids=["i64", "i32", "bool", "to_bool"])
def test_int_and_bool_tensors(fn, make, remainder_through_torch_mlir):
    """int32, int64 and bool tensors in and out of torch-mlir's functions, exactly."""
    x = make()
    assert "kf.aten" in kf.inspect(kf.jit(fn, target="vulkan"), x).stages["kf"]
    got, ref = kf.jit(fn, target="vulkan")(x), fn(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas not installed")
@pytest.mark.parametrize("fn, make", INT_BOOL_CASES, ids=["i64", "i32", "bool", "to_bool"])
def test_int_and_bool_ptx(fn, make, remainder_through_torch_mlir):
    ptx = kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a"), make()).stages["ptx"]
    assert re.search(r"\.entry kf_aten_\w+_k\d+", ptx)


@needs_vulkan
@pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss], ids=["mse", "smooth_l1"])
def test_zero_dim_tensors(loss):
    """0-d inputs and result: torch-mlir's square is math.fpowi, written by squaring."""
    x, y = torch.randn(()), torch.randn(())
    _close(kf.jit(loss, target="vulkan")(x, y), loss(x, y))


@needs_vulkan
def test_kernels_between_kf_kernels():
    """A kf kernel before and after the fallback: its buffers come from the schedule."""
    def f(x, w):
        y = F.pad(torch.relu(x @ w), (2, 1))
        return torch.softmax(torch.linalg.vector_norm(y, dim=0, keepdim=True) * y, dim=-1)

    x, w = torch.randn(7, 33), torch.randn(33, 5)
    _close(kf.jit(f, target="vulkan")(x, w), f(x, w))


@needs_vulkan
def test_long_sum_in_stages():
    """Float sums over more than 4096 elements run in stages: the sum of ones(2**22)
    squared is exact (a sequential f32 chain would stop at 2**24; here it shows its
    growing error), and a random one is within 1e-6 of float64."""
    f = kf.jit(_norm_all, target="vulkan")
    assert f(torch.ones(2 ** 22)).item() == 2048.0
    x = torch.rand(3, 2 ** 18)
    ref = torch.linalg.vector_norm(x.double(), dim=-1)
    assert ((kf.jit(_norm_rows, target="vulkan")(x).double() - ref).abs() / ref).max() < 1e-6


@needs_vulkan
def test_schedule_launches_the_fallback_in_order():
    """The fallback's kernels are in the program's gpu.module and launched between the kf
    kernels, each writing its buffers in place (kf.tied)."""
    def f(x):
        return F.pad(torch.logaddexp2(x * 2, x), (1, 2)) + 1

    x = torch.randn(3, 5)
    info = kf.inspect(kf.jit(f, target="vulkan"), x)
    gpu = info.stages["gpu"]
    assert "kf.aten" not in gpu
    assert re.search(r"call @f_k0_elementwise.*\n.*call @kf_aten_logaddexp2_default_0_c0_buffer0", gpu), gpu
    assert gpu.count('kf.strategy = "linalg"') == 3  # logaddexp2; pad's fill, then its copy into the middle
    assert re.search(r"call @kf_aten_pad_default_1_c1_k1.*\n.*call @f_k1_elementwise", gpu), gpu
    assert "kf.tied" in gpu


@needs_vulkan
def test_float64_on_spirv_computes_in_float64():
    """A torch-mlir function of float64 tensors keeps f64 in its kernels (its scalars too):
    the values are eager's, not float32's."""
    def f(x):
        return F.pad(x, (1, 2), value=0.1) * 3.0

    for shape in ((1,), (7,), (257,), (0,), (4, 6)):
        x = torch.randn(*shape, dtype=torch.float64)
        if len(shape) == 2:
            x = x.t()  # non-contiguous
        got = kf.jit(f, target="vulkan")(x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, f(x), rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_matches_torch_on_cuda(fn, shape):
    if fn is _pad_reflect and shape[-1] < 2:
        pytest.skip("reflect padding needs two columns")
    x = torch.randn(*shape, device="cuda")
    _close(kf.jit(fn, target="cuda")(x), fn(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("fn, make", INT_BOOL_CASES, ids=["i64", "i32", "bool", "to_bool"])
def test_int_and_bool_tensors_on_cuda(fn, make):
    x = make().cuda()
    got, ref = kf.jit(fn, target="cuda")(x), fn(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


#: FUNCTIONS whose ops are still torch-mlir's (the vector norms became kf reductions)
FALLBACKS = [f for f in FUNCTIONS if f not in (_norm_rows, _norm_all, _norm_cols)]


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas not installed")
@pytest.mark.parametrize("fn", FALLBACKS, ids=lambda f: f.__name__.strip("_"))
def test_ptx_assembles_for_cuda(fn):
    """The same functions for CUDA: their PTX (the fallback's kernels among its entries)
    assembles with ptxas for sm_90a (the ptx stage runs ptxas and raises if it refuses)."""
    stages = kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a"), torch.randn(7, 257)).stages
    ptx = stages["ptx"]
    assert ".target sm_90a" in ptx and re.search(r"\.entry kf_aten_\w+_k\d+", ptx), ptx[:2000]


@pytest.mark.skipif(not shutil.which("spirv-cross"), reason="spirv-cross not installed")
@pytest.mark.parametrize("fn", [_nansum_cols, _pad, _linspace], ids=lambda f: f.__name__.strip("_"))
def test_msl_for_metal(fn):
    stages = kf.inspect(kf.jit(fn, target="metal"), torch.randn(7, 257)).stages
    assert re.search(r"kernel void kf_aten_\w+_k\d+", stages["msl"]), stages["msl"][:2000]


@needs_vulkan
@pytest.mark.parametrize("n", [1, 7, 20, 257])
def test_boolean_splat_constant(n):
    """torch-mlir folds isreal of a real tensor to a splat of trues, which the launch
    schedule uploads as bytes: every element true (numpy's view of an i1 splat holds
    one byte of bits: 8 trues, then falses)."""
    x = torch.randn(n)
    got = kf.jit(lambda t: torch.isreal(t), target="vulkan")(x)
    assert got.dtype == torch.bool and bool(got.all()) and got.shape == (n,)


def _floor_divide(x, y):
    return x // y


def _dividends(n: int, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x // y for both signs, exact quotients (-49 // 7), and values past float32's 2**24
    (and, for int64, float64's 2**53): torch-mlir divides in double, which the SPIR-V
    targets compute in f32."""
    g = torch.Generator().manual_seed(seed)
    big = 2 ** 62 if dtype == torch.int64 else 2 ** 30
    x = torch.randint(-big, big, (n,), generator=g, dtype=torch.int64)
    x[:8] = torch.tensor([2 ** 24 + 1, -2 ** 24 - 1, -49, 49, 0, -7, 7, 123456789])[:n] if n else x[:0]
    y = torch.randint(1, 10, (n,), generator=g, dtype=torch.int64) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    y[:8] = torch.tensor([1, 1, 7, -7, -5, 2, -2, 10])[:n] if n else y[:0]
    return x.to(dtype), y.to(dtype)


@needs_vulkan
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("n", [0, 1, 8, 257])
def test_integer_floor_division_is_exact(dtype, n):
    """Integer x // y as torch gives it: torch-mlir's floor(double(x) / double(y)) was
    computed in f32 on Vulkan (2**24 + 1 // 1 gave 2**24) and rested on a correctly
    rounded division that Vulkan does not promise; kf-linalg-to-gpu makes it
    arith.floordivsi. Also a strided divisor."""
    x, y = _dividends(n, dtype, seed=n)
    f = kf.jit(_floor_divide, target="vulkan")
    got = f(x, y)
    assert got.dtype == dtype and torch.equal(got, x // y)
    y2 = torch.stack([y, -y], 1)[:, 1]  # every other element of a wider tensor
    assert torch.equal(f(x, y2), x // y2)
    gpu = kf.inspect(f, x, y).stages["gpu"] if n else ""
    assert "arith.divf" not in gpu


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas not installed")
def test_integer_floor_division_ptx_is_integer():
    """The same on CUDA (in double there, int64 past 2**53 rounded): integer division in
    the PTX, which assembles for sm_90a."""
    x, y = _dividends(257, torch.int64, seed=3)
    stages = kf.inspect(kf.jit(_floor_divide, target="cuda", arch="sm_90a"), x, y).stages
    assert "div.rn.f64" not in stages["ptx"] and "arith.divf" not in stages["gpu"]
    assert re.search(r"div\.s64", stages["ptx"])
