"""runtime/_launcher*.c (kf.runtime._launcher) and how runtime/cuda.py and
runtime/programs.py launch through it.

Without a GPU: setup.py builds the extension; bad arguments raise before any driver call;
without libcuda a launch raises OSError instead of crashing; and, against a stand-in
libcuda.so.1 whose cuLaunchKernel records what it was given (compiled here, run in a
child process with LD_LIBRARY_PATH pointing at it), the function handle, grid, block,
shared bytes, stream and every pointer arrive as kf passed them, from the extension
itself, from CudaKernel and from a CudaProgram's fast lane. On a GPU: kf kernels launched
through the extension match torch, and a bad launch raises CudaError naming the kernel.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from kf.runtime import cuda as kcuda

ROOT = Path(__file__).resolve().parents[3]
CC = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
have_cc = pytest.mark.skipif(shutil.which(CC.split()[0]) is None, reason=f"no C compiler ({CC})")

try:
    from kf.runtime import _launcher
except ImportError:  # built by pip install -e . where there is a C compiler
    _launcher = None


def _libcuda_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# ----------------------------------------------------------------------------- no GPU needed


@have_cc
def test_setup_builds_the_launcher(tmp_path):
    """setup.py's extension compiles (as pip install does) and the module it makes imports."""
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                        "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (built,) = (tmp_path / "lib" / "kf" / "runtime").glob("_launcher.*")
    probe = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('_launcher', sys.argv[1]); "
             "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.STACK_PARAMS, callable(m.launch))")
    r = subprocess.run([sys.executable, "-c", probe, str(built)], capture_output=True, text=True)
    assert r.stdout.split() == ["64", "True"], r.stderr


@have_cc
def test_installed_launcher_imports():
    """The editable install put the module beside its source, where kf imports it."""
    assert _launcher is not None, "kf.runtime._launcher is not built: run pip install -e . (scripts/setup.sh)"
    assert Path(_launcher.__file__).parent == ROOT / "runtime"


needs_ext = pytest.mark.skipif(_launcher is None, reason="kf.runtime._launcher is not built")


@needs_ext
@pytest.mark.parametrize("args, error, text", [
    ((), TypeError, "at least 9 arguments, 0 given"),
    ((1, 1, 1, 1, 32, 1, 1, 0), TypeError, "at least 9 arguments, 8 given"),
    ((1.0, 1, 1, 1, 32, 1, 1, 0, 0), TypeError, r"argument 1 \(function\) must be int, not float"),
    ((1, 1, 1, 1, 32, 1, 1, 0, None), TypeError, r"argument 9 \(stream\) must be int, not NoneType"),
    ((1, 1, 1, 1, 32, 1, 1, 0, 0, 4096, "0x10"), TypeError, r"argument 11 \(pointer\) must be int, not str"),
    ((1, -1, 1, 1, 32, 1, 1, 0, 0), OverflowError, r"argument 2 \(gx\)"),
    ((1, 1, 1, 1, 2**32, 1, 1, 0, 0), OverflowError, r"argument 5 \(bx\) must be below 2\*\*32"),
    ((1, 1, 1, 1, 32, 1, 1, 0, 0, 2**64), OverflowError, r"argument 10 \(pointer\)"),
    ((0, 1, 1, 1, 32, 1, 1, 0, 0), ValueError, "null CUfunction"),
])
def test_bad_arguments_raise_before_the_driver(args, error, text):
    with pytest.raises(error, match=text):
        _launcher.launch(*args)


@needs_ext
@pytest.mark.skipif(_libcuda_present(), reason="libcuda.so.1 is present here")
def test_no_libcuda_is_an_error_not_a_crash():
    with pytest.raises(OSError, match=r"cannot load the CUDA driver \(libcuda.so.1\)"):
        _launcher.load_driver()
    with pytest.raises(OSError, match="libcuda.so.1"):
        _launcher.launch(0x1000, 1, 1, 1, 32, 1, 1, 0, 0, 0x2000)


def test_launcher_choice(monkeypatch):
    """KF_CUDA_LAUNCHER: the extension by default where it imports, cuda.bindings when asked
    or when it is not built, and an error for a value it does not know."""
    monkeypatch.setenv("KF_CUDA_LAUNCHER", "bindings")
    assert kcuda._choose_launcher() == (None, "cuda.bindings (KF_CUDA_LAUNCHER=bindings)")
    monkeypatch.setenv("KF_CUDA_LAUNCHER", "ctypes")
    with pytest.raises(ValueError, match="KF_CUDA_LAUNCHER='ctypes'"):
        kcuda._choose_launcher()
    monkeypatch.delenv("KF_CUDA_LAUNCHER")
    launch, words = kcuda._choose_launcher()
    if _launcher is not None:
        assert launch is _launcher.launch and words.startswith("C (kf.runtime._launcher")
    import kf.runtime

    monkeypatch.setitem(sys.modules, "kf.runtime._launcher", None)  # as if it were not built
    monkeypatch.delattr(kf.runtime, "_launcher", raising=False)
    launch, words = kcuda._choose_launcher()
    assert launch is None and words.startswith("cuda.bindings (kf.runtime._launcher is not built")
    monkeypatch.setenv("KF_CUDA_LAUNCHER", "c")
    with pytest.raises(ImportError, match="KF_CUDA_LAUNCHER=c"):
        kcuda._choose_launcher()


# A stand-in for the driver: cuLaunchKernel records its arguments (the pointers read
# through the params array, as the real one reads them) and returns kf_fake_result.
_FAKE_DRIVER = r"""
#include <stdint.h>
int kf_fake_result = 0;
int kf_fake_calls = 0;
uint64_t kf_fake_function, kf_fake_stream;
unsigned kf_fake_dims[7];
uint64_t kf_fake_params[256];
int kf_fake_nparams = 0;  /* how many params to read: the kernel's signature, for the real driver */
uint64_t kf_fake_log[64][9];  /* per call (the first 64): the function, then up to 8 params */
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    unsigned d[7] = {gx, gy, gz, bx, by, bz, shared};
    kf_fake_calls++;
    kf_fake_function = (uint64_t)(uintptr_t)f;
    kf_fake_stream = (uint64_t)(uintptr_t)stream;
    for (int i = 0; i < 7; i++) kf_fake_dims[i] = d[i];
    for (int i = 0; i < kf_fake_nparams; i++) kf_fake_params[i] = *(uint64_t *)params[i];
    if (kf_fake_calls <= 64) {
        kf_fake_log[kf_fake_calls - 1][0] = kf_fake_function;
        for (int i = 0; i < kf_fake_nparams && i < 8; i++) kf_fake_log[kf_fake_calls - 1][1 + i] = kf_fake_params[i];
    }
    return extra == 0 ? kf_fake_result : -1;
}
"""

_PRELUDE = """
import ctypes
lib = ctypes.CDLL("libcuda.so.1")  # the stand-in: LD_LIBRARY_PATH puts it first
def fake(name, kind=ctypes.c_int):
    return kind.in_dll(lib, name)
def logged(calls, n):  # (function, its first n params) of each of the first calls launches
    log = (ctypes.c_uint64 * 9 * 64).in_dll(lib, "kf_fake_log")
    return [(log[c][0], list(log[c][1:1 + n])) for c in range(calls)]
def recorded(n):
    fake("kf_fake_nparams").value = 0
    return (fake("kf_fake_function", ctypes.c_uint64).value, tuple((ctypes.c_uint * 7).in_dll(lib, "kf_fake_dims")),
            fake("kf_fake_stream", ctypes.c_uint64).value, list((ctypes.c_uint64 * 256).in_dll(lib, "kf_fake_params"))[:n])
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if _launcher is None:
        pytest.skip("kf.runtime._launcher is not built")
    if _libcuda_present():
        # torch and the CUDA runtime would load the stand-in too; the GPU tests below
        # launch through the real driver there
        pytest.skip("the real libcuda.so.1 is here")
    if shutil.which(CC.split()[0]) is None:
        pytest.skip(f"no C compiler ({CC}) for the stand-in driver")
    d = tmp_path_factory.mktemp("fake_libcuda")
    (d / "fake.c").write_text(_FAKE_DRIVER)
    subprocess.run([*CC.split(), "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"), str(d / "fake.c")],
                   check=True)
    return d


def _run_with(driver_dir: Path, script: str) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=f"{driver_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    env.pop("KF_CUDA_LAUNCHER", None)
    r = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(script)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_launch_passes_every_argument(fake_driver):
    """The extension alone: what cuLaunchKernel receives, for a few pointers (the stack
    array) and for more than STACK_PARAMS (one heap allocation); the CUresult comes back."""
    _run_with(fake_driver, """
        from kf.runtime import _launcher
        ptrs = [0x7f0000000000 + 256 * i for i in range(3)]
        fake("kf_fake_nparams").value = 3
        assert _launcher.launch(0xabc0, 2, 3, 4, 128, 2, 1, 4096, 0x5000, *ptrs) == 0
        assert recorded(3) == (0xabc0, (2, 3, 4, 128, 2, 1, 4096), 0x5000, ptrs)
        many = [2**64 - 1 - i for i in range(_launcher.STACK_PARAMS + 36)]
        fake("kf_fake_nparams").value = len(many)
        assert _launcher.launch(1, 1, 1, 1, 1, 1, 1, 0, 0, *many) == 0
        assert recorded(len(many))[3] == many
        fake("kf_fake_result").value = 719  # CUDA_ERROR_LAUNCH_FAILED
        assert _launcher.launch(1, 1, 1, 1, 1, 1, 1, 0, 0) == 719
        assert fake("kf_fake_calls").value == 3
    """)


def test_cuda_kernel_launches_through_the_extension(fake_driver):
    """CudaKernel's __call__ and launch_pointers hand the bound function's address, its
    grid, block and shared bytes, torch's raw stream and the pointers to the extension;
    a failed launch raises CudaError naming the kernel and the configuration."""
    _run_with(fake_driver, """
        import torch
        from kf.runtime import cuda as kcuda
        assert kcuda.launcher().startswith("C (kf.runtime._launcher")
        kcuda._raw_stream_getter = lambda: (lambda device: 0x5100 + device)  # torch's, per device
        k = kcuda.CudaKernel(kcuda.CudaModule("x"), "row_stats", (96, 2), (128,), 1024, args=2, validate=False)
        # what _bind records for device 0 (binding needs cuda.bindings and a GPU)
        k._bound[0], k._handles[0] = kcuda._Bound(None, 0xf00), 0xf00
        k._raw_stream = kcuda._raw_stream_getter()
        launch = k.launch_pointers
        fake("kf_fake_nparams").value = 2
        launch([0x10000, 0x20000], 0)
        assert recorded(2) == (0xf00, (96, 2, 1, 128, 1, 1, 1024), 0x5100, [0x10000, 0x20000])
        x, y = torch.zeros(4), torch.zeros(4)
        k._bound[-1], k._handles[-1] = kcuda._Bound(None, 0xf01), 0xf01  # CPU tensors: device -1
        fake("kf_fake_nparams").value = 2
        k(x, y)
        assert recorded(2) == (0xf01, (96, 2, 1, 128, 1, 1, 1024), 0x5100 - 1, [x.data_ptr(), y.data_ptr()])
        fake("kf_fake_result").value = 1  # CUDA_ERROR_INVALID_VALUE
        for attempt in (lambda: launch([1, 2], 0), lambda: k(x, y)):
            try:
                attempt()
            except kcuda.CudaError as e:
                text = str(e)
                assert "'row_stats'" in text and "cuLaunchKernel failed" in text, text
                assert "grid (96, 2, 1), block (128, 1, 1), 1024 bytes" in text, text
            else:
                raise AssertionError("a failed launch did not raise")
        print("ok")
    """)


def test_program_fast_lane_pointer_order(fake_driver, tmp_path):
    """A CudaProgram's fast lane: inputs then outputs in the kernel's argument order
    (here permuted), fresh outputs of the program's shapes and dtypes, and a view at an
    odd offset launched from an aligned copy (the general path)."""
    (tmp_path / "k.ptx").write_text("// the stand-in driver never reads it\n")
    _run_with(fake_driver, f"""
        import torch
        from kf.runtime import cuda as kcuda, programs
        from kf.runtime.abi import KernelABI, ProgramABI, TensorArg
        kcuda._raw_stream_getter = lambda: (lambda device: 0x5200)
        # CPU tensors, so no current CUDA device: a CUDA build of torch on a machine
        # without a GPU would raise asking for it, as a CPU build does not
        programs._output_allocator = lambda: (None, lambda: None)
        ins = (TensorArg("a", (4, 8), "f32"), TensorArg("b", (8,), "f32"))
        outs = (TensorArg("0", (4, 8), "f32"), TensorArg("1", (4,), "i32"))
        order = (3, 0, 2, 1)  # buffers: a, b, out0, out1
        kernel = KernelABI("lane_k", order, (4, 1, 1), (64, 1, 1), 0, "k.ptx")
        prog = programs.CudaProgram(ProgramABI("cuda", ins, outs, (), (kernel,), (-1, -1)), {str(tmp_path)!r}, {{}})
        k = prog.kernels[0][0]
        k._bound[-1], k._handles[-1] = kcuda._Bound(None, 0xf02), 0xf02  # CPU tensors: device -1
        k._raw_stream = kcuda._raw_stream_getter()
        lane = prog.fast_lane()
        a, b = torch.randn(4, 8), torch.randn(8)
        fake("kf_fake_nparams").value = 4
        o0, o1 = lane([a, b])
        assert (o0.shape, o0.dtype, o0.stride(), o1.shape, o1.dtype) == ((4, 8), torch.float32, (8, 1), (4,), torch.int32)
        bufs = [a, b, o0, o1]
        assert recorded(4) == (0xf02, (4, 1, 1, 64, 1, 1, 0), 0x5200, [bufs[i].data_ptr() for i in order])
        odd = torch.randn(33)[1:].view(4, 8)  # contiguous, 4 bytes past an aligned address
        fake("kf_fake_nparams").value = 4
        p0, p1 = lane([odd, b])
        sent = recorded(4)[3]
        assert sent[1] != odd.data_ptr() and sent[1] % programs.ALIGNMENT == 0 and sent[0] == p1.data_ptr()
        print("ok")
    """)


# ----------------------------------------------------------------------------- on a GPU

torch = pytest.importorskip("torch")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
driver = pytest.mark.skipif(kcuda._drv is None, reason="cuda-python (cuda.bindings.driver) is not installed")


@gpu
@driver
@needs_ext
def test_kf_kernels_through_the_extension_match_torch():
    """kf's calls launch through the extension and compute what torch does: the first
    call of a signature (the general path), later ones (the fast lane, its output from
    _empty_strided_cuda) and a program of two kernels with two outputs."""
    import kf

    assert kcuda._c_launch is _launcher.launch, kcuda.launcher()
    f = kf.jit(lambda x, y: x * y + 1)
    g = kf.jit(lambda x: (x + 1, x.sum(-1)))
    for _ in range(3):
        x, y = torch.randn(257, 129, device="cuda"), torch.randn(257, 129, device="cuda")
        out = f(x, y)
        torch.testing.assert_close(out, x * y + 1)
        assert out.stride() == (129, 1) and out.device == x.device
        a, s = g(x)
        torch.testing.assert_close(a, x + 1)
        torch.testing.assert_close(s, x.sum(-1), rtol=1e-5, atol=1e-4)
    lane = next(iter(f._fast.values()))
    from kf.runtime import programs

    # CompiledProgram.matched_call's fast lane: in C, unless KF_DISPATCH=python
    assert (type(lane) is programs._c_lane_type()) if programs._c_lane_type() else (lane.__name__ == "call")
    kernel = lane.program._launch.kernels[0][0]
    assert kernel._handles[x.get_device()] == int(kernel._bound[x.get_device()].function)


@gpu
@driver
@needs_ext
def test_bad_launch_through_the_extension_raises_cuda_error():
    """A block of 4096 threads (the limit is 1024): the launch fails at once and CudaError
    names the kernel, the call and the driver's error, from both launch paths."""
    import importlib.util

    from kf.passes import to_cuda

    # the kernel builders shared with the pass tests (as test_cuda.py loads them)
    spec = importlib.util.spec_from_file_location("kf_cuda_kernels", ROOT / "test/python/passes/test_to_cuda.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    text, entry, grid, _, shared = kernels.empty_kernel()
    ptx = to_cuda.compile_to_ptx(text, chip="sm_%d%d" % torch.cuda.get_device_capability())["kf_kernels"]
    k = kcuda.CudaKernel(kcuda.CudaModule(ptx), entry, grid, (4096, 1, 1), shared, args=1, validate=False)
    x = torch.zeros(1, device="cuda")
    with pytest.raises(kcuda.CudaError, match=rf"'{entry}'.*cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE.*block \(4096, 1, 1\)"):
        k(x)
    with pytest.raises(kcuda.CudaError, match=rf"'{entry}'.*cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        k.launch_pointers([x.data_ptr()], x.get_device())
    torch.cuda.synchronize()  # the failed launches left nothing behind


@gpu
@driver
def test_bindings_fallback_still_launches():
    """KF_CUDA_LAUNCHER=bindings (a process of its own: the choice is made at import)."""
    script = ("import torch, kf\nfrom kf.runtime import cuda as kcuda\n"
              "f = kf.jit(lambda x: x * 3 - 1)\n"
              "for _ in range(3):\n"
              "    x = torch.randn(1000, device='cuda'); torch.testing.assert_close(f(x), x * 3 - 1)\n"
              "print(kcuda.launcher())\n")
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, KF_CUDA_LAUNCHER="bindings"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("cuda.bindings (KF_CUDA_LAUNCHER=bindings)")
