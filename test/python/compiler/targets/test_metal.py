"""The Metal target (compiler/targets/metal.py): the Vulkan target's SPIR-V and then
MSL, written and read here without a Mac."""

import torch

import kf
from kf import targets


def test_attributes():
    t = targets.get("metal")
    assert t is targets.METAL and t.is_gpu and t.uses_spirv and t.torch_device == "mps"
    assert list(t.stages()) == ["capture", "precision", "kernels", "schedule", "msl", "constants", "package"]


def test_msl_through_the_stage_table():
    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    stages = kf.inspect(kf.jit(f, target="metal"), torch.randn(13, 257), torch.randn(257)).stages
    assert "kernel void" in stages["msl"] and "spirv" in stages, list(stages)
