"""The producer warpgroup: FlashAttention-3's warp specialization, with cp.async where it
has TMA. A third warpgroup issues every copy of Q, K and V, and the two consumer
warpgroups only compute. Each stage has two mbarriers (``nvidia.barriers.StageBarriers``):
*full*, which the producer's 128 threads arrive on as their copies of a block land
(``cp.async.mbarrier.arrive.noinc``), and *empty*, which the 256 consumer threads arrive
on once their P V of the block is complete. The consumers then no longer meet at a
barrier per block and carry no copy addresses, and the producer gives them its registers
(``setmaxnreg``: ``CONSUMER_REGISTERS`` a consumer thread, ``PRODUCER_REGISTERS`` a
producer one).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm, scf

from ...nvidia import wgmma as _wg
from .block_table import block_start, cttz, every_block, live_after, live_count, rows_dead, table_masks, walk_classes

#: Registers a thread of the consumer and of the producer warpgroups (``setmaxnreg``;
#: multiples of 8, 2 x 128 x 240 + 128 x 24 = 64512 of the SM's 65536).
CONSUMER_REGISTERS, PRODUCER_REGISTERS = 240, 24


def opaque_tid() -> ir.Value:
    """The thread's index (x) as an index, read by inline PTX with side effects: LLVM
    neither hoists it out of a loop nor merges it with another read, so what is computed
    from it stays where it is used (``gpu.thread_id`` is a pure intrinsic)."""
    i32 = ir.IntegerType.get_signless(32)
    r = llvm.InlineAsmOp(i32, [], "mov.u32 $0, %tid.x;", "=r", has_side_effects=True).res
    return arith.index_cast(ir.IndexType.get(), r)


class Producer:
    """The producer warpgroup of the kernel ``k`` (a HopperAttention): the last 128
    threads."""

    def __init__(self, k):
        self.k = k

    def tiles(self):
        """The producer's copies of the tile placed (``place_tile``): Q, K, V. In
        persistent kernels their per-thread offsets come from a thread index read anew
        (``opaque_tid``), so that they are computed in each tile rather than hoisted out
        of the tile loop and held in the producer's 24 registers (ptxas spilled 16 to 128
        bytes)."""
        k = self.k
        g = k.g
        ptid = arith.subi(opaque_tid() if k.reuses_q else k.tid, g.c(k.threads - 128))
        # persistent: lean too (ptxas keeps per-copy addresses through the tile loop)
        q_p = _wg.SwizzledTile(g, ptid, 128, k.Qs, k.q_direct, k.bm, k.D, k.esize, k.Sq, k.D, False, width=k.D,
                               lean=k.reuses_q, producer=k.reuses_q)
        # per-copy addresses spilled at 24 registers (528 bytes, 333 keys)
        return (q_p, *k.kv_tiles(ptid, 128, True, producer=True))

    def copy(self, i, n0, k_p, v_p):
        """The producer's copies of key block n0 into the stage of the pipeline's i-th
        block, once its last block there is given back."""
        k = self.k
        stage = k.g.rem(i, k.stages)
        k.barriers.wait_empty(i)
        k_p.copy_async(n0, 0, stage)
        v_p.copy_async(0, n0, stage)
        k.barriers.arrive_full(stage)

    def copy_walk(self, walk, k_p, v_p, base=None):
        """The producer's copies of a walk's blocks: its i-th (cttz of the bits above the
        last) into the stage of the pipeline's block i (the persistent walk: base + i)."""
        g = self.k.g
        loop = scf.ForOp(g.c(0), live_count(walk), g.c(1), [cttz(walk)])
        with ir.InsertionPoint(loop.body):
            j, i = loop.inner_iter_args[0], loop.induction_variable
            self.copy(i if base is None else arith.addi(base, i), block_start(g, j, self.k.bn), k_p, v_p)
            scf.yield_([cttz(live_after(walk, j))])

    def run(self, walk_of=None):
        """Q, then each key block's K and V into stage j % 3 once its empty mbarrier says
        the consumers are done with block j - 3, its full one arrived on as the copies
        land. ``walk_of()``: the i64 bit mask of the blocks to copy (the i-th set bit's
        into stage i % 3); Q then has a barrier of its own. Persistent: the workgroup's
        tiles one after another, the next tile's Q copied as soon as the consumers give
        the last one's back."""
        k = self.k
        g = k.g
        nvvm.SetMaxRegisterOp(PRODUCER_REGISTERS, ir.Attribute.parse("#nvvm<action decrease>"))
        walk = walk_of() if walk_of is not None else None

        def key_blocks(k_p, v_p):
            def block(n0, _):
                self.copy(g.div(n0, k.bn), n0, k_p, v_p)
                return []

            g.loop(0, k.Sk, k.bn, [], block)

        if k.scheduler.persistent:
            self._persistent_tiles()
        else:
            q_p, k_p, v_p = self.tiles()
            q_p.copy_async(k.q0, 0, 0)
            if walk is None:
                key_blocks(k_p, v_p)
            else:
                k.barriers.arrive_q()
                self.copy_walk(walk, k_p, v_p)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)

    def _persistent_tiles(self):
        """One loop over the workgroup's tiles' key blocks, i = t x blocks + j: nested,
        LLVM unrolled a short inner loop, and ptxas spilled (108 bytes, fp8 with three key
        blocks)."""
        k = self.k
        g = k.g
        n_blocks = k.n_blocks
        grid = gpu.grid_dim(gpu.Dimension.x)
        mine = arith.divui(arith.addi(arith.subi(g.c(k.scheduler.n_tiles), g.bid("x")),
                                      arith.subi(grid, g.c(1))), grid)
        # (an i32 count: as an index, ptxas spilled its 64 bits at 333 keys)
        i32 = ir.IntegerType.get_signless(32)
        loop = scf.ForOp(arith.constant(i32, 0), arith.index_cast(i32, g.mul(mine, n_blocks)),
                         arith.constant(i32, 1), [])
        with ir.InsertionPoint(loop.body):
            i = arith.index_cast(ir.IndexType.get(), loop.induction_variable)
            nth, j = g.div(i, n_blocks), g.rem(i, n_blocks)
            t = arith.addi(g.bid("x"), arith.muli(nth, grid))
            k.place_tile(t)
            q_p, k_p, v_p = self.tiles()

            def tile_start():  # Q lands with the tile's first block (its full barrier)
                k.barriers.wait_q_free(nth)
                q_p.copy_async(k.q0, 0, 0)

            g.when(arith.cmpi(arith.CmpIPredicate.eq, j, g.c(0)), tile_start)
            self.copy(i, g.mul(j, k.bn), k_p, v_p)
            scf.yield_([])

    def run_walk(self):
        """The persistent walk's producer: claims tiles (``TileScheduler.claimed``) until
        none is left. A tile: its row of the block table (the walk: its live blocks, or
        every block where a query row sees no live score, ``rows_dead``), Q copied once
        the consumers gave the last tile's back, the tile and its masks handed to them in
        shared memory on Q's barrier (``announce_q``), then the walk's K and V as ``run``
        copies them; the stages' phases run on across tiles (``base``). At the end the
        consumers get a tile past the last."""
        k = self.k
        g, sched = k.g, k.scheduler
        nvvm.SetMaxRegisterOp(PRODUCER_REGISTERS, ir.Attribute.parse("#nvvm<action decrease>"))
        idx, i64 = ir.IndexType.get(), ir.IntegerType.get_signless(64)
        nq, heads, _ = sched.walk
        leader = arith.cmpi(arith.CmpIPredicate.eq, k.tid, g.c(k.threads - 128))
        nk = k.table_shape[1]
        loop = scf.WhileOp([idx, idx, idx], [g.c(0), g.c(0)])
        before = loop.before.blocks.append(idx, idx)
        with ir.InsertionPoint(before):
            nth, base = before.arguments
            u = sched.claimed(nth, leader)
            scf.condition(g.lt(u, nq * heads), [nth, base, u])
        after = loop.after.blocks.append(idx, idx, idx)
        with ir.InsertionPoint(after):
            nth, base, u = after.arguments
            k.place_tile(u)
            masks = table_masks(g, k.table, k.qblock, nk, k.tid, walk_classes())
            walk = arith.select(rows_dead(g, k.table, k.qblock, nk, k.tid), every_block(nk), masks["live"])
            q_p, k_p, v_p = self.tiles()
            k.barriers.wait_q_free(nth)
            q_p.copy_async(k.q0, 0, 0)
            k.barriers.arrive_q()

            def announce():
                none = arith.constant(i64, 0)
                for slot, v in enumerate((arith.index_cast(i64, u), walk, masks.get("whole", none),
                                          masks.get("causal", none))):
                    memref.store(v, k.barrier_mem, sched.info(slot))
                k.barriers.announce_q()

            g.when(leader, announce)
            self.copy_walk(walk, k_p, v_p, base)
            scf.yield_([g.add(nth, 1), arith.addi(base, live_count(walk))])
        nth, u = loop.results[0], loop.results[2]
        k.barriers.wait_q_free(nth)  # the end, as a tile past the last, with Q's arrivals
        k.barriers.arrive_q()

        def end():
            memref.store(arith.index_cast(i64, u), k.barrier_mem, sched.info(0))
            k.barriers.announce_q()

        g.when(leader, end)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)
