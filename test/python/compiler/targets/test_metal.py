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


def test_run_time_sizes_reach_the_msl():
    """Metal takes run-time sizes as Vulkan does (the same SPIR-V): a dynamic dim's
    program has every buffer at the planned bound and its size slots as a last buffer of
    uints, which runtime/metal.py binds from the call's shapes."""
    import re

    def layer_norm(x, w, b):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)

    f = kf.jit(layer_norm, target="metal", dynamic={"x": [1]})
    stages = kf.inspect(f, torch.randn(2, 77, 256), torch.randn(256), torch.randn(256)).stages
    assert "?x256" in stages["linalg"], stages["linalg"][:400]
    (params,) = re.findall(r"^kernel void \w+\((.*)\)$", stages["msl"], re.M)
    buffers = re.findall(r"device (\w+)& \w+ \[\[buffer\((\d+)\)\]\]", params)
    assert [int(i) for _, i in buffers] == list(range(len(buffers))) and len(buffers) == 5, params
    slots = re.search(r"struct %s\s*\{\s*uint _m0\[(\d+)\];" % buffers[-1][0], stages["msl"])
    assert slots is not None, stages["msl"][:2000]
    static = kf.inspect(kf.jit(layer_norm, target="metal"), torch.randn(2, 77, 256), torch.randn(256),
                        torch.randn(256)).stages["msl"]
    assert len(re.findall(r"\[\[buffer\(\d+\)\]\]", static)) == 4
