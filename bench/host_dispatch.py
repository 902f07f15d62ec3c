"""The host work of a small kf CUDA call around the driver, measured without a GPU.

    python3 bench/host_dispatch.py [--calls 200000]

A kf function of one 16-element tensor whose dispatch table holds a real CudaProgram's
lane (one kernel, x + 1's buffers), called the ordinary way (``f(x)``), with two stand-ins
that exist only in this script: a libcuda.so.1 whose cuLaunchKernel returns at once
(compiled here, loaded in a child process through LD_LIBRARY_PATH, as
test/python/runtime/test_launcher.py does) and CPU tensors in place of CUDA ones (the
lane's device is then -1, its outputs come from ``_empty_strided_cpu``, the current
device and the raw stream from C builtins of the same shape as torch's). What remains is
kf's own per-call work: the checks, the dispatch key, the table lookup, the lane, the
allocation and the launcher's argument handling. Run twice, in child processes: with
``KF_DISPATCH=python`` (all of it in Python) and with the default (the C dispatch and the C lane). Prints per-call
microseconds of the whole call and of its pieces, minimum over repeats (this measures
the host's Python, so a quiet machine matters more than the count).

On the GPU machine, bench/host_profile.py measures the real thing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import timeit

_FAKE_DRIVER = r"""
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    return 0;
}
"""


def _per_call(stmt: str, g: dict, n: int, repeat: int = 9) -> float:
    return min(timeit.repeat(stmt, globals=g, number=n, repeat=repeat)) / n * 1e6


def setup() -> dict:
    """The call, its pieces and the stand-ins, as timeit globals (this process: run it
    where the stand-in libcuda.so.1 is the one that loads)."""
    global _TENSOR
    import torch

    _TENSOR = torch.randn(16)

    import kf
    from kf import api, torch_ops
    from kf.programs import CompiledProgram
    from kf.runtime import _launcher
    from kf.runtime import cuda as kcuda
    from kf.runtime import programs
    from kf.runtime.abi import KernelABI, ProgramABI, TensorArg

    cpu_alloc = torch._C._dynamo.guards._empty_strided_cpu
    # the stand-ins (this process only): CPU tensors' device index is -1
    programs._output_allocator = lambda: (cpu_alloc, (-1).__int__)
    kcuda._raw_stream_getter = lambda: abs  # a C builtin of one int, as _cuda_getCurrentRawStream
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as fh:
            fh.write("// never read: the stand-in driver launches nothing\n")
        kernel = KernelABI("add_one", (0, 1), (1, 1, 1), (32, 1, 1), 0, "k.ptx")
        abi = ProgramABI("cuda", (TensorArg("x", (16,), "f32"),), (TensorArg("0", (16,), "f32"),), (), (kernel,),
                         (-1,))
        prog = programs.CudaProgram(abi, d, {})
    k = prog.kernels[0][0]
    k._bound[-1], k._handles[-1] = kcuda._Bound(None, 0xF00), 0xF00  # what _bind records
    k._raw_stream = kcuda._raw_stream_getter()
    compiled = CompiledProgram(prog, ("tensor", 0), {}, d)

    f = kf.jit(lambda x: x + 1)
    x = torch.randn(16)
    key, tensors = api._fast_key((x,))
    lane = f._fast[key] = compiled.matched_call(True)
    out = f(x)
    assert out.shape == (16,) and out.dtype == torch.float32 and out.data_ptr() != x.data_ptr()
    # The same lane behind the guards of a function that reads a module's function and a
    # global scalar (3 checks: the globals' torch, torch.relu, SCALE), and the guards of
    # one that reads a global tensor (read afresh at every call).
    from kf import guards

    reads = guards.walk(_reads_globals)
    guarded = kf.jit(_reads_globals)
    guarded._fast[key] = reads.guarded(lane, [])
    assert guarded(x).shape == (16,)
    tensor_reads = guards.walk(_reads_a_tensor)
    tensor_guards = tensor_reads.guarded(lambda ts: None, [0])
    assert tensor_guards.check()[0] is _TENSOR
    args = (x,)
    g = dict(f=f, x=x, args=args, kw={}, key=key, tensors=tensors, lane=lane, table=f._fast, api=api,
             torch_ops=torch_ops, alloc=cpu_alloc, launch=_launcher.launch, c_dispatch=api._c_dispatch,
             fn=0xF00, p=x.data_ptr(), torch=torch, c_key=getattr(_launcher, "key", None), guarded=guarded,
             tensor_guards=tensor_guards)
    return g


SCALE = 2.0
_TENSOR = None


def _reads_globals(x):
    import torch

    return torch.relu(x) * SCALE


def _reads_a_tensor(x):
    return x + _TENSOR


def child(n: int) -> None:
    from kf import api

    g = setup()
    lane = g["lane"]
    rows = [("f(x): the whole call", "f(x)")]
    if api._c_dispatch is None:
        rows += [("torch_ops.needs_op", "torch_ops.needs_op(args, kw)"),
                 ("api._any_autocast", "api._any_autocast()"),
                 ("api._fast_key", "api._fast_key(args)"),
                 ("table lookup", "table.get(key)"),
                 ("the lane (Python: matched_call's call + fast_lane's call)", "lane(tensors)")]
    else:
        rows += [("api._is_compiling", "api._is_compiling()"),
                 ("_launcher.dispatch (checks, key, lookup, C lane)", "c_dispatch(table, args, 3)"),
                 ("_launcher.key", "c_key(args)"),
                 ("the lane (C)", "lane(tensors)")]
    rows += [("g(x): the same lane behind 3 guards (torch, torch.relu, a global float)", "guarded(x)"),
             ("  the guards of a function reading a global tensor (check())", "tensor_guards.check()"),
             ("  of which the allocation (_empty_strided_cpu)", "alloc((16,), (1,), torch.float32)"),
             ("  of which the launch call (stand-in driver)", "launch(fn, 1, 1, 1, 32, 1, 1, 0, 0, p, p)")]
    print(f"dispatch: {api.DISPATCH}; lane: {type(lane).__name__}")
    for name, stmt in rows:
        print(f"{_per_call(stmt, g, n):8.3f} us  {name}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.calls)
        return 0
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        print(f"no C compiler ({cc}) for the stand-in driver")
        return 1
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "fake.c"), "w") as fh:
            fh.write(_FAKE_DRIVER)
        subprocess.run([*cc.split(), "-shared", "-fPIC", "-O2", "-o", os.path.join(d, "libcuda.so.1"),
                        os.path.join(d, "fake.c")], check=True)
        for dispatch in ("python", "auto"):
            env = dict(os.environ, LD_LIBRARY_PATH=f"{d}:{os.environ.get('LD_LIBRARY_PATH', '')}",
                       KF_DISPATCH=dispatch)
            env.pop("KF_CUDA_LAUNCHER", None)
            r = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls)], env=env,
                               capture_output=True, text=True)
            print(f"== KF_DISPATCH={dispatch}")
            print(r.stdout + r.stderr, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
