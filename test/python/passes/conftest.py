"""The passes' tests share the kf-map-to-gpu harness (``gpu_harness.py``), importable
from every test module below this directory, and its ``run`` fixture: one back end per
parameter; ``kf_run`` runs a whole function through kf.jit on one GPU target."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gpu_harness import has_cuda, run_cuda, run_vulkan  # noqa: E402  (the path above)
from kf.runtime import vulkan  # noqa: E402


@pytest.fixture(params=["vulkan", "cuda"])
def run(request):
    """The runner of one back end: SPIR-V on Vulkan (lavapipe here), PTX on a CUDA GPU."""
    if request.param == "vulkan":
        if not vulkan.is_available():
            pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")
        return run_vulkan
    if not has_cuda():
        pytest.skip("no CUDA device (or cuda-python missing)")
    return run_cuda


@pytest.fixture(params=["vulkan", "cuda"])
def kf_run(request, tmp_path, monkeypatch):
    """A function compiled by kf.jit for one GPU target (vulkan: lavapipe here; cuda on a
    CUDA GPU) and called on that target's device, with a fresh kf cache; results on the
    CPU."""
    import torch

    import kf

    target = request.param
    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")
    if target == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    device = "cuda" if target == "cuda" else "cpu"

    def call(fn, *args):
        out = kf.jit(fn, target=target)(*[a.to(device) for a in args])
        return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()

    return call
