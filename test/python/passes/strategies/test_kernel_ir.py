"""The kernel-building toolkit (passes/strategies/kernel_ir.py) through the kernels that
use it: CUDA's 128-bit tile staging (``VectorStaging``) run on lavapipe."""

from __future__ import annotations

import pytest
import torch
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from strategy_kernels import SPIRV, TORCH, Built, attention, attention_reference, emit_with, needs_vulkan, randn, spirv_run


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "f16"])
def test_vector_staging_on_vulkan(elem):
    """The 128-bit staging path (CUDA's) run on lavapipe, where kf-to-spirv splits the
    vector accesses into scalars: checks its index arithmetic for a transposed k, a
    transposed weight and whole-vector tails (seq 136, N 72, K 64: multiples of 8).
    Four lanes (SPIR-V has no vector<8xf16>), so 8 bytes for f16."""
    vb = 16 if elem == "f32" else 8
    built = attention(1, 2, 136, 136, 64, elem, (136, 136))
    _, emitted = emit_with(built, SPIRV, vector_bytes=vb)
    assert "vector.load" in built.gpu_text()
    gen = torch.Generator().manual_seed(8)
    k, q, v = (randn((1, 2, 136, 64), elem, gen) for _ in range(3))
    mask = (torch.rand(136, 136, generator=gen) > 0.3).float()
    out, _ = spirv_run(built, emitted, [k, q, v, mask], (1, 2, 136, 64), elem)
    tol = {"f32": 2e-5, "f16": 2e-3}[elem]
    torch.testing.assert_close(out.float(), attention_reference(k, q, v, mask).to(TORCH[elem]).float(),
                               rtol=tol, atol=tol)

    m, kk, n = 100, 64, 72
    mm = Built("matmul", [TensorSpec((m, kk), elem), TensorSpec((n, kk), elem)],
               lambda a, w: [kb.matmul(a, kb.transpose(w, perm=[1, 0]))])
    _, emitted = emit_with(mm, SPIRV, vector_bytes=vb)
    assert "vector.load" in mm.gpu_text()
    a, w = randn((m, kk), elem, gen), randn((n, kk), elem, gen)
    out, _ = spirv_run(mm, emitted, [a, w], (m, n), elem)
    torch.testing.assert_close(out.float(), (a.float() @ w.float().t()).to(TORCH[elem]).float(), rtol=tol, atol=tol)
