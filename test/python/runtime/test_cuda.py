"""runtime/cuda.py: kf-to-cuda's PTX launched on torch tensors, checked against torch.

The GPU tests compile the hand-written kernels of test/python/passes/test_to_cuda.py,
launch them through CudaKernel on fresh random inputs with poisoned outputs, and compare
with a float64 torch reference by ‖out − ref‖ / ‖ref‖. They skip, saying why, where
torch sees no CUDA device or cuda-python is missing; the tests at the top need neither.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from kf.runtime import cuda as kcuda
from kf.runtime.abi import KernelABI, TensorArg

_HERE = Path(__file__).resolve()


def _kernels():
    """The kernel builders shared with the pass tests and the device smoke script."""
    spec = importlib.util.spec_from_file_location("kf_cuda_kernels", _HERE.parents[1] / "passes" / "test_to_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- no GPU needed


def test_runtime_imports_no_compiler():
    """runtime/ never imports mlir or kf.passes (DESIGN.md: layer boundaries)."""
    tree = ast.parse((_HERE.parents[3] / "runtime" / "cuda.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    assert not any(n == "mlir" or n.startswith(("mlir.", "kf.passes")) for n in names), names


def test_ptx_image_is_nul_terminated():
    m = kcuda.CudaModule(".version 7.8\n")
    assert m.image.endswith(b"\0") and m.image.count(b"\0") == 1
    assert kcuda.CudaModule(b"\x7fELF....").image == b"\x7fELF...."


def test_param_array_points_at_slots():
    import ctypes

    k = kcuda.CudaKernel(kcuda.CudaModule("x"), "k", (1,), (32,), args=3)
    assert k.grid == (1, 1, 1) and k.block == (32, 1, 1)
    k._slots[2] = 0xDEADBEEF
    third = ctypes.cast(k._params[2], ctypes.POINTER(ctypes.c_uint64)).contents.value
    assert third == 0xDEADBEEF


def test_error_names_the_kernel():
    e = kcuda.CudaError("row_stats", "cuLaunchKernel", None, "grid (1, 1, 1)")
    assert "row_stats" in str(e) and "cuLaunchKernel" in str(e)


# ----------------------------------------------------------------------------- on a GPU

torch = pytest.importorskip("torch")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
driver = pytest.mark.skipif(kcuda._drv is None, reason="cuda-python (cuda.bindings.driver) is not installed")


def _launcher(built, args, validate=True, chip=None):
    from kf.passes import to_cuda

    text, entry, grid, block, shared = built
    if chip is None:
        major, minor = torch.cuda.get_device_capability()
        chip = f"sm_{major}{minor}"
    ptx = to_cuda.compile_to_ptx(text, chip=chip)["kf_kernels"]
    return kcuda.CudaKernel(kcuda.CudaModule(ptx), entry, grid, block, shared, args, validate)


def _rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in the output (unwritten or wrong)"
    return float((out - ref).norm() / ref.norm())


_TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
_DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@gpu
@driver
@pytest.mark.parametrize("elem", ["f32", "bf16", "f16"])
def test_elementwise_matches_torch(elem):
    K = _kernels()
    n, dt = 1000, _DT[elem]
    k = _launcher(K.elementwise_kernel(n=n, elem=elem), [TensorArg(a, (n,), elem) for a in "xyz"])
    x = torch.randn(n, device="cuda").to(dt)
    y = torch.randn(n, device="cuda").to(dt)
    z = torch.full((n,), float("nan"), device="cuda", dtype=dt)
    k(x, y, z)
    torch.cuda.synchronize()
    assert _rel(z, K.elementwise_reference(x, y)) < _TOL[elem]


@gpu
@driver
@pytest.mark.parametrize("cols", [257, 1024])
@pytest.mark.parametrize("elem", ["f32", "bf16"])
def test_row_stats_matches_torch(elem, cols):
    K = _kernels()
    rows, dt = 96, _DT[elem]
    args = [TensorArg("x", (rows, cols), elem), TensorArg("mean", (rows,), elem), TensorArg("var", (rows,), elem)]
    k = _launcher(K.row_stats_kernel(rows=rows, cols=cols, elem=elem), args)
    x = (torch.randn(rows, cols, device="cuda") * 3 + 1.5).to(dt)
    mean = torch.full((rows,), float("nan"), device="cuda", dtype=dt)
    var = torch.full((rows,), float("nan"), device="cuda", dtype=dt)
    k(x, mean, var)
    torch.cuda.synchronize()
    rv, rm = torch.var_mean(x.double(), dim=1, correction=0)
    assert _rel(mean, rm) < _TOL[elem] and _rel(var, rv) < _TOL[elem]


@gpu
@driver
def test_vector_axpy_matches_torch():
    K = _kernels()
    n = 1 << 20
    k = _launcher(K.vector_axpy_kernel(n=n), [TensorArg(a, (n,), "f32") for a in "xyz"])
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    z = torch.full_like(x, float("nan"))
    k(x, y, z)
    torch.cuda.synchronize()
    assert torch.equal(z, 2 * x + y)


@gpu
@driver
def test_dynamic_shared_memory_above_48k():
    K = _kernels()
    built = K.tile_reverse_kernel(tiles=8, tile=16384)
    assert built[4] == 64 * 1024
    n = 8 * 16384
    k = _launcher(built, [TensorArg("x", (n,), "f32"), TensorArg("y", (n,), "f32")])
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    k(x, y)
    torch.cuda.synchronize()
    assert torch.equal(y, x.view(8, 16384).flip(1).reshape(-1))


@gpu
@driver
def test_launches_on_torch_current_stream():
    """Work queued on a side stream and in a captured CUDA graph is ordered by that stream:
    a launch on any other stream would break graph capture or race with the fill."""
    K = _kernels()
    n = 1 << 20
    k = _launcher(K.axpy_kernel(n=n), [TensorArg(a, (n,), "f32") for a in "xyz"])
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    z = torch.empty_like(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z.fill_(float("nan"))
        k(x, y, z)
    s.synchronize()
    assert torch.equal(z, 2 * x + y)
    g = torch.cuda.CUDAGraph()
    z.fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        k(x, y, z)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, 2 * x + y)


@gpu
@driver
def test_wrong_tensor_is_refused():
    K = _kernels()
    k = _launcher(K.elementwise_kernel(n=1000), [TensorArg(a, (1000,), "f32") for a in "xyz"])
    good = torch.zeros(1000, device="cuda")
    with pytest.raises(TypeError, match="argument 1 .'y'.*shape"):
        k(good, torch.zeros(999, device="cuda"), good)
    with pytest.raises(TypeError, match="takes 3 tensors"):
        k(good, good)


@gpu
@driver
def test_bad_launch_raises_cuda_error():
    K = _kernels()
    text, entry, grid, _, shared = K.empty_kernel()
    from kf.passes import to_cuda

    ptx = to_cuda.compile_to_ptx(text, chip="sm_%d%d" % torch.cuda.get_device_capability())["kf_kernels"]
    k = kcuda.CudaKernel(kcuda.CudaModule(ptx), entry, grid, (4096, 1, 1), shared, args=1)
    with pytest.raises(kcuda.CudaError, match=r"'nop'.*cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        k(torch.zeros(1, device="cuda"))
    missing = kcuda.CudaKernel(kcuda.CudaModule(ptx), "no_such_kernel", (1,), (32,), args=1)
    with pytest.raises(kcuda.CudaError, match="cuModuleGetFunction.*CUDA_ERROR_NOT_FOUND"):
        missing(torch.zeros(1, device="cuda"))


@gpu
@driver
def test_from_abi_and_one_load_per_context():
    """A KernelABI's args pick the program's buffers; the caller passes them in that order.
    Two kernels over one module share its single load in the one context."""
    K = _kernels()
    from kf.passes import to_cuda

    text, entry, grid, block, shared = K.axpy_kernel(n=4096)
    ptx = to_cuda.compile_to_ptx(text, chip="sm_%d%d" % torch.cuda.get_device_capability())["kf_kernels"]
    bufs = [TensorArg(a, (4096,), "f32") for a in "xyz"]
    mod = kcuda.CudaModule(ptx)
    abi1, abi2 = KernelABI(entry, (0, 1, 2), grid, block, shared), KernelABI(entry, (1, 0, 2), grid, block, shared)
    k1 = kcuda.CudaKernel.from_abi(abi1, bufs, mod)
    k2 = kcuda.CudaKernel.from_abi(abi2, bufs, mod)
    tensors = [torch.randn(4096, device="cuda") for _ in range(3)]
    x, y, z = tensors
    k1(*[tensors[i] for i in abi1.args])
    torch.cuda.synchronize()
    assert torch.equal(z, 2 * x + y)
    k2(*[tensors[i] for i in abi2.args])  # buffers 1, 0, 2: x and y swap places
    torch.cuda.synchronize()
    assert torch.equal(z, 2 * y + x)
    assert len(mod._loaded) == 1


def _is_fast_lane(lane) -> bool:
    """CompiledProgram.matched_call's fast lane: kf.runtime._launcher.Lane where the C
    launcher and dispatch are in use (CudaProgram.c_lane), else its Python function ``call``."""
    import os

    from kf.runtime import programs

    lane_type = programs._c_lane_type()
    if lane_type is not None and kcuda._c_launch is not None and os.environ.get("KF_CUDA_SYNC", "") in ("", "0"):
        return type(lane) is lane_type
    return getattr(lane, "__name__", "") == "call"


@gpu
@driver
def test_fast_lane_of_a_matched_call():
    """Calls after the first take the program's fast lane (one kernel, contiguous matched
    tensors): fresh outputs each call, right results; a view at an odd offset (not
    16-byte aligned) and a non-contiguous tensor of the same shape go the general way;
    kf.profile still sees the launches."""
    import kf

    f = kf.jit(lambda x, y: x * 2 + y)
    x, y = torch.randn(1000, 33, device="cuda"), torch.randn(1000, 33, device="cuda")
    first = f(x, y)
    lane = next(iter(f._fast.values()))
    assert _is_fast_lane(lane)  # CompiledProgram.matched_call's fast lane
    x2, y2 = torch.randn(1000, 33, device="cuda"), torch.randn(1000, 33, device="cuda")
    second = f(x2, y2)
    assert second.data_ptr() != first.data_ptr()
    # the lane's own allocation (_empty_strided_cuda) gives what torch.empty would
    assert (second.shape, second.stride(), second.dtype, second.device) == \
        (first.shape, first.stride(), first.dtype, first.device) == ((1000, 33), (33, 1), torch.float32, x.device)
    torch.testing.assert_close(second, x2 * 2 + y2)
    torch.testing.assert_close(first, x * 2 + y)
    base = torch.randn(1000 * 33 + 1, device="cuda")
    odd = base[1:].view(1000, 33)  # contiguous, 4 bytes past an aligned address
    torch.testing.assert_close(f(odd, y2), odd * 2 + y2)
    strided = torch.randn(33, 1000, device="cuda").t()
    torch.testing.assert_close(f(strided, y2), strided * 2 + y2)
    with kf.profile() as prof:
        f(x2, y2)
        torch.cuda.synchronize()
    assert len(prof.launches) == 1


@gpu
@driver
def test_fast_lane_on_a_side_stream_and_in_a_cuda_graph():
    """The fast lane launches on torch's current stream and allocates its output where
    torch would: on a side stream, and from the graph's pool while a CUDA graph is being
    captured, so that replays write the output the capture returned."""
    import kf

    f = kf.jit(lambda x: x * 2 + 1)
    x = torch.randn(4096, device="cuda")
    f(x)
    assert _is_fast_lane(next(iter(f._fast.values())))  # later calls take the fast lane
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = f(x)
    s.synchronize()
    torch.testing.assert_close(y, x * 2 + 1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f(x)
    x.copy_(torch.randn(4096, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 2 + 1)
