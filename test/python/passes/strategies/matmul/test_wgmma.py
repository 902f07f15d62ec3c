"""The matmul strategy's wgmma GEMM (passes/strategies/matmul/wgmma.py): where it
applies, and its PTX."""

from __future__ import annotations

import pytest
import torch
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import strategy_for
from mlir import ir
from strategy_kernels import (CUDA, HOPPER, Built, cuda_report, cuda_run, matmul_bias_gelu, matmul_nt, needs_cuda, needs_ptxas,
                     randn)


def matmul_tn(m, k, n, elem, tb=False):
    """a^T @ b (or a^T @ b^T) with a stored [k, m]: a weight's gradient x^T @ dy."""
    bshape = (n, k) if tb else (k, n)
    return Built("matmul", [TensorSpec((k, m), elem), TensorSpec(bshape, elem)],
                 lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), kb.transpose(b, perm=[1, 0]) if tb else b)])


@needs_ptxas
@pytest.mark.parametrize("tb", [False, True], ids=["tn", "tt"])
def test_matmul_wgmma_transposed_a_ptxas(tb):
    """A stored k-by-m: staged MN-major and read with imm-trans-a = 1, B either way; no
    spills, the wgmmas not serialized."""
    built = matmul_tn(4096, 8192, 4096, "bf16", tb)  # 32 x 32 tiles of 128
    plan, _ = built.emit(HOPPER)
    assert plan["wgmma"] and not plan["a_k_major"] and plan["b_k_major"] == tb, plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    mma = next(ln for ln in ptx.splitlines() if ln.startswith("wgmma.mma_async"))
    assert mma.replace(" ", "").endswith(f"p,1,1,1,{int(not tb)};"), mma
    assert "serialized" not in log


@needs_cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma needs an sm_90 GPU")
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (True, True), (False, True)],
                         ids=["nn", "tn", "tt", "nt"])
@pytest.mark.parametrize("m,k,n", [(256, 512, 384), (200, 136, 264), (4096, 2048, 2048), (4000, 1000, 4104)])
def test_matmul_wgmma_layouts_cuda(ta, tb, m, k, n):
    """Every operand layout of the GEMM against torch on the GPU (bf16, f32
    accumulation): ragged tiles, and weight gradients' shapes (a transposed A takes
    wgmma where the output has a wave of 128 x 128 tiles, mma.sync elsewhere)."""
    ashape, bshape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))

    def body(a, b):
        return [kb.matmul(kb.transpose(a, perm=[1, 0]) if ta else a, kb.transpose(b, perm=[1, 0]) if tb else b)]

    built = Built("matmul", [TensorSpec(ashape, "bf16"), TensorSpec(bshape, "bf16")], body)
    plan, emitted = built.emit(HOPPER)
    assert plan.get("wgmma", False) == (not ta or m * n >= 128 * 128 * 128), plan
    gen = torch.Generator().manual_seed(m + k + n)
    a, b = randn(ashape, "bf16", gen).cuda(), randn(bshape, "bf16", gen).cuda()
    out, _ = cuda_run(built, plan, emitted, [a, b], (m, n), "bf16")
    want = ((a.t() if ta else a).float() @ (b.t() if tb else b).float())
    torch.testing.assert_close(out.float().cpu(), want.cpu(), rtol=2e-2, atol=2e-2 * k ** 0.5)


@needs_ptxas
@pytest.mark.parametrize("layout,elem", [("nn", "bf16"), ("nt", "bf16"), ("nn", "f16"), ("nt", "f8E4M3FN"),
                                         ("nt", "f8E5M2")])
def test_matmul_wgmma_ptxas(layout, elem):
    """On sm_90a the GEMM is wgmma: m64n256 (k16, k32 for fp8) from 128-byte swizzled
    tiles, B transposed by the instruction when it lies k-by-n, a cp.async pipeline whose
    copies are fenced for the async proxy; ptxas neither spills nor serializes the wgmmas."""
    built = matmul_bias_gelu(8192, 4096, 8192, elem) if layout == "nn" else matmul_nt(8192, 4096, 8192, elem)
    plan, emitted = built.emit(HOPPER)
    assert plan["wgmma"] and (plan["block_m"], plan["block_n"], plan["threads"]) == (128, 256, 256)
    assert plan["block_k"] * (1 if elem.startswith("f8") else 2) == 128 and plan["b_k_major"] == (layout == "nt")
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    ptx_t = {"f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}.get(elem, elem)
    k = 32 if elem.startswith("f8") else 16
    inst = [ln.split()[0] for ln in ptx.splitlines() if ln.startswith("wgmma.mma_async")]
    assert inst and set(inst) == {f"wgmma.mma_async.sync.aligned.m64n256k{k}.f32.{ptx_t}.{ptx_t}"}
    # the immediates after the descriptors: scale-d predicate, scale-a, scale-b, trans-a, trans-b
    mma = next(ln for ln in ptx.splitlines() if ln.startswith("wgmma.mma_async"))
    tail = "p,1,1;" if elem.startswith("f8") else f"p,1,1,0,{int(layout == 'nn')};"  # fp8: no transposes
    assert mma.replace(" ", "").endswith(tail)
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned \t1" in ptx
    assert "cp.async.cg.shared.global" in ptx and "serialized" not in log
    assert emitted.shared_bytes == plan["shared_bytes"] == plan["stages"] * (128 + 256) * 128 + 1024


def test_matmul_wgmma_only_where_it_applies():
    """mma.sync stays for sm_90 (not sm_90a), rows that are not 16-byte pieces (cp.async),
    fp8 with a k-by-n B or a transposed A (wgmma transposes 16-bit types only), and f32.
    A transposed 16-bit A (a weight's gradient, x^T @ dy) takes wgmma, MN-major, where
    its output has a wave of 128 x 128 tiles."""
    def plan(built, target=HOPPER):
        with built.ctx, ir.Location.unknown():
            return strategy_for("matmul").plan(built.kernel.operation, target)

    assert plan(matmul_bias_gelu(512, 512, 512, "bf16"))["wgmma"]
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 512, "bf16"), CUDA)
    assert "wgmma" not in plan(matmul_bias_gelu(512, 65, 512, "bf16"))
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 500, "bf16"))  # B's rows: 1000 bytes
    assert plan(matmul_bias_gelu(512, 512, 504, "bf16"))["wgmma"]
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 516, "f8E4M3FN"))
    assert plan(matmul_nt(512, 512, 512, "f8E4M3FN"))["wgmma"]
    assert not plan(matmul_bias_gelu(512, 512, 512, "f32"))["mma"]
    ta = Built("matmul", [TensorSpec((8192, 2048), "bf16"), TensorSpec((8192, 2048), "bf16")],
               lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), b)])
    assert plan(ta)["wgmma"] and not plan(ta)["a_k_major"]
    # a narrow layer's (768 x 768 over 8192 tokens: 36 tiles of 128 x 128) keeps mma.sync
    narrow = Built("matmul", [TensorSpec((8192, 768), "bf16"), TensorSpec((8192, 768), "bf16")],
                   lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), b)])
    assert "wgmma" not in plan(narrow)
    ta8 = Built("matmul", [TensorSpec((64, 512), "f8E4M3FN"), TensorSpec((512, 64), "f8E4M3FN")],
                lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), kb.transpose(b, perm=[1, 0]))])
    assert "wgmma" not in plan(ta8)
    ta_odd = Built("matmul", [TensorSpec((8192, 2044), "bf16"), TensorSpec((8192, 2048), "bf16")],
                   lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), b)])
    assert "wgmma" not in plan(ta_odd)  # A's rows along m: 4088 bytes, not whole 16-byte pieces
    # small outputs narrow the tile until the grid is about a wave
    assert plan(matmul_bias_gelu(512, 512, 512, "bf16"))["block_n"] == 64
