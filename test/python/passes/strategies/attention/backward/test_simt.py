"""The SIMT attention backward (passes/strategies/attention/backward/simt.py) on kernel
functions built by hand, run on the Vulkan device against float64 gradients: odd sizes
(seq 257, head dims 40 and 65, batch 1), masks with a fully masked row, cross lengths;
its loop bound within lavapipe's; and as CUDA's kernel where no wgmma is (sm_80/89),
assembled by ptxas."""

from __future__ import annotations

import pytest
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import TargetInfo
from strategy_kernels import (SPIRV, attention_backward, attention_backward_inputs, needs_ptxas, needs_vulkan,
                     ptxas_reports, spirv_run_program)

CASES = [
    # b, h, sq, sk, d, dv, elem, mask shape
    (1, 1, 257, 257, 40, None, "f32", None),
    (1, 2, 257, 257, 65, None, "f32", (257, 257)),
    (2, 1, 33, 70, 64, 32, "f32", (2, 1, 33, 70)),
    (1, 1, 130, 130, 128, None, "f32", (130, 130)),
    (1, 2, 65, 65, 64, None, "bf16", (65, 65)),
    (1, 1, 40, 40, 40, None, "f16", None),
]


def _check(outs, want, elem):
    tol = {"f32": 2e-4, "f16": 2e-2, "bf16": 6e-2}[elem]
    for name, got, ref in zip(("dq", "dk", "dv"), outs, want):
        err = (got.double() - ref).abs().max().item()
        scale = ref.abs().max().item() + 1e-6
        assert err <= tol * scale, f"{name}: max error {err:.3g} against {scale:.3g}"


@needs_vulkan
@pytest.mark.parametrize("b,h,sq,sk,d,dv,elem,mask_shape", CASES)
def test_backward_vulkan(b, h, sq, sk, d, dv, elem, mask_shape):
    built = attention_backward(b, h, sq, sk, d, elem, mask_shape, dv=dv)
    plan, emitted = built.emit(SPIRV)
    assert plan["kernel"] == "simt" and plan["shared_bytes"] <= SPIRV.max_shared_bytes
    args, want = attention_backward_inputs(b, h, sq, sk, d, elem, mask_shape, dv=dv,
                                           dead_row=5 if mask_shape is not None else None)
    out_shapes = [(b, h, sq, d), (b, h, sk, d), (b, h, sk, dv or d)]
    outs = spirv_run_program(built, emitted, args, [TensorSpec(s, elem) for s in out_shapes])
    _check(outs, want, elem)


@pytest.mark.parametrize("seq,d", [(257, 65), (2048, 64), (4096, 128)])
def test_loop_iterations_within_lavapipe(seq, d):
    """An invocation's loop iterations (kf-to-spirv's bound) stay under lavapipe's 65535
    at long sequences, so the Vulkan launcher runs the kernel instead of refusing it."""
    from kf.passes.to_spirv import compile_spirv

    built = attention_backward(1, 1, seq, seq, d, "f32", (seq, seq))
    _, emitted = built.emit(SPIRV)
    [binary] = compile_spirv(built.gpu_text())
    loops = binary.kernels[emitted.name].abi_extra()["loop_iterations"]
    assert 0 <= loops <= 65535, loops


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_89"])
@pytest.mark.parametrize("d,mask_shape", [(64, None), (128, (257, 257)), (40, (257, 257))])
def test_cuda_fallback_ptxas(chip, d, mask_shape):
    """On sm_80/89 (no wgmma) the attention backward is the SIMT kernel and its
    preprocess; ptxas assembles both for the chip without spills."""
    target = TargetInfo.for_target("cuda", chip=chip)
    built = attention_backward(1, 2, 257, 257, d, "bf16", mask_shape)
    plan, emitted = built.emit(target)
    assert plan["kernel"] == "simt"
    _, reports, _ = ptxas_reports(built, chip)
    assert set(reports) == {emitted.name, emitted.prelude.name}
    for name, r in reports.items():
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (name, r)
