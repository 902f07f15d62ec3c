"""The Hopper kernel's softmax (passes/strategies/attention/hopper/softmax.py): linear
scores (one FFMA and one ex2.approx.ftz a score), the overlap of the next block's S, and
the lazy rescale of O."""

from __future__ import annotations

import pytest
import torch
from fp8_inputs import caller_inputs
from strategy_kernels import HOPPER, attention, attention_fp8, cuda_report, needs_ptxas


@needs_ptxas
@pytest.mark.parametrize("d", [64, 128])
def test_linear_scores_and_overlap_bf16(d):
    """The seed's bf16 attention: the scale folded into one FFMA a score (no subtract,
    no multiply per score in the softmax), and at head dim 128 the next block's S
    issued before the softmax, with K and V in three stages (64 keeps two: one
    workgroup an SM fewer with three). At 64 two workgroups share an SM, so ptxas is
    held to 128 registers a thread (.maxnreg), without spilling."""
    built = attention(2, 8, 2048, 2048, d, "bf16")
    plan, _ = built.emit(HOPPER)
    assert plan["stages"] == (3 if d == 128 else 2), plan
    assert plan["max_registers"] == (128 if d == 64 else 0), plan
    ptx, r = cuda_report(built, "sm_90a")
    assert ptx.count("fma.rn.f32") >= 64 and ptx.count("sub.rn.f32") < 8, ptx.count("sub.rn.f32")
    assert r["spill_store_bytes"] == 0 and r["registers"] <= (128 if d == 64 else 255), r


@needs_ptxas
@pytest.mark.parametrize("elem", ["bf16", "f16"])
def test_lazy_rescale(elem):
    """O's rescale is a branch on a warp vote, taken where a row maximum of the warp
    moved by more than 2^8 (fp8, whose P is scaled by 256 towards e4m3's 448: 2^0.75);
    ptxas neither spills nor serializes the wgmmas around it (the vote makes the branch
    uniform to it). fp8 spills 24 bytes (measured faster all the same)."""
    from kf.passes.strategies.attention.hopper.softmax import lazy_threshold

    assert lazy_threshold(elem, 1.0, 0.0) == 8.0 and lazy_threshold("f8E4M3FN", 256.0, 8.0) == 0.75
    assert lazy_threshold("f8E5M2", 256.0, 8.0) == 7.75
    for built in (attention(2, 4, 256, 2048, 128, elem), attention_fp8(2, 4, 256, 2048, 128)):
        plan, _ = built.emit(HOPPER)
        assert plan["overlap_pv"], plan
        ptx, r, log = cuda_report(built, "sm_90a", log=True)
        assert "vote.sync.ballot" in ptx
        fp8 = plan["elem"].startswith("f8")
        assert r["spill_store_bytes"] <= (24 if fp8 else 0) and "serialized" not in log, (r, log)


@needs_ptxas
@pytest.mark.parametrize("caller", [False, True], ids=["amax", "caller"])
def test_fp8_scores_one_ffma_and_ex2_ftz(caller):
    """The seed's attention under precision="fp8": the scores' factor, which the kernel
    computes from the amaxes (1 / ((448 / max(a_q, eps)) (448 / max(a_k, eps))) / sqrt(d)),
    is non-negative by construction, so the row maximum is taken on the raw scores and a
    score costs one FFMA before its ex2 (64 a key block a thread), as with the bf16
    kernel's constant. The caller's own scales are arguments of unknown sign: their
    scores are scaled first (no FFMA). Either way 2^x is ex2.approx.ftz.f32, one
    MUFU.EX2 (FTZ_EXP2), never the non-ftz form that ptxas wraps in three more
    instructions."""
    import re

    import kf
    from fp8_caller import caller_attention_vt
    from seed_examples import fused_attention

    if caller:
        (q8, k8, v8, *scales), _ = caller_inputs(1, 2, 256, 128)
        fn, args = kf.jit(caller_attention_vt, target="cuda", arch="sm_90a", precision="fp8"), \
            (q8, k8, v8.transpose(-1, -2).contiguous(), *scales)
    else:
        fn = fused_attention.with_options(target="cuda", arch="sm_90a", precision="fp8")
        args = [torch.randn(1, 2, 256, 128, dtype=torch.bfloat16) for _ in range(3)]
    ptx = kf.inspect(fn, *args).stages["ptx"]
    entry = next(m for m in re.findall(r"\.entry (\w+)", ptx) if m.endswith("_attention"))
    body = ptx[ptx.index(".entry " + entry):]
    assert body.count("fma.rn.f32") == (0 if caller else 64), body.count("fma.rn.f32")
    assert body.count("ex2.approx.ftz.f32") == 66 and "ex2.approx.f32" not in body
