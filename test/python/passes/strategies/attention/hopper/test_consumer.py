"""The Hopper kernel's key loops (passes/strategies/attention/hopper/consumer.py, with
the producer warpgroup of producer.py): the pipelined loop, the walks over a mask's live
blocks, the warp-specialized kernel persistent or not, in the PTX and on the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kf.passes.strategies.attention.hopper.plan import PERSISTENT_WINDOW_BYTES
from strategy_kernels import (HOPPER, TORCH, attention, attention_fp8, attention_reference, cuda_report, cuda_run, hopper_only,
                     needs_cuda, needs_ptxas, ptx_entries, randn)


#: The walk over the block table's live blocks: persistent (tiles claimed in turn) where
#: queries and keys fill whole blocks and the target's multiprocessors are known; else one
#: workgroup a tile, with the overlap of P V and the softmax where the blocks are whole,
#: and waiting for P V first with tails.
WALKS = {"persistent-d128": (2048, 128, HOPPER), "persistent-d64": (2048, 64, HOPPER),
         "overlap-pv": (2048, 128, dataclasses.replace(HOPPER, multiprocessors=0)),
         "serial-tails": (300, 128, HOPPER)}


@needs_ptxas
@pytest.mark.parametrize("walk", list(WALKS))
def test_block_table_walk_warp_specialized(walk):
    """The walk over the table's live blocks with a producer warpgroup (the benchmark's
    causal shape): both warpgroup kinds walk the same bit mask (popc, and the next block
    by cttz: brev + bfind in PTX); the producer copies Q under a barrier of its own and
    each live block into stage i % 3; the consumers take linear_softmax in whole and
    causal blocks (ex2.approx.ftz) beside the online softmax of the partial ones. Not
    persistent (7 mbarriers), the consumers reduce their rare second pass's test over
    their own 256 threads (bar.red on their named barrier, which the workgroup-wide NVVM
    op cannot); ptxas spills a little there (84 bytes with the overlap at 128, 20 without),
    measured faster anyway. Persistent: 132 workgroups; the producer claims a tile by one
    atomic add and hands it round on its named barrier (its 128 threads), ORs the table's
    live-row words (four redux.sync) instead of a second pass, and gives the consumers the
    tile on Q's barrier; an eighth mbarrier for Q's release; no spill and no second pass."""
    seq, d, target = WALKS[walk]
    persistent, overlap = walk.startswith("persistent"), not walk.startswith("serial")
    built = attention(4, 32, seq, seq, d, "bf16", (seq, seq), mask_elem="bf16")
    plan, emitted = built.emit(target)
    assert plan["warp_specialized"] and plan["stages"] == 3 and plan["threads"] == 384, plan
    grid = -(-seq // 128)
    assert bool(plan["persistent_walk"]) == persistent and emitted.grid == ((132, 1, 1) if persistent else (grid, 128, 1))
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    attn = ptx_entries(ptx)[emitted.name]
    assert "serialized" not in log, log
    assert r["spill_store_bytes"] <= (0 if persistent else 96 if overlap else 24), r
    assert attn.count("mbarrier.init.shared.b64") == (8 if persistent else 7) and attn.count("popc.b64") >= 2
    assert ("bar.red.or.pred p, 1, 256, q" in attn) != persistent
    assert attn.count("atom.global.add.u32") == persistent and attn.count("bar.sync \t3, 128") == persistent
    assert attn.count("redux.sync.or.b32") == 4 * persistent
    assert attn.count("ex2.approx.ftz.f32") >= 64 and "setmaxnreg.inc.sync.aligned.u32 \t240" in attn
    waits = [ln.split()[-1] for ln in attn.splitlines() if "wgmma.wait_group.sync.aligned" in ln]
    assert ("1;" in waits) == overlap, waits


@needs_ptxas
@pytest.mark.parametrize("seq,d,mask_shape,mask_elem", [
    (2048, 64, (2048, 2048), "bf16"), (4096, 128, (4096, 4096), "bf16"), (300, 128, (300, 300), "bf16"),
    (513, 128, (2, 1, 513, 513), "f32"), (8300, 64, (8300, 8300), "f32")],
    ids=["2048-d64", "4096", "300-tails", "mask-per-batch", "8300-per-block-loop"])
def test_masked_wgmma_attention_keeps_wgmma_async(seq, d, mask_shape, mask_elem):
    """Every skipping loop of the wgmma kernel (the walk, the per-block loop with the
    table beyond 64 key blocks, the in-kernel test without a table or for a mask per
    batch) branches on warp votes, so ptxas neither serializes the wgmmas (C7520) nor
    spills."""
    built = attention(2, 2, seq, seq, d, "bf16", mask_shape, mask_elem=mask_elem)
    plan, _ = built.emit(HOPPER)
    assert plan["wgmma"] and plan["skip_masked_blocks"]
    _, r, log = cuda_report(built, "sm_90a", log=True)
    assert "serialized" not in log, log
    # the walk with a producer warpgroup (consumers at 240 registers) spills 16 bytes with
    # tails (the walk without the overlap); measured faster all the same
    allowed = {True: 96 if seq % 128 == 0 else 16, False: 0}[plan["warp_specialized"]]
    assert r["spill_store_bytes"] <= allowed, r


@needs_ptxas
@pytest.mark.parametrize("kind,sk", [("bf16", 2048), ("bf16", 333), ("fp8", 2048), ("fp8", 384), ("fp8", 256)])
def test_pipelined_key_loop(kind, sk):
    """OVERLAP_PV (FlashAttention-3's intra-warpgroup pipeline) where it applies: three
    stages, head dim (V's) up to 128 and more than two key blocks. Block j's S and
    block j - 1's P V are issued together; the loop waits for S alone (wait_group 1,
    groups complete in order) and later for both (0). The first block's softmax is
    peeled off the loop, so the kernel has two, each one FFMA and one ex2 a score.
    ptxas does not serialize the wgmmas, nor spill but for fp8's 24 bytes with
    LAZY_RESCALE (test_lazy_rescale)."""
    built = attention_fp8(2, 4, 256, sk, 128) if kind == "fp8" else attention(2, 4, 256, sk, 128, "bf16")
    plan, _ = built.emit(HOPPER)
    assert plan["stages"] == 3 and plan["overlap_pv"] == (sk > 256), plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    waits = [ln.split()[-1] for ln in ptx.splitlines() if "wgmma.wait_group.sync.aligned" in ln]
    assert ("1;" in waits) == plan["overlap_pv"], waits
    if plan["overlap_pv"]:
        assert ptx.count("ex2.approx.ftz.f32") == 2 * (64 + 2), ptx.count("ex2.approx.ftz.f32")
    assert r["spill_store_bytes"] <= (24 if kind == "fp8" and plan["overlap_pv"] else 0), r
    assert "serialized" not in log, log  # C7513, C7520


@needs_ptxas
@pytest.mark.parametrize("kind,sk", [("bf16", 2048), ("bf16", 333), ("f16", 1000), ("fp8", 384)])
def test_warp_specialized_key_loop(kind, sk):
    """WARP_SPECIALIZED: a third warpgroup copies, the first two compute. The producer
    gives up registers (setmaxnreg.dec to 24) and issues cp.async copies only, each
    block's arrival on its full mbarrier (noinc: counted as one of its 128); the
    consumers take 240, wait on full mbarriers, fence the async proxy before wgmma
    reads, and give stages back on empty ones, with no barrier of the whole workgroup
    in the loop. ptxas neither spills (at 24 registers the producer's per-copy addresses
    spilled 528 bytes at 333 keys before its copies took per-slot edge tests) nor
    serializes; fp8 with LAZY_RESCALE spills 24 bytes (measured faster anyway)."""
    built = attention_fp8(2, 4, 256, sk, 128) if kind == "fp8" else attention(2, 4, 256, sk, 128, kind)
    plan, emitted = built.emit(HOPPER)
    assert plan["warp_specialized"] and plan["threads"] == 384 and emitted.block == (384, 1, 1), plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 \t24;") == 1, "the producer"
    assert ptx.count("setmaxnreg.inc.sync.aligned.u32 \t240;") == 1, "the consumers"
    # full and empty, three stages (PERSISTENT: one more, on which the consumers give Q back)
    assert ptx.count("mbarrier.init.shared.b64") == 6 + bool(plan["persistent"])
    assert "cp.async.mbarrier.arrive.noinc.shared.b64" in ptx and "mbarrier.arrive.shared.b64" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert ptx.count("bar.sync \t0;") == 1, "the workgroup meets once, after the mbarriers' initialization"
    assert "bar.arrive" not in ptx
    assert r["spill_store_bytes"] <= (24 if kind == "fp8" else 0), r
    assert "serialized" not in log, log


@needs_cuda
@pytest.mark.parametrize("b,h,sq,sk,elem", [(2, 3, 1000, 1000, "bf16"), (1, 2, 333, 1024, "f16"),
                                             (1, 4, 2048, 2048, "bf16"), (3, 1, 64, 4096, "bf16"),
                                             (4, 8, 2048, 512, "bf16"), (2, 40, 1000, 384, "f16")])
def test_warp_specialized_attention_cuda(b, h, sq, sk, elem):
    """The unmasked head-dim-128 kernel with its producer warpgroup, persistent or not:
    ragged and whole key blocks, fewer tiles than SMs, several
    tiles a persistent workgroup (512 and 640 tiles, the latter with the queries ending
    inside a block: the stages' and Q's mbarriers run on across them), and many key
    blocks per query block (4096 keys: each stage's mbarriers through 10 phases)."""
    hopper_only()
    built = attention(b, h, sq, sk, 128, elem)
    plan, emitted = built.emit(HOPPER)
    assert plan["warp_specialized"], plan
    # persistent where the keys and values of the tiles in flight fit the window
    window = HOPPER.multiprocessors / -(-sq // 128) * sk * 256 * 2 <= PERSISTENT_WINDOW_BYTES
    persistent = window and sk % 128 == 0
    assert bool(plan["persistent"]) == persistent, plan
    if persistent:
        assert plan["grid"] == [min(-(-sq // 128) * b * h, HOPPER.multiprocessors), 1, 1]
    gen = torch.Generator().manual_seed(sq + sk + b)
    q = randn((b, h, sq, 128), elem, gen)
    k, v = (randn((b, h, sk, 128), elem, gen) for _ in range(2))
    out, _ = cuda_run(built, plan, emitted, [k, q, v], (b, h, sq, 128), elem)
    want = attention_reference(k, q, v, None)
    tol = {"f16": 4e-3, "bf16": 3e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)
