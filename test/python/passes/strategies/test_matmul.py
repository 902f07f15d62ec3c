"""The matmul strategy (passes/strategies/matmul/): its plan, the SIMT GEMM on Vulkan and
CUDA, the mma.sync GEMM assembled by ptxas, and every GEMM kernel run on CUDA where a GPU
is, for each K loop."""

from __future__ import annotations

import json
import math

import pytest
import torch
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import NotApplicable, strategy_for
from strategy_kernels import (CUDA, HOPPER, SPIRV, TORCH, Built, cuda_report, cuda_run, emit_with, matmul_batched,
                     matmul_bias_gelu, needs_cuda, needs_ptxas, needs_vulkan, randn, spirv_run)


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
def test_matmul_bias_gelu_vulkan(elem):
    m, k, n = 257, 65, 129
    built = matmul_bias_gelu(m, k, n, elem)
    plan, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(11)
    a, b, bias = randn((m, k), elem, gen), randn((k, n), elem, gen), randn((n,), elem, gen)
    out, kernel = spirv_run(built, emitted, [a, b, bias], (m, n), elem)
    assert kernel.workgroup_bytes == plan["shared_bytes"]
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    tol = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
@pytest.mark.parametrize("elem,transpose_b", [("f32", False), ("f16", True), ("bf16", False)])
def test_matmul_batched_broadcast_vulkan(elem, transpose_b):
    built, (m, k, n, bshape) = matmul_batched(elem, transpose_b)
    _, emitted = built.emit(SPIRV)
    assert emitted.grid[2] == 6
    gen = torch.Generator().manual_seed(5)
    a, b, s = randn((2, 1, m, k), elem, gen), randn(bshape, elem, gen), torch.tensor(0.7).to(TORCH[elem])
    out, _ = spirv_run(built, emitted, [a, b, s], (2, 3, m, n), "f32")
    bb = b.float().transpose(-1, -2) if transpose_b else b.float()
    torch.testing.assert_close(out, (a.float() @ bb) * s.float(), rtol=1e-5, atol=1e-4)


@needs_vulkan
@pytest.mark.parametrize("m,k,n", [(5, 1, 7), (1, 33, 300)])
def test_matmul_degenerate_vulkan(m, k, n):
    """K = 1 and a single row, with a relu epilogue."""
    built = Built("matmul", [TensorSpec((m, k), "f32"), TensorSpec((k, n), "f32")],
                  lambda a, b: [kb.relu(kb.matmul(a, b))])
    _, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(m * n)
    a, b = randn((m, k), "f32", gen), randn((k, n), "f32", gen)
    out, _ = spirv_run(built, emitted, [a, b], (m, n), "f32")
    torch.testing.assert_close(out, torch.relu(a @ b), rtol=1e-5, atol=1e-5)


@needs_vulkan
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("m,k,n", [(64, 128, 128), (100, 64, 72)])
def test_batched_matmul_transposed_operands_vector_staging_vulkan(ta, tb, m, k, n):
    """matmul(a or a^T, b or b^T) over a batch with CUDA's 128-bit staging (f32 SIMT, as
    kf-fuse now folds operand transposes into the matmul kernel): the shapes of the
    GPT attention backward (dS^T @ Q and friends)."""
    ashape = (4, k, m) if ta else (4, m, k)
    bshape = (4, n, k) if tb else (4, k, n)

    def body(a, b):
        lhs = kb.transpose(a, perm=[0, 2, 1]) if ta else a
        rhs = kb.transpose(b, perm=[0, 2, 1]) if tb else b
        return [kb.matmul(lhs, rhs)]

    built = Built("matmul", [TensorSpec(ashape, "f32"), TensorSpec(bshape, "f32")], body)
    _, emitted = emit_with(built, SPIRV, vector_bytes=16)
    gen = torch.Generator().manual_seed(m + k + n)
    a, b = randn(ashape, "f32", gen), randn(bshape, "f32", gen)
    out, _ = spirv_run(built, emitted, [a, b], (4, m, n), "f32")
    want = (a.transpose(1, 2) if ta else a) @ (b.transpose(1, 2) if tb else b)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", [SPIRV, CUDA], ids=["spirv", "cuda"])
def test_matmul_plan(target):
    built = matmul_bias_gelu(257, 65, 129, "f16")
    with built.ctx:
        plan = strategy_for("matmul").plan(built.kernel.operation, target)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["shared_bytes"] <= target.max_shared_bytes and plan["threads"] <= target.max_threads
    assert plan["grid"] == [math.ceil(129 / plan["block_n"]), math.ceil(257 / plan["block_m"]), 1]
    assert plan["mma"] is (target is CUDA)  # f16 operands: tensor cores on CUDA only
    if plan["mma"]:  # a small problem: 64x64 tiles of 4 warps
        assert (plan["block_m"], plan["block_n"], plan["threads"]) == (64, 64, 128)


def test_matmul_not_applicable():
    two = Built("matmul", [TensorSpec((8, 8), "f32")] * 2, lambda a, b: [kb.matmul(kb.matmul(a, b), b)])
    with two.ctx, pytest.raises(NotApplicable, match="2 matmuls"):
        strategy_for("matmul").plan(two.kernel.operation, SPIRV)
    red = Built("matmul", [TensorSpec((8, 8), "f32")] * 2, lambda a, b: [kb.softmax(kb.matmul(a, b), dim=-1)])
    with red.ctx, pytest.raises(NotApplicable):
        strategy_for("matmul").plan(red.kernel.operation, SPIRV)


@needs_ptxas
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
def test_matmul_ptxas(elem):
    """f32: the SIMT GEMM (FFMA); f16/bf16: the mma.sync m16n8k16 GEMM."""
    built = matmul_bias_gelu(2048, 512, 1024, elem)
    plan, emitted = built.emit(CUDA)
    assert (plan["block_m"], plan["block_n"], plan["mma"]) == (128, 128, elem != "f32")
    ptx, r = cuda_report(built)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    # static shared memory (ptxas's figure) plus the dynamic window the launch gives
    assert r["shared_bytes"] + emitted.shared_bytes >= plan["shared_bytes"], (r, emitted)
    assert "bar.sync" in ptx
    if elem == "f32":
        assert "fma.rn.f32" in ptx and "mma.sync" not in ptx
    else:
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{elem}.{elem}.f32" in ptx
        # the default tensor-core plan is a 4-stage cp.async pipeline past 48 KiB
        assert plan["stages"] == 4 and plan["dynamic_shared"] and emitted.shared_bytes > 48 * 1024
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
        assert ".extern .shared .align 16 .b8 __dynamic_shmem__0[];" in ptx


#: The tensor-core GEMM's K loops, as variants of the matmul strategy: one staged tile
#: with register prefetch, the cp.async pipeline, and the pipeline with 64 x 64 warp tiles
#: (128 x 256 workgroup tiles on large outputs).
GEMM_LOOPS = {"prefetch": {"stages": 1}, "cp.async3-64x32": {"stages": 3, "warp_tiles": (4, 4)},
              "cp.async4-64x64": {"stages": 4, "warp_tiles": (4, 8)},
              "wgmma": {}, "wgmma3-n128": {"stages": 3, "max_block_n": 128}}


@pytest.fixture(params=list(GEMM_LOOPS))
def gemm_loop(request):
    """(target, variant) to plan with: sm_90 for the mma.sync loops, sm_90a (and a
    Hopper device) for wgmma."""
    from kf.passes.strategies.matmul import MatmulVariant

    variant = MatmulVariant(**GEMM_LOOPS[request.param])
    if request.param.startswith("wgmma"):
        if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("wgmma needs an sm_90 device")
        return HOPPER, variant
    return CUDA, variant


@needs_cuda
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m,k,n", [(257, 65, 129), (2048, 512, 1024), (200, 64, 72), (1000, 336, 776),
                                   (2000, 200, 2296)])
def test_matmul_bias_gelu_cuda(elem, m, k, n, gemm_loop):
    """Sizes off the tile grid in every dim, K tails inside the pipeline (336, 200), rows
    that are not whole 16-byte pieces (K 65: no cp.async) and a grid big enough for the
    large plans (2000 x 2296)."""
    built = matmul_bias_gelu(m, k, n, elem)
    plan, emitted = built.emit(*gemm_loop)
    assert plan.get("wgmma", False) == (gemm_loop[0] is HOPPER and elem != "f32" and k % 8 == 0 and n % 8 == 0)
    gen = torch.Generator().manual_seed(m + k)
    a, b, bias = randn((m, k), elem, gen), randn((k, n), elem, gen), randn((n,), elem, gen)
    out, _ = cuda_run(built, plan, emitted, [a, b, bias], (m, n), elem)
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    tol = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_cuda
@pytest.mark.parametrize("mkn", [(100, 70, 50), (100, 72, 56)])  # rows of 16-byte pieces or not
@pytest.mark.parametrize("elem,transpose_b", [("f32", False), ("f16", True), ("bf16", False)])
def test_matmul_batched_broadcast_cuda(elem, transpose_b, mkn, gemm_loop):
    built, (m, k, n, bshape) = matmul_batched(elem, transpose_b, mkn)
    plan, emitted = built.emit(*gemm_loop)
    gen = torch.Generator().manual_seed(9)
    a, b, s = randn((2, 1, m, k), elem, gen), randn(bshape, elem, gen), torch.tensor(0.7).to(TORCH[elem])
    out, _ = cuda_run(built, plan, emitted, [a, b, s], (2, 3, m, n), "f32")
    bb = b.float().transpose(-1, -2) if transpose_b else b.float()
    torch.testing.assert_close(out, (a.float() @ bb) * s.float(), rtol=1e-4, atol=1e-4)
