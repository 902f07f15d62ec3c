"""The tensor-core attention kernels at run-time sequence lengths
(passes/strategies/attention/run_time.py): kernel functions with ``?`` sequences planned
on their bound, the plans that hold for every length, and the kernels that read the
lengths from their size slots (assembled by ptxas here; the numbers against torch on a
GPU are test/python/compiler/test_dynamic.py's)."""

from __future__ import annotations

import re

import pytest
from strategy_kernels import CUDA, HOPPER, Built, cuda_report, needs_ptxas
from kf.dialects import builders as kb
from kf.dialects.types import DYN, TensorSpec
from kf.passes.strategies import run_time_sizes
from kf.passes.strategies.attention.hopper import AttentionVariant
from kf.passes.strategies.base import strategy_for
from mlir import ir


def run_time_attention(b, h, d, elem, mask=None, lse=False):
    """Attention over run-time sequences (k, q, v [.., ?, d]) as kf-fuse makes it: f32
    scores scaled, ``mask`` "causal" (made from the indices, as ``torch.ones(sq,
    sk).tril()`` in the function is) or None, the softmax rounded to ``elem`` for P V,
    the output in ``elem`` and with ``lse`` the scores' row logsumexp [b, h, ?] beside it
    (what kf's autograd saves). ``mask`` "bool": a boolean mask tensor [b, 1, ?, ?] (a
    padded batch's causal mask, each of its two dims a run-time size of its own);
    "padding": one of [b, 1, 1, ?]."""
    specs = [TensorSpec((b, h, DYN, d), elem)] * 3
    if mask in ("bool", "padding"):  # a [b, 1, queries, keys] mask tensor, or [b, 1, 1, keys]
        specs = specs + [TensorSpec((b, 1, DYN if mask == "bool" else 1, DYN), "i1")]

    def body(k, q, v, *m):
        s = kb.build("matmul", [q, kb.transpose(k, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, DYN, DYN), "f32")]).result
        s = kb.mul(s, kb.scalar(d ** -0.5, "f32"))
        if m:
            s = kb.masked_fill(s, kb.cmp(m[0], kb.scalar(False, "i1"), predicate="eq"), value=float("-inf"))
        if mask == "causal":
            rows, cols = kb.iota((DYN, 1), 0), kb.iota((1, DYN), 1)
            s = kb.masked_fill(s, kb.cmp(cols, rows, predicate="gt"), value=-1e9)
        p = kb.cast(kb.softmax(s, dim=-1), elem)
        o = kb.build("matmul", [p, v], None, [TensorSpec((b, h, DYN, d), "f32")]).result
        out = [kb.cast(o, elem)]
        return out + [kb.logsumexp(s, dims=[3], keepdim=False)] if lse else out

    return Built("attention", specs, body)


def emit_run_time(built: Built, target, variant=None):
    """(plan, EmittedKernel) as kf-tile and kf-map-to-gpu make them for a kernel with
    run-time sizes: planned on its bound, its slots in the plan's ``sizes``."""
    with built.ctx, ir.Location.unknown():
        strategy = strategy_for("attention")
        with run_time_sizes.bounded(built.kernel.operation) as (bounded, slots):
            plan = {**strategy.plan(bounded, target, variant), "sizes": [list(s) for s in slots]}
            emitted = strategy.emit(bounded, plan, built.gpu_module, target)
    return plan, emitted


def test_bounded_plans_hold_for_every_length():
    """Planned on the bound, the wgmma plan takes no choice that holds for some lengths
    only: no block table (a causal mask made from the indices is tested per block), no
    persistent grid (which the static kernel of 4096 keys takes). The producer
    warpgroup, which serves every length (its copies test the keys' end), unless the
    variant turns it off (the consumers' own three-stage copies)."""
    copies = AttentionVariant(run_time_producer=False)
    plan, emitted = emit_run_time(run_time_attention(2, 3, 128, "bf16"), HOPPER, copies)
    assert plan["wgmma"] and plan["stages"] == 3 and not plan["warp_specialized"] and not plan["persistent"], plan
    plan, emitted = emit_run_time(run_time_attention(2, 3, 128, "bf16"), HOPPER)
    assert plan["warp_specialized"] and not plan["persistent"] and plan["threads"] == 384, plan
    assert emitted.block == (384, 1, 1), emitted
    assert emitted.sizes and emitted.grid_sizes == ("FloorDiv(k3*1 + 127, 128)", "6", "1"), emitted
    # two workgroups an SM (ptxas held to 128 registers) only where the grid at the bound
    # has more than one an SM: 6 heads of 32 query blocks, not one
    assert emit_run_time(run_time_attention(2, 3, 64, "bf16"), HOPPER)[0]["max_registers"] == 128
    assert emit_run_time(run_time_attention(1, 1, 64, "bf16"), HOPPER)[0]["max_registers"] == 0
    plan, _ = emit_run_time(run_time_attention(2, 3, 64, "bf16", mask="causal"), HOPPER)
    assert plan["wgmma"] and plan["skip_masked_blocks"] and not plan["block_table"], plan
    assert not plan["warp_specialized"] and not plan["persistent_walk"], plan
    assert plan["block_n"] == 128, plan
    # past head dim 64 a mask takes blocks of 64 keys (the skipping loop spilled at 128);
    # past 128 the mma.sync kernel
    plan, _ = emit_run_time(run_time_attention(2, 3, 128, "bf16", mask="causal"), HOPPER)
    assert plan["wgmma"] and plan["block_n"] == 64 and plan["skip_masked_blocks"], plan
    plan, _ = emit_run_time(run_time_attention(2, 3, 256, "bf16", mask="causal"), HOPPER)
    assert plan["mma"] and not plan.get("wgmma"), plan


def test_mma_sync_plan_at_run_time_sizes():
    """Off sm_90a: the mma.sync kernel, its grid the run-time query blocks of 64 rows."""
    plan, emitted = emit_run_time(run_time_attention(2, 3, 64, "f16"), CUDA)
    assert plan["mma"] and not plan.get("wgmma"), plan
    assert emitted.grid_sizes == ("FloorDiv(k3*1 + 63, 64)", "6", "1"), emitted


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("mask", ["bool", "padding"])
def test_run_time_kernels_read_a_mask_tensor_with_its_own_sizes(chip, mask):
    """A mask tensor of run-time queries and keys ([b, 1, ?, ?]) or keys ([b, 1, 1, ?]):
    the tensor-core kernels read it with strides from its own size slots (not q's or
    K's), and ptxas assembles them."""
    built = run_time_attention(2, 3, 64, "bf16", mask=mask)
    plan, emitted = emit_run_time(built, HOPPER if chip == "sm_90a" else CUDA)
    assert plan["mma"] and plan["skip_masked_blocks"], plan
    assert len(emitted.sizes) == (6 if mask == "bool" else 5), emitted
    assert [tuple(s) for s in plan["sizes"]][3:] == ([(3, 2), (3, 3)] if mask == "bool" else [(3, 3)]) + [(4, 2)]
    ptx, report = cuda_report(built, chip)
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, (plan, report)
    text = built.gpu_text()
    # the mask's slots are loaded: index 3 (and 4) of the sizes buffer
    loads = set(re.findall(r"memref\.load %arg\d+\[%c(\d+)(?:_\d+)?\] : memref<\d+xi32>", text))
    assert {"3", "4"} <= loads if mask == "bool" else "3" in loads, (loads, text[:3000])


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("elem", ["bf16", "f16"])
@pytest.mark.parametrize("variant", ["plain", "causal", "lse", "one_head", "producer", "producer_lse"])
def test_run_time_kernels_assemble_without_spills(chip, d, elem, variant):
    """The kernels with run-time lengths -- O alone, under a causal mask made from the
    indices, with the row logsumexp, and of one head (no flat buffers) -- lower to PTX
    that ptxas assembles without spills; each reads its size slots (the last parameter)
    and compares its keys against the run-time length, not a constant."""
    b, h = (1, 1) if variant == "one_head" else (2, 3)
    lse = variant in ("lse", "producer_lse")
    built = run_time_attention(b, h, d, elem, mask="causal" if variant == "causal" else None, lse=lse)
    options = AttentionVariant(run_time_producer=variant.startswith("producer"))
    plan, emitted = emit_run_time(built, HOPPER if chip == "sm_90a" else CUDA, options)
    ptx, report = cuda_report(built, chip)
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, (plan, report)
    wgmma = chip == "sm_90a"
    assert ("wgmma.mma_async" in ptx) == wgmma and ("mma.sync.aligned.m16n8k16" in ptx) == (not wgmma)
    assert len(emitted.sizes) == (5 if lse else 4), emitted
    assert plan.get("warp_specialized", False) == (options.run_time_producer and wgmma and d == 128), plan
    assert emitted.grid_sizes[0].startswith("FloorDiv(k3*1"), emitted
    text = built.gpu_text()
    slots = f"memref<{len(emitted.sizes)}xi32>"
    assert re.search(rf"gpu\.func @k_attention\([^)]*, %arg\d+: {slots}\)", text), text[:2000]
    # the key loop runs to a loaded length (an SSA value, not a constant %c...)
    assert re.search(rf"scf\.for %\w+ = %c0 to %\d+ step %c{plan['block_n']} ", text)

