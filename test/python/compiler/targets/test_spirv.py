"""The Vulkan target (compiler/targets/spirv.py): the device's limits as its arch and
cache key, the limits the strategies see, and its stage table; run on lavapipe."""

import pytest
import torch

import kf
from kf import targets
from kf.options import Options


def test_attributes():
    t = targets.get("vulkan")
    assert t is targets.VULKAN and t.is_gpu and t.uses_spirv and not t.fp8_storage
    assert t.torch_device == "cpu" and t.strategy_target == "spirv"
    assert list(t.stages()) == ["capture", "precision", "kernels", "schedule", "spirv", "constants", "package"]


def test_fp8_is_carried_in_f32():
    assert targets.VULKAN.precision_passes(Options(target="vulkan", precision="fp8")) == [
        "kf-apply-precision{precision=fp8 fp8-storage=false}", "kf-canonicalize"]


def test_vulkan_key_and_passes_name_the_devices_limits(recorded_device):
    """A Vulkan program is tiled for its device's limits: they are the target's arch (the
    driver reads them from the device, or ``arch`` gives them), part of the cache key and
    the limits option of kf-tile and kf-map-to-gpu, so devices of other limits never
    share a program. Metal (no device to ask) and a machine without Vulkan take the
    defaults."""
    from kf.runtime import vulkan
    from kf.runtime.abi import DeviceLimits

    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe")).spec()
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200")).spec()
    keys = {targets.VULKAN.device_key(Options(target="vulkan", arch=spec)) for spec in (lvp, nv)}
    assert len(keys) == 2 and all(nv in k or lvp in k for k in keys)
    own = targets.VULKAN.arch(Options(target="vulkan"))
    assert own == (vulkan.device().target_limits().spec() if vulkan.is_available() else "")
    assert targets.METAL.arch(Options(target="metal")) == ""
    assert targets.METAL.arch(Options(target="metal", arch=nv)) == nv
    passes = targets.VULKAN.passes(nv)
    assert f"kf-tile{{target=spirv limits={nv}}}" in passes
    assert f"kf-map-to-gpu{{target=spirv limits={nv}}}" in passes
    assert "kf-tile{target=spirv}" in targets.METAL.passes("")
    with pytest.raises(ValueError, match="device limits"):
        targets.VULKAN.arch(Options(target="vulkan", arch="sm_90"))


def test_runs_through_the_stage_table():
    """A softmax of 257 rows of odd length compiled through the table runs on the Vulkan
    device as torch computes it."""
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device")
    x = torch.randn(257, 129)
    f = kf.jit(lambda t: torch.softmax(t, -1), target="vulkan")
    torch.testing.assert_close(f(x), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)


def test_a_matmul_for_nvidias_limits_takes_cooperative_matrices(recorded_device):
    """An f16 matmul compiled through the whole pipeline for NVIDIA's recorded limits is
    the cooperative-matrix kernel; a device without the feature (lavapipe) refuses it,
    naming it, instead of running it."""
    from kf.runtime import vulkan
    from kf.runtime.abi import DeviceLimits

    if not vulkan.is_available() or vulkan.device().features.get("cooperativeMatrix"):
        pytest.skip("needs a Vulkan device without cooperative matrices")
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200")).spec()
    f = kf.jit(lambda a, b, bias: torch.nn.functional.gelu(a @ b + bias), target="vulkan", arch=nv)
    a, b, bias = torch.randn(100, 70).half(), torch.randn(70, 50).half(), torch.randn(50).half()
    with pytest.raises(vulkan.VulkanError, match=r"CooperativeMatrixKHR \(needs cooperativeMatrix\)"):
        f(a, b, bias)
