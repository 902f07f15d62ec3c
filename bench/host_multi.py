"""Host time a call of a program of several kernels: the fast lane (C, or Python with
KF_DISPATCH=python) against the general path (CompiledProgram.call_matched, which a
program with constants or aliased outputs takes).

    python3 bench/host_multi.py && KF_DISPATCH=python python3 bench/host_multi.py

``x / x.abs().amax()`` on a small tensor is three kernels (the amax's two stages, the
division) over two temporaries; the GPU work is a few microseconds, so 250 calls back
to back measure the host's time a call (the median of 15 repetitions).
"""

from __future__ import annotations

import os

import torch
from bench import host_us  # (bench/ is the script's folder)

import kf


def main() -> None:
    f = kf.jit(lambda x: x / x.abs().amax())
    x = torch.randn(64, 4096, device="cuda")
    torch.testing.assert_close(f(x), x / x.abs().amax())
    lane = next(iter(f._fast.values()))
    print(os.environ.get("KF_DISPATCH", "auto"), type(lane).__name__, "kernels", len(lane.program._launch.kernels))
    print("  lane call us %.2f" % host_us(lambda: f(x), n=250, repeats=15))
    print("  general path us %.2f" % host_us(lambda: lane.program.call_matched([x]), n=250, repeats=15))


if __name__ == "__main__":
    main()
