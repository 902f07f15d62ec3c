"""Host time a call of a program of several kernels: the fast lane (C, or Python with
KF_DISPATCH=python) against the general path it replaced (CompiledProgram.call_matched).

    source .device/prelude.sh && python3 bench/host_multi.py && KF_DISPATCH=python python3 bench/host_multi.py

``x / x.abs().amax()`` on a small tensor is three kernels (the amax's two stages, the
division) over two temporaries; the GPU work is a few microseconds, so 250 calls back
to back measure the host's time a call (the median of 15 repetitions).
"""

from __future__ import annotations

import os
import time

import torch

import kf


def host_us(fn, n: int = 250, reps: int = 15) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    f = kf.jit(lambda x: x / x.abs().amax())
    x = torch.randn(64, 4096, device="cuda")
    torch.testing.assert_close(f(x), x / x.abs().amax())
    lane = next(iter(f._fast.values()))
    print(os.environ.get("KF_DISPATCH", "auto"), type(lane).__name__, "kernels", len(lane.program._launch.kernels))
    print("  lane call us %.2f" % host_us(lambda: f(x)))
    print("  general path us %.2f" % host_us(lambda: lane.program.call_matched([x])))


if __name__ == "__main__":
    main()
