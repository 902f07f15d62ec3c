"""The passes' tests share the kf-map-to-gpu harness (``gpu_harness.py``), importable
from every test module below this directory, and its ``run`` fixture: one back end per
parameter."""

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
