"""The Hopper backward's producer warpgroup: K and V of the key block once (on the
barrier after the stages'), then per step (a query block the key block visits; under a
mask those ``walk`` keeps) the query block's Q and dO, and its D and logsumexp from the
workspace, into the step's stage once the consumers gave it back
(``nvidia.barriers.StageBarriers``), with cp.async; each thread arrives on the stage's
full barrier as its copies land. It keeps ``PRODUCER_REGISTERS`` of its registers."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm

from ....nvidia import wgmma as _wg
from ...hopper.producer import PRODUCER_REGISTERS
from .plan import STAGES
from .walk import visit_mask, walk


class Producer:
    """The producer of the backward ``k`` (a HopperBackward): its last 128 threads."""

    def __init__(self, k):
        self.k = k

    def run(self) -> None:
        k = self.k
        g, ch = k.g, k.ch
        D, bm = k.D, k.bm
        nvvm.SetMaxRegisterOp(PRODUCER_REGISTERS, ir.Attribute.parse("#nvvm<action decrease>"))
        ptid = arith.subi(k.tid, g.c(256))

        def tile(mem, direct, rows, n_rows):
            return _wg.SwizzledTile(g, ptid, 128, mem, direct, rows, D, 2, n_rows, D, False, width=D, lean=True,
                                    producer=True)

        k_tile, v_tile = tile(k.Ks, k.k_direct, k.bn, ch.seq_k), tile(k.Vs, k.v_direct, k.bn, ch.seq_k)
        k_tile.copy_async(k.n0, 0, 0)
        v_tile.copy_async(k.n0, 0, 0)
        k.barriers.arrive_q()
        q_tile, do_tile = tile(k.Qs, k.q_direct, bm, ch.seq_q), tile(k.dOs, k.do_direct, bm, ch.seq_q)
        chunks = bm * 4 // 16  # 16-byte pieces of a block's D (and of its logsumexp)
        layout = k.plan.layout

        def step(it, m, _):
            stage = g.rem(it, STAGES)
            m0 = g.mul(m, bm)
            k.barriers.wait_empty(it)
            q_tile.copy_async(m0, 0, stage)
            do_tile.copy_async(m0, 0, stage)

            def stats():
                kind, piece = g.div(ptid, chunks), g.rem(ptid, chunks)
                at = arith.addi(arith.addi(k.row_of(m0), g.mul(piece, 4)),
                                arith.select(arith.cmpi(arith.CmpIPredicate.eq, kind, g.c(0)), g.c(layout.d_at),
                                             g.c(layout.lse_at)))
                src = llvm.inttoptr(ir.Type.parse("!llvm.ptr<1>"), k.ws_address(at))
                i64 = ir.IntegerType.get_signless(64)
                row = arith.addi(g.mul(stage, 2), kind)
                base = arith.index_cast(i64, memref.extract_aligned_pointer_as_index(k.stats))
                off = arith.index_cast(i64, g.mul(arith.addi(g.mul(row, bm), g.mul(piece, 4)), 4))
                dst = llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), arith.addi(base, off))
                nvvm.CpAsyncOp(dst, src, 16, ir.Attribute.parse("#nvvm<load_cache_modifier cg>"))

            g.when(g.lt(ptid, 2 * chunks), stats)
            k.barriers.arrive_full(stage)
            return []

        walk(k, visit_mask(k) if k.plan.masked else None, [], step)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)
