"""The kf demo: the seed's layer norm and attention, compiled by kf for the best target
this machine has, checked against torch eager and timed beside it.

    scripts/demo.sh            # or: python examples/demo.py [--target cpu|vulkan|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seed_examples import fused_attention, metal_layer_norm  # noqa: E402  (the seed's code, unchanged)


def best_target() -> tuple[str, str]:
    """The fastest real target here and why: CUDA, then Metal, then a Vulkan device that
    is a GPU, then kf's CPU target (kf.backend.best_target, which torch.compile's
    backend="kf" uses too, says why a CPU Vulkan device is not chosen)."""
    from kf.backend import best_target as for_device

    if torch.cuda.is_available():
        return for_device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return for_device("mps")
    return for_device("cpu")


def timed(fn, *args, repeat: int = 20) -> float:
    """Median seconds per call (synchronizing the device around each call)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn(*args)
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=["auto", "cpu", "vulkan", "cuda", "metal"], default="auto")
    args = ap.parse_args()
    target, why = best_target() if args.target == "auto" else (args.target, "chosen with --target")
    device = {"cuda": "cuda", "metal": "mps"}.get(target, "cpu")
    print(f"kf demo on target '{target}': {why} (tensors on {device})")

    layer_norm = metal_layer_norm.with_options(target=target)
    attention = fused_attention.with_options(target=target)
    gen = torch.Generator(device="cpu").manual_seed(int(time.time()))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    x, w, b = randn(1, 256, 1024), randn(1024), randn(1024)
    q, k, v = randn(2, 8, 256, 64), randn(2, 8, 256, 64), randn(2, 8, 256, 64)
    mask = (torch.rand(256, 256, generator=gen) > 0.1).float().to(device)
    rows = [
        ("layer norm 1x256x1024", layer_norm, metal_layer_norm.fn, (x, w, b)),
        ("attention 2x8x256x64", attention, fused_attention.fn, (q, k, v)),
        ("attention + mask", attention, fused_attention.fn, (q, k, v, mask)),
    ]
    print(f"{'function':<24}{'max |kf - torch|':>18}{'first call (s)':>16}{'kf (ms)':>10}{'torch (ms)':>12}")
    for name, kf_fn, eager, inputs in rows:
        start = time.perf_counter()
        out = kf_fn(*inputs)
        first = time.perf_counter() - start
        ref = eager(*inputs)
        err = (out.float() - ref.float()).abs().max().item()
        print(f"{name:<24}{err:>18.3e}{first:>16.2f}{timed(kf_fn, *inputs) * 1e3:>10.3f}"
              f"{timed(eager, *inputs) * 1e3:>12.3f}")
    print("the first call compiles (or loads from the disk cache, KF_CACHE_DIR); later calls launch directly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
