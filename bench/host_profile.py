"""Where the host time of one kf call goes on CUDA: a kf function of a tiny tensor
called many times under cProfile, and the same loop timed without it, beside a bare
cuLaunchKernel of the same kernel (what bench/bench.py's host-overhead row measures).

    source .device/prelude.sh && python3 bench/host_profile.py [--calls 20000]
    KF_CUDA_LAUNCHER=bindings python3 bench/host_profile.py   # the same through cuda.bindings

Prints which launcher kf's CUDA launches go through (the compiled kf.runtime._launcher
or cuda.bindings, runtime/cuda.py), the per-call wall time and the functions with the
most time of their own, per call, so that a change to the call path can be judged by
what it removes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import kf


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    from kf.runtime import cuda as kf_cuda

    print(f"launcher: {kf_cuda.launcher()}")
    f = kf.jit(lambda x: x + 1)
    x = torch.randn(16, device="cuda")
    f(x)
    torch.cuda.synchronize()
    n = args.calls

    def loop():
        for _ in range(n):
            f(x)
        torch.cuda.synchronize()

    t = time.perf_counter()
    loop()
    print(f"kf call: {(time.perf_counter() - t) / n * 1e6:.2f} us wall")
    t = time.perf_counter()
    for _ in range(n):
        torch.empty(16, device="cuda")
    print(f"torch.empty(16, device='cuda'): {(time.perf_counter() - t) / n * 1e6:.2f} us")
    # the allocation the fast lane makes (runtime/programs.py, CudaProgram.fast_lane)
    alloc = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
    if alloc is not None:
        t = time.perf_counter()
        for _ in range(n):
            alloc((16,), (1,), torch.float32)
        print(f"_empty_strided_cuda((16,), (1,), float32): {(time.perf_counter() - t) / n * 1e6:.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    loop()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
    print(f"{'own us/call':>12} {'cum us/call':>12} {'calls/call':>10}  function")
    for (file, line, name), (cc, nc, tt, ct, _) in rows:
        print(f"{tt / n * 1e6:12.2f} {ct / n * 1e6:12.2f} {nc / n:10.1f}  {name} ({file.split('/')[-1]}:{line})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
