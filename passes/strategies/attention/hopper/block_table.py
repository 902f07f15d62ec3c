"""The block table of a mask that every head shares (FlexAttention's block mask), and the
walks over its live blocks.

A kernel of its own (``emit_block_table``), launched before the attention kernel once a
call, classifies each (query block, key block) as ``DEAD`` (the mask masks all of it:
skipped at no cost, no test, no copies of its K and V), ``WHOLE`` (none of it: the
softmax without the mask), ``CAUSAL`` (the mask is the causal pattern over the block,
masked iff key > query in absolute indices: computed from the indices, not read) or
``PARTIAL`` (the mask read where the softmax needs it, so any mask stays exact). The
attention kernel reads its query block's row of the table once, at its start (a warp
ballot per 32 key blocks: i64 bit masks of the live, whole and causal blocks, in
registers, ``table_masks``), and walks the live blocks only: the next live block is the
lowest set bit above this one (``cttz``).
"""

from __future__ import annotations

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm

from ...base import EmittedKernel, NotApplicable, TargetInfo
from ...kernel_ir import GpuFunc, Pointwise, gpu_arg_types, workgroup_memref
from ...nvidia.barriers import block_reduce

#: What the block table says of a block (see the module docstring).
DEAD, PARTIAL, WHOLE, CAUSAL = 0, 1, 2, 3

#: Words of a block's live query rows in the block table (the persistent walk): bit e of
#: word 2p + h is row 2 (32 h + e) + p of the query block (the table kernel's threads
#: take rows of one parity a warp; see ``emit_block_table``).
ROW_WORDS = 4


def table_columns(nk: int, rows_live: bool) -> int:
    """The block table's columns: a code per key block; with ``rows_live``
    (the persistent walk) then ``ROW_WORDS`` words a key block of which query rows see a live
    score there, and the tile counter (row 0's last column)."""
    return nk * (1 + ROW_WORDS) + 1 if rows_live else nk


def emit_block_table(ch, gpu_module: ir.Operation, target: TargetInfo, bm: int, bn: int,
                     table_t: ir.Type, rows_live: bool = False) -> EmittedKernel:
    """The kernel that writes the block table: a workgroup per (query block, key block),
    its 256 threads reading the block's mask condition, coalesced along the keys; out of
    range positions count as masked (so a tail block is never WHOLE). A live
    block that is not whole is CAUSAL where every in-range position
    is masked exactly when its key index exceeds its query index (out of range positions
    do not count: the attention kernel's tail guards decide them before the mask).

    ``rows_live`` (the persistent walk): also which query rows see an unmasked in-range score
    in the block (``ROW_WORDS`` words: a warp vote per row, the four warps of a row's
    parity ORed through shared memory; rows past the queries count as live), and
    workgroup (0, 0) zeroes the tile counter, which the attention kernel, launched after
    this one on the same stream, counts up."""
    view = ch.view
    Sq, Sk = ch.seq_q, ch.seq_k
    threads = 256
    i1, i32 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
    nq, nk = -(-Sq // bm), -(-Sk // bn)
    name = f"{view.name}_blocks"
    arg_types = gpu_arg_types(view, target)[:len(view.args)] + [table_t]
    warps = threads // 32
    if rows_live and (bn % 32 or threads % bn or bm * bn // threads != 64):
        raise NotApplicable("the block table's live rows take 128-key blocks and 256 threads")
    g = GpuFunc(gpu_module, name, arg_types, [workgroup_memref([2 * warps], i32)] if rows_live else [],
                (threads, 1, 1))
    pw = Pointwise(g, view, g.args[:len(view.args)])
    with ir.InsertionPoint(g.entry):
        tid, kb, qb = g.tid(), g.bid("x"), g.bid("y")
        r0, c0 = g.mul(qb, bm), g.mul(kb, bn)
        true, false = arith.constant(i1, 1), arith.constant(i1, 0)
        lead = [g.c(0)] * (ch.scores.rank - 2)
        live, whole, causal = false, true, true
        row_words = [arith.constant(i32, 0)] * 2  # this warp's rows, e < 32 and e >= 32
        for e in range(bm * bn // threads):
            lin = g.add(tid, e * threads)
            r, c = arith.addi(r0, g.div(lin, bn)), arith.addi(c0, g.rem(lin, bn))
            conds = [x for x in (g.lt(r, Sq) if Sq % bm else None, g.lt(c, Sk) if Sk % bn else None) if x is not None]

            def masked(r=r, c=c):
                pw.reset()
                m = pw.eval(ch.mask_cond, pw.operand_index(spec_of(ch.mask_cond.type).shape, lead + [r, c],
                                                           ch.scores.rank))
                pw.reset()
                above = arith.cmpi(arith.CmpIPredicate.ugt, c, r)  # key past query: causal masks it
                return [m, arith.cmpi(arith.CmpIPredicate.eq, m, above)]

            m, *agrees = g.guarded(g.all_of(conds), [i1] * 2, masked, lambda: [true] * 2)
            live = arith.ori(live, arith.xori(m, true))
            whole = arith.andi(whole, arith.xori(m, true))
            if agrees:
                causal = arith.andi(causal, agrees[0])
            if rows_live:  # the warp's row (2e + its parity): any lane's score live
                seen = nvvm.vote_sync(i1, arith.constant(i32, -1), arith.xori(m, true), nvvm.VoteSyncKind.any)
                if Sq % bm:
                    seen = arith.ori(seen, arith.cmpi(arith.CmpIPredicate.uge, r, g.c(Sq)))
                bit = arith.shli(arith.extui(i32, seen), arith.constant(i32, e % 32))
                row_words[e // 32] = arith.ori(row_words[e // 32], bit)
        if rows_live:
            shared = g.shared[0]
            warp = g.div(tid, 32)
            g.when(arith.cmpi(arith.CmpIPredicate.eq, g.rem(tid, 32), g.c(0)),
                   lambda: [memref.store(w, shared, [g.add(g.mul(warp, 2), h)]) for h, w in enumerate(row_words)])
            gpu.barrier()

            def gather():  # word 2p + h: the OR of the parity p warps' (4p .. 4p + 3) word h
                p, h = g.div(tid, 2), g.rem(tid, 2)
                word = arith.constant(i32, 0)
                for w in range(warps // 2):
                    at = g.add(g.mul(g.add(g.mul(p, warps // 2), w), 2), h)
                    word = arith.ori(word, memref.load(shared, [at]))
                memref.store(word, g.args[-1], [qb, g.add(g.add(g.mul(kb, ROW_WORDS), tid), nk)])

            g.when(g.lt(tid, ROW_WORDS), gather)
            first = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, g.add(kb, qb), g.c(0)),
                               arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)))
            g.when(first, lambda: memref.store(arith.constant(i32, 0), g.args[-1],
                                               [g.c(0), g.c(table_columns(nk, True) - 1)]))
        live, whole = block_reduce(live, "or"), block_reduce(whole, "and")
        partial = arith.constant(i32, PARTIAL)
        partial = arith.select(block_reduce(causal, "and"), arith.constant(i32, CAUSAL), partial)
        code = arith.select(live, arith.select(whole, arith.constant(i32, WHOLE), partial), arith.constant(i32, DEAD))
        g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)), lambda: memref.store(code, g.args[-1], [qb, kb]))
        g.finish()
    return EmittedKernel(name, (nk, nq, 1), (threads, 1, 1), 0, {"strategy": "attention block table"})


def table_masks(g: GpuFunc, table: ir.Value, qblock: ir.Value, nk: int, tid: ir.Value,
                 names: tuple[str, ...]) -> dict[str, ir.Value]:
    """The workgroup's row of the block table as i64 bit masks (bit j: key block j), of
    ``names`` among ``live``, ``whole`` and ``causal``: lane l of every warp loads entries
    l, l + 32 (one L2 line, shared by the warps) and a ballot a mask and word gathers
    them, so no barrier and no shared memory; the masks are uniform over the workgroup."""
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    lane = g.rem(tid, 32)
    everyone = arith.constant(i32, -1)
    masks: dict[str, ir.Value] = {}
    for w in range(-(-nk // 32)):
        col = g.add(lane, 32 * w)
        code = memref.load(table, [qblock, arith.minui(col, g.c(nk - 1))])
        inside = g.lt(col, nk) if nk < 32 * (w + 1) else None
        preds = {"live": arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(i32, DEAD)),
                 "whole": arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(i32, WHOLE)),
                 "causal": arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(i32, CAUSAL))}
        for name in names:
            pred = preds[name]
            if inside is not None:
                pred = arith.andi(inside, pred)
            word = arith.extui(i64, nvvm.vote_sync(i32, everyone, pred, nvvm.VoteSyncKind.ballot))
            if w:
                word = arith.shli(word, arith.constant(i64, 32 * w))
            masks[name] = arith.ori(masks[name], word) if name in masks else word
    return masks


def walk_classes() -> tuple[str, ...]:
    """The ``table_masks`` a walk over live blocks reads."""
    return ("live", "whole", "causal")


def every_block(nk: int) -> ir.Value:
    """The i64 bit mask of all nk key blocks (a pass that skips none)."""
    return arith.constant(ir.IntegerType.get_signless(64), (1 << nk) - 1 if nk < 64 else -1)


def rows_dead(g: GpuFunc, table: ir.Value, qblock: ir.Value, nk: int, tid: ir.Value) -> ir.Value:
    """The persistent walk: whether a query row of the workgroup's block sees no live score in
    any key block (the table's row words, ``ROW_WORDS`` a block, ORed over the blocks:
    lane l of every warp loads blocks l, l + 32, ..., and ``redux.sync`` ORs the warp's):
    uniform over the workgroup, no barrier. Such a row's softmax is over its fills, so
    the walk must visit every block."""
    i32 = ir.IntegerType.get_signless(32)
    lane = g.rem(tid, 32)
    zero, everyone = arith.constant(i32, 0), arith.constant(i32, -1)
    words = [zero] * ROW_WORDS
    for w in range(-(-nk // 32)):
        col = g.add(lane, 32 * w)
        at = g.add(g.mul(arith.minui(col, g.c(nk - 1)), ROW_WORDS), nk)
        for h in range(ROW_WORDS):
            x = memref.load(table, [qblock, g.add(at, h)])
            if nk < 32 * (w + 1):
                x = arith.select(g.lt(col, nk), x, zero)
            words[h] = arith.ori(words[h], x)
    dead = arith.constant(ir.IntegerType.get_signless(1), 0)
    for word in words:
        seen = nvvm.redux_sync(i32, word, nvvm.ReduxKind.OR, everyone)
        dead = arith.ori(dead, arith.cmpi(arith.CmpIPredicate.ne, seen, everyone))
    return dead


def live_count(walk: ir.Value) -> ir.Value:
    """The blocks a walk visits: its bits (an index)."""
    return arith.index_cast(ir.IndexType.get(), llvm.intr_ctpop(walk))


def live_after(walk: ir.Value, j: ir.Value) -> ir.Value:
    """The walk's blocks past block j (its bits above bit j)."""
    return arith.andi(walk, arith.shli(arith.constant(ir.IntegerType.get_signless(64), -2), j))


def walk_classes_of(masks: dict[str, ir.Value], j: ir.Value) -> tuple[ir.Value | None, ir.Value | None]:
    """Block j's (unmasked, causal) for ``classified_softmax`` (None where not told apart)."""
    kinds = block_kinds(masks, j)
    return kinds.get("unmasked"), kinds.get("causal")


def block_kinds(masks: dict[str, ir.Value], j: ir.Value) -> dict[str, ir.Value]:
    """Block j's classes as ``key_block``'s keywords: ``unmasked`` (whole) and ``causal``."""
    i1 = ir.IntegerType.get_signless(1)
    return {"unmasked": arith.trunci(i1, arith.shrui(masks["whole"], j)),
            "causal": arith.trunci(i1, arith.shrui(masks["causal"], j))}


def cttz(x: ir.Value) -> ir.Value:
    """The lowest set bit's index of an i64 (64 for 0; math.cttz and ctpop have no NVVM
    lowering in MLIR 22)."""
    return llvm.intr_cttz(x, False)


def block_start(g: GpuFunc, j: ir.Value, bn: int) -> ir.Value:
    """Key block j's (i64) first key, as an index."""
    return g.mul(arith.index_cast(ir.IndexType.get(), j), bn)
