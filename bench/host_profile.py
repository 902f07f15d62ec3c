"""Where the host time of one kf call goes on CUDA: a kf function of a tiny tensor
called many times, its pieces timed alone, the same loop under cProfile, beside a bare
cuLaunchKernel of the same kernel (what bench/bench.py's host-overhead row measures).

    python3 bench/host_profile.py [--calls 20000] [--no-compare]
    KF_CUDA_LAUNCHER=bindings python3 bench/host_profile.py   # launches through cuda.bindings
    KF_DISPATCH=python python3 bench/host_profile.py          # the call path in Python

Prints which launcher kf's CUDA launches go through (the compiled kf.runtime._launcher
or cuda.bindings, runtime/cuda.py) and which dispatch its calls take (kf.runtime._launcher's
C dispatch and lane, or Python: compiler/api.py), the per-call wall time, each piece of
the call timed on its own, and the functions with the most time of their own under
cProfile (the C dispatch is one entry there). Unless --no-compare, the whole call is
timed again in a child process with KF_DISPATCH=python: the Python call path against
the C one, on the same machine and kernel.

The pieces with the C dispatch: api._is_compiling (the one check left in Python: Dynamo
folds it) and kf.runtime._launcher.dispatch (needs_op's and autocast's checks, the key,
the lookup and the lane: outputs, launch); of the latter, key() alone and the lane alone.
With the Python dispatch: torch_ops.needs_op, api._fast_key, the lookup and the lane.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

import torch

import kf


def _per_call(fn, n: int) -> float:
    """us per call of fn(), best of three loops of n, the GPU drained after each."""
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--no-compare", action="store_true", help="skip the KF_DISPATCH=python child")
    ap.add_argument("--call-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from kf import api, torch_ops
    from kf.runtime import cuda as kf_cuda

    f = kf.jit(lambda x: x + 1)
    x = torch.randn(16, device="cuda")
    f(x)
    torch.cuda.synchronize()
    n = args.calls
    if args.call_only:
        print(f"{_per_call(lambda: f(x), n):.3f}")
        return 0

    print(f"launcher: {kf_cuda.launcher()}")
    print(f"dispatch: {api.DISPATCH}")
    call = _per_call(lambda: f(x), n)
    print(f"kf call: {call:.2f} us wall")

    key, tensors = api._fast_key((x,))
    table, xs = f._fast, (x,)
    lane = table[key]
    print(f"lane: {type(lane).__module__}.{type(lane).__qualname__}")
    pieces = []
    if api._c_dispatch is not None:
        from kf.runtime import _launcher

        dispatch = api._c_dispatch
        pieces += [("api._is_compiling()", api._is_compiling),
                   ("_launcher.dispatch: checks, key, lookup, lane", lambda: dispatch(table, xs, 3)),
                   ("  _launcher.key alone", lambda: _launcher.key(xs)),
                   ("  the lane alone (outputs, launch)", lambda: lane(tensors))]
    else:
        pieces += [("torch_ops.needs_op", lambda: torch_ops.needs_op(xs, {})),
                   ("api._any_autocast", api._any_autocast),
                   ("api._fast_key", lambda: api._fast_key(xs)),
                   ("the table lookup", lambda: table.get(key)),
                   ("the lane (outputs, launch)", lambda: lane(tensors))]
    pieces.append(("torch.empty(16, device='cuda')", lambda: torch.empty(16, device="cuda")))
    # the allocation the fast lane makes (runtime/programs.py, CudaProgram.fast_lane / c_lane)
    alloc = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
    if alloc is not None:
        pieces.append(("_empty_strided_cuda((16,), (1,), float32)", lambda: alloc((16,), (1,), torch.float32)))
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        pieces.append(("torch._C._cuda_getCurrentRawStream(0)", lambda: raw(0)))
    # a bare launch of the same kernel through the compiled launcher, prebuilt arguments
    program = getattr(lane, "program", None)
    kernel = program._launch.kernels[0][0] if program is not None else None
    if kf_cuda._c_launch is not None and kernel is not None:
        handle, launch = kernel._handles[x.get_device()], kf_cuda._c_launch
        (g0, g1, g2), (b0, b1, b2), shared = kernel.grid, kernel.block, kernel.shared_bytes
        stream, out = torch.cuda.current_stream().cuda_stream, torch.empty_like(x)
        p0, p1 = x.data_ptr(), out.data_ptr()
        pieces.append(("bare _launcher.launch of the kernel", lambda: launch(handle, g0, g1, g2, b0, b1, b2, shared,
                                                                               stream, p0, p1)))
    print(f"{'us/call':>8}  piece (timed alone)")
    for name, piece in pieces:
        print(f"{_per_call(piece, n):8.3f}  {name}")

    def loop():
        for _ in range(n):
            f(x)
        torch.cuda.synchronize()

    prof = cProfile.Profile()
    prof.enable()
    loop()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
    print("under cProfile (which inflates Python frames):")
    print(f"{'own us/call':>12} {'cum us/call':>12} {'calls/call':>10}  function")
    for (file, line, name), (cc, nc, tt, ct, _) in rows:
        print(f"{tt / n * 1e6:12.2f} {ct / n * 1e6:12.2f} {nc / n:10.1f}  {name} ({file.split('/')[-1]}:{line})")

    if not args.no_compare and api._c_dispatch is not None:
        env = dict(os.environ, KF_DISPATCH="python")
        r = subprocess.run([sys.executable, __file__, "--call-only", "--calls", str(n)], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode == 0:
            before = float(r.stdout.split()[-1])
            print(f"kf call with KF_DISPATCH=python (child process): {before:.2f} us wall; "
                  f"with the C dispatch (above): {call:.2f} us")
        else:
            print(f"KF_DISPATCH=python child failed: {r.stderr.strip().splitlines()[-1:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
