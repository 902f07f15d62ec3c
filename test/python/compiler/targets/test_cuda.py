"""The CUDA target (compiler/targets/cuda.py): its device queries, the pass options
the strategies see, its precision passes and its stage table. No GPU is needed: without
one the target builds for the H200 (sm_90a, 132 multiprocessors)."""

import pytest
import torch

from kf import targets
from kf.options import Options
from kf.runtime.abi import DEFAULT_MULTIPROCESSORS


def test_attributes():
    t = targets.get("cuda")
    assert t is targets.CUDA and t.is_gpu and not t.uses_spirv and t.fp8_storage
    assert t.torch_device == "cuda" and t.strategy_target == "cuda"


def test_stage_table():
    assert list(targets.CUDA.stages()) == ["capture", "precision", "kernels", "schedule", "ptx", "constants",
                                          "package"]


def test_key_and_passes_name_the_devices_multiprocessors(monkeypatch):
    """Persistent kernels start one workgroup a multiprocessor: the count is a pass
    option of kf-tile and kf-map-to-gpu and part of the cache key, so a cubin built for
    an H200 (132) is not reused on a GPU of another count. Without a GPU, 132."""
    opts = Options(target="cuda")
    if not torch.cuda.is_available():
        assert targets.CUDA.multiprocessors() == DEFAULT_MULTIPROCESSORS == 132
        assert targets.CUDA.arch(opts) == "sm_90a"
    assert targets.VULKAN.multiprocessors() == 0 and targets.CPU.multiprocessors() == 0
    monkeypatch.setattr(targets.CUDA, "multiprocessors", lambda: 114)
    assert targets.CUDA.device_key(opts).endswith(" 114")
    passes = targets.CUDA.passes("sm_90a")
    assert "kf-tile{target=cuda chip=sm_90a multiprocessors=114}" in passes, passes
    assert "kf-map-to-gpu{target=cuda chip=sm_90a multiprocessors=114}" in passes, passes
    key_114 = targets.CUDA.device_key(opts)
    monkeypatch.setattr(targets.CUDA, "multiprocessors", lambda: 132)
    assert targets.CUDA.device_key(opts) != key_114


@pytest.mark.parametrize("arch, attention", [("sm_90a", "kernel"), ("sm_80", "none")])
def test_fp8_precision_passes(arch, attention):
    """fp8 operands stay fp8 on CUDA; attention is quantized only where the sm_90a fp8
    attention kernel takes it."""
    passes = targets.CUDA.precision_passes(Options(target="cuda", arch=arch, precision="fp8"))
    assert passes == [f"kf-apply-precision{{precision=fp8 fp8-attention={attention}}}", "kf-canonicalize"]
    assert targets.CUDA.precision_passes(Options(target="cuda", arch=arch)) == []


def test_ptx_through_the_stage_table():
    """A function compiled for CUDA (without a GPU: PTX assembled by ptxas for sm_90a)
    records the stages of the table, the PTX last."""
    import kf

    def f(x, b):
        return torch.nn.functional.gelu(x + b)

    stages = kf.inspect(kf.jit(f, target="cuda", arch="sm_90a"), torch.randn(257, 33), torch.randn(33)).stages
    assert list(stages) == ["kf", "linalg", "fused", "gpu", "ptx"], list(stages)
    assert ".target sm_90a" in stages["ptx"] and ".entry" in stages["ptx"]
