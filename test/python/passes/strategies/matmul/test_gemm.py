"""The matmul kernels with run-time sizes (passes/strategies/matmul/gemm.py's
``RunTimeRows``): a run-time M, leading batch dim or K, one program for every size on cpu
and vulkan against torch in float64; the CUDA kernels assembled for sm_90a and sm_80
with ptxas, without spills."""

from __future__ import annotations

import pytest
import torch

import kf
import kf.runtime.vulkan
from kf.signature import bind

needs_vulkan = pytest.mark.skipif(not kf.runtime.vulkan.is_available(), reason="no Vulkan device")
TARGETS = ["cpu", pytest.param("vulkan", marks=needs_vulkan)]
ROWS = (7, 257, 300, 1)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _one_program(f) -> None:
    fresh = [c for c in f.compiles if not c.cached]
    assert len(fresh) == 1 and "?" in fresh[0].signature, [c.signature for c in f.compiles]


def _close(got, want, dtype):
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want.to(dtype).double(), atol=tol * max(1.0, want.abs().max().item()),
                               rtol=tol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_run_time_m_with_bias_and_gelu(target, dtype):
    """gelu(x @ w.t() + b) with x's rows dynamic: M from the output's slot, the row tails
    guarded, the epilogue (bias, GELU, the cast) on the run-time rows."""
    fn = lambda x, w, b: torch.nn.functional.gelu(x @ w.t() + b)  # noqa: E731
    f = kf.jit(fn, target=target, dynamic={"x": [0]})
    w, b = torch.randn(72, 40, dtype=dtype), torch.randn(72, dtype=dtype)
    for m in ROWS:
        x = torch.randn(m, 40, dtype=dtype)
        _close(f(x, w, b), fn(x.double(), w.double(), b.double()), dtype)
    _one_program(f)


@pytest.mark.parametrize("target", TARGETS)
def test_run_time_batch(target):
    """A run-time leading batch dim: the grid's z over the slot (a weight shared by the
    batch, and a batched matmul of two run-time batches)."""
    f = kf.jit(lambda x, w: torch.relu(x @ w), target=target, dynamic={"x": [0]})
    g = kf.jit(lambda a, c: a @ c, target=target, dynamic={"a": [0], "c": [0]})
    w = torch.randn(8, 6)
    for n in (7, 2, 300):
        x, a, c = torch.randn(n, 5, 8), torch.randn(n, 5, 8), torch.randn(n, 8, 3)
        _close(f(x, w), torch.relu(x.double() @ w.double()), torch.float32)
        _close(g(a, c), a.double() @ c.double(), torch.float32)
    _one_program(f)
    _one_program(g)


@pytest.mark.parametrize("target", TARGETS)
def test_run_time_k_weight_gradient(target):
    """A weight gradient (x.t() @ dy) sums over the run-time rows: K is the run-time size,
    the K loop runs to it, its tail zero-filled."""
    f = kf.jit(lambda x, dy: x.t() @ dy, target=target, dynamic={"x": [0], "dy": [0]})
    for m in ROWS:
        x, dy = torch.randn(m, 40), torch.randn(m, 24)
        _close(f(x, dy), x.double().t() @ dy.double(), torch.float32)
    _one_program(f)


@needs_vulkan
def test_run_time_n_takes_the_generic_strategy():
    """x @ w.t() with w's rows (N) dynamic: N after M would be a run-time stride, which the
    matmul kernels do not take; the generic strategy writes it, one program."""
    f = kf.jit(lambda x, w: x @ w.t(), target="vulkan", dynamic={"w": [0]})
    x = torch.randn(5, 16)
    for n in (7, 9, 300):
        w = torch.randn(n, 16)
        _close(f(x, w), x.double() @ w.double().t(), torch.float32)
    _one_program(f)


def _ptxas():
    from kf.passes.to_cuda import ptxas_path

    return ptxas_path()


@pytest.mark.skipif(not _ptxas(), reason="needs ptxas")
@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_run_time_kernels_assemble_without_spills(chip, dtype):
    """The kernels with a run-time M (SIMT for f32; wgmma on sm_90a, mma.sync on sm_80
    for bf16: the row tiles a grid expression over the slot) and with a run-time K
    (mma.sync for bf16) assemble with ptxas and spill nothing."""
    from kf.driver import build
    from kf.options import Options
    from kf.passes.to_cuda import assemble
    from kf.runtime.abi import ProgramABI

    def compiled(fn, args, dims):
        sig, tensors = bind(fn, args, {})
        meta, artifacts = build(fn, sig.generalize(dims, 16), tensors, Options(target="cuda"), chip)
        ptx = next(v for k, v in artifacts.items() if k.endswith(".ptx")).decode()
        assert all(k["spill_store_bytes"] == 0 for k in assemble(ptx, chip).kernels.values())
        return ProgramABI.from_json(meta["abi"]), ptx

    linear = lambda x, w, b: torch.nn.functional.linear(x, w, b)  # noqa: E731
    abi, ptx = compiled(linear, (torch.randn(7, 128, dtype=dtype), torch.randn(256, 128, dtype=dtype),
                                 torch.randn(256, dtype=dtype)), {("x", 0)})
    mm = [k for k in abi.kernels if k.extra.get("strategy") == "matmul"]
    assert mm and all(k.sizes and "k" in k.grid_sizes[1] for k in mm)
    if dtype == torch.bfloat16:
        assert ("wgmma" in ptx) == (chip == "sm_90a") and "mma" in ptx
    grad = lambda x, dy: x.t() @ dy  # noqa: E731
    abi, ptx = compiled(grad, (torch.randn(7, 128, dtype=dtype), torch.randn(7, 256, dtype=dtype)),
                        {("x", 0), ("dy", 0)})
    assert [k.extra.get("strategy") for k in abi.kernels] == ["matmul"] and abi.kernels[0].sizes
    # (x^T, A MN-major, of a narrow layer: mma.sync on every chip)
    assert ("mma.sync" in ptx) == (dtype == torch.bfloat16)
