"""The block table of a mask every head shares (passes/strategies/attention/hopper/
block_table.py): its kernel in the launch schedule, its classes, and the walks over its
live blocks, checked in the PTX and, where a Hopper GPU is, against the mask's
definition."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kf import dialects as kd
from mlir import ir
from strategy_kernels import (HOPPER, TORCH, attention, attention_reference, cuda_compile, cuda_report, hopper_only, needs_cuda,
                     needs_ptxas, ptx_entries, randn)


@needs_ptxas
def test_block_table_kernel_in_the_schedule():
    """On sm_90a the seed's attention with a causal mask tensor gets the block table: a
    kernel of its own, launched first with the attention kernel's inputs, whose i32
    table the attention kernel takes as one more input; the ABI numbers it as a
    temporary between the two launches. With PERSISTENT_WALK (queries and keys fill
    whole blocks) the table is 4 x 21: 4 key blocks' codes, 4 live-row words a block and
    the tile counter."""
    import kf
    import seed_examples
    from kf import gpu_codegen
    from kf.passes import pipeline

    q, k, v = (torch.randn(2, 4, 512, 128).to(torch.bfloat16) for _ in range(3))
    mask = torch.tril(torch.ones(512, 512)).to(torch.bfloat16)
    captured = kf.inspect(seed_examples.fused_attention.with_options(target="cuda"), q, k, v, mask)
    ctx = kd.make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(str(captured.kf_ir))
        pm, _ = pipeline.build("builtin.module(kf-fuse, kf-tile{target=cuda chip=sm_90a}, "
                               "kf-map-to-gpu{target=cuda chip=sm_90a})", ctx)
        pm.run(module.operation)
        abi, _, _ = gpu_codegen.schedule_abi(module, "fused_attention", ["q", "k", "v", "mask"], "cuda")
    blocks, attn = abi.kernels
    assert blocks.entry.endswith("_attention_blocks") and attn.entry.endswith("_attention")
    [table] = abi.temporaries
    assert table.shape == (4, 21) and table.elem == "i32"
    n_in = len(abi.inputs)
    table_buffer = n_in + len(abi.outputs)
    assert blocks.args == attn.args[:n_in] + (table_buffer,) and blocks.grid == (4, 4, 1)
    assert attn.args[n_in] == table_buffer and attn.args[n_in + 1] == n_in  # then the output


def _nested_ops(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _nested_ops(inner.operation)


def _causal_branches(gfunc: ir.Operation, mask_arg: ir.Value) -> list[tuple[int, int, int]]:
    """(causal compares, mask loads in the then-region, mask loads in the else-region) of
    each scf.if that chooses between the computed causal mask (i32 ``slt`` compares of
    the row offsets, attention.online_softmax) and the mask read from memory."""
    def counts(ops):
        slt = sum(1 for o in ops if o.name == "arith.cmpi"  # predicate 2: slt
                  and ir.IntegerAttr(o.attributes["predicate"]).value == 2 and str(o.operands[0].type) == "i32")
        loads = sum(1 for o in ops if o.name == "memref.load" and o.operands[0] == mask_arg)
        return slt, loads

    def region_ops(region):
        return [o for b in region.blocks for x in b.operations for o in [x.operation, *_nested_ops(x.operation)]]

    found = []
    for op in _nested_ops(gfunc):
        if op.name != "scf.if" or len(op.regions[1].blocks) == 0:
            continue
        (slt, then_loads), (_, else_loads) = counts(region_ops(op.regions[0])), counts(region_ops(op.regions[1]))
        if slt and else_loads:
            found.append((slt, then_loads, else_loads))
    return found


@needs_ptxas
def test_block_table_causal_class_and_walk():
    """The block table's classes and the walk over live blocks, on the shape the
    benchmark times (4x32x2048x128 bf16, a [2048, 2048] causal mask).

    The table kernel ANDs two predicates (whole, and the mask equal to key > query on the
    block: the CAUSAL class) and ORs one (live). The attention kernel reads its row of
    the table once (ballots, popc) and walks the live blocks; its causal blocks take a
    branch that computes the mask from the row offsets (64 i32 compares a thread) and
    reads no mask element, beside the branch of the partial blocks that reads them (the
    first block's, peeled off the loop, and the loop's). Every branch around a wgmma is on
    a warp vote, so ptxas does not serialize the wgmmas (C7520); no spills."""
    built = attention(4, 32, 2048, 2048, 128, "bf16", (2048, 2048), mask_elem="bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["block_table"] == [16, 16] and plan["warp_specialized"], plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    entries = ptx_entries(ptx)
    attn, blocks = entries[emitted.name], entries[emitted.prelude.name]
    assert r["spill_store_bytes"] == 0 and r["registers"] <= 255, r
    assert "C7520" not in log and "serialized" not in log, log
    assert blocks.count("bar.red.and") == 2 and blocks.count("bar.red.or") == 1
    assert "popc.b64" in attn
    with built.ctx:
        gfunc = next(op.operation for op in built.gpu_module.regions[0].blocks[0].operations
                     if ir.StringAttr(op.operation.attributes["sym_name"]).value == emitted.name)
        branches = _causal_branches(gfunc, gfunc.regions[0].blocks[0].arguments[3])
    # 2 rows x 16 tiles x 2 columns a thread; no mask element read there
    assert branches and all(b == (64, 0, 64) for b in branches), branches


def block_classes(mask: torch.Tensor, bm: int, bn: int, causal_class: bool) -> torch.Tensor:
    """The block table a [sq, sk] mask (nonzero: kept) must get, from its definition:
    DEAD (nothing kept), WHOLE (all kept and the block inside both sequences), CAUSAL
    (kept exactly where key <= query, absolute indices, over the block's positions inside
    the sequences) or PARTIAL."""
    from kf.passes.strategies.attention.hopper.block_table import CAUSAL, DEAD, PARTIAL, WHOLE

    keep = mask != 0
    sq, sk = keep.shape
    agree = keep == (torch.arange(sk)[None, :] <= torch.arange(sq)[:, None])
    out = torch.empty(-(-sq // bm), -(-sk // bn), dtype=torch.int32)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            blk = keep[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            ok = agree[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            out[i, j] = DEAD if not blk.any() else WHOLE if blk.shape == (bm, bn) and blk.all() else \
                CAUSAL if causal_class and ok.all() else PARTIAL
    return out


def table_mask(s: int, kind: str, gen) -> torch.Tensor:
    """[s, s] masks for the block table's classes: the causal pattern; tril with offsets
    (+-1, +-128: not causal, and +-128 is causal relative to a block corner, which must
    not count); causal with one position flipped below or above the diagonal; fully
    masked rows; random; whole zero column blocks; block-diagonal; all kept; none kept."""
    ones = torch.ones(s, s)
    if kind.startswith("tril"):
        return torch.tril(ones, diagonal=int(kind[4:]))
    m = torch.tril(ones)
    if kind == "flip_below":
        m[s // 2 + 3, s // 2 + 1] = 0
    elif kind == "flip_above":
        m[5, 9] = 1
    elif kind == "dead_rows":
        m[3] = 0
        m[s - 1] = 0
    elif kind == "random":
        m = (torch.rand(s, s, generator=gen) > 0.3).float()
    elif kind == "random_dead_columns":
        m = (torch.rand(s, s, generator=gen) > 0.2).float()
        m[:, 64:256] = 0
    elif kind == "block_diagonal":
        m = torch.block_diag(*[torch.ones(96, 96)] * (s // 96 + 1))[:s, :s]
    elif kind in ("ones", "zeros"):
        m = ones if kind == "ones" else torch.zeros(s, s)
    else:
        assert kind == "causal", kind
    return m


TABLE_MASKS = ["causal", "tril1", "tril-1", "tril128", "tril-128", "flip_below", "flip_above", "dead_rows", "random",
               "random_dead_columns", "block_diagonal", "ones", "zeros"]


def live_row_words(mask: torch.Tensor, bm: int, bn: int) -> torch.Tensor:
    """The block table's live-row words (PERSISTENT_WALK) a [sq, sk] mask must get: per
    (query block, key block), bit e of word 2p + h set where row 2 (32 h + e) + p of the
    block keeps a key of the block (rows past the queries count as kept), as int32."""
    from kf.passes.strategies.attention.hopper.block_table import ROW_WORDS

    keep = mask != 0
    sq, sk = keep.shape
    nq, nk = -(-sq // bm), -(-sk // bn)
    out = torch.zeros(nq, nk * ROW_WORDS, dtype=torch.int64)
    for i in range(nq):
        for j in range(nk):
            for r in range(bm):
                row = i * bm + r
                if row >= sq or keep[row, j * bn:(j + 1) * bn].any():
                    e, p = r // 2, r % 2
                    out[i, ROW_WORDS * j + 2 * p + e // 32] |= 1 << (e % 32)
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


@needs_cuda
@pytest.mark.parametrize("multiprocessors", [132, 5, 0], ids=["default", "5-workgroups", "not-persistent"])
@pytest.mark.parametrize("b,h,seq,d,elem,mask_shape,mask_elem", [
    (1, 2, 300, 128, "bf16", (300, 300), "bf16"), (2, 2, 1000, 64, "f16", (1, 1, 1000, 1000), "f32"),
    (1, 2, 2048, 128, "bf16", (2048, 2048), "bf16"), (1, 1, 4160, 64, "bf16", (4160, 4160), "bf16"),
    (1, 1, 8300, 64, "f16", (8300, 8300), "f32"), (3, 11, 1024, 128, "bf16", (1024, 1024), "bf16")],
    ids=["300-tails", "1000-4d-mask", "2048", "4160-two-words", "8300-per-block-loop", "3x11-heads-264-tiles"])
def test_block_table_classes_cuda(b, h, seq, d, elem, mask_shape, mask_elem, multiprocessors):
    """The wgmma kernel with the block table on head-shared masks of every class
    (``table_mask``), with the walk over live blocks (a second ballot word at 4160; more
    than 64 key blocks at 8300 take the per-block loop), persistent where the blocks are
    whole (2048 and the 264 tiles of 3 x 11 heads, several a workgroup; with 5 workgroups,
    dozens) or not (no multiprocessors known): the table the prelude writes is
    ``block_classes`` of the mask exactly (and
    ``live_row_words`` where persistent), and the result matches torch on fresh random
    inputs, rows masked everywhere included. One compile a shape and switch set; the
    masks only change the inputs."""
    hopper = dataclasses.replace(hopper_only(), multiprocessors=multiprocessors)
    built = attention(b, h, seq, seq, d, elem, mask_shape, mask_elem=mask_elem)
    plan, emitted = built.emit(hopper)
    assert plan["wgmma"] and plan["block_table"] and emitted.prelude is not None
    persistent = seq % plan["block_m"] == 0 and plan["warp_specialized"] and seq <= 8192 and multiprocessors > 0
    assert bool(plan["persistent_walk"]) == persistent, plan
    if persistent:
        assert emitted.grid[0] == min(b * h * seq // plan["block_m"], hopper.multiprocessors), emitted.grid
    run, _ = cuda_compile(built, emitted)
    gen = torch.Generator().manual_seed(seq * 31 + d + multiprocessors)
    tol = {"f16": 4e-3, "bf16": 3e-2}[elem]
    nk = plan["block_table"][1]
    for kind in TABLE_MASKS:
        k, q, v = (randn((b, h, seq, d), elem, gen) for _ in range(3))
        mask = table_mask(seq, kind, gen)
        want_table = block_classes(mask, plan["block_m"], plan["block_n"], True)
        want_rows = live_row_words(mask, plan["block_m"], plan["block_n"]) if persistent else None
        mask = mask.expand(mask_shape).contiguous().to(TORCH[mask_elem])
        out, table = run([k, q, v, mask], (b, h, seq, d), elem)
        assert torch.equal(table[:, :nk], want_table), (kind, table[:, :nk], want_table)
        if persistent:  # the rows' words, and the counter at the tiles claimed: one past the last a workgroup
            assert torch.equal(table[:, nk:-1], want_rows), (kind, table[:, nk:-1], want_rows)
            assert table[0, -1].item() == b * h * plan["block_table"][0] + emitted.grid[0], table[0, -1]
        else:
            assert table.shape[1] == nk
        want = attention_reference(*(x.cuda() for x in (k, q, v, mask))).cpu()
        torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol,
                                   msg=lambda m, kind=kind: f"{kind}: {m}")
