"""The consumer warpgroups' key loops: per key block, S = Q K^T, the softmax, O += P V.

With the producer warpgroup (three stages), ``pipelined`` is FlashAttention-3's
intra-warpgroup pipeline: block j's S and block j - 1's P V are issued together, S is
waited for alone before its softmax, P V after it; a block is waited for on its full
mbarrier and its stage given back on its empty one. A mask every head shares walks the
block table's live blocks (``walk``, ``persistent_walk``): whole and causal blocks take
the linear softmax, partial ones read the mask. Without the producer (two stages, or
three without the overlap of P V), the consumers copy K and V themselves, a block ahead
(``two_stages``, ``overlapped``), and a mask that is not shared by every head, or a table
of more than ``TABLE_WALK_MAX_BLOCKS`` blocks, takes the per-block skipping loop
(``skipping``).
"""

from __future__ import annotations

import functools

from mlir import ir
from mlir.dialects import arith, gpu, memref, nvvm, scf

from ...nvidia.barriers import NamedBarrier, block_reduce
from ..skipping import skipping_loop, two_pass_loop
from .block_table import (CAUSAL, DEAD, WHOLE, block_kinds, block_start, cttz, every_block, live_after, live_count,
                          table_masks, walk_classes, walk_classes_of)
from .epilogue import store_output
from .plan import TABLE_WALK_MAX_BLOCKS
from .softmax import lazy_threshold, uniform


class Consumer:
    """The consumer warpgroups of the kernel ``k`` (a HopperAttention): its key loops,
    each returning (m, l, O) of its tile or storing it."""

    def __init__(self, k):
        self.k = k

    def key_loop(self, start: int, carried, step):
        """The key loop from key ``start`` to the keys' length, a block a trip
        (``g.loop``). At a run-time length it is two loops: the blocks within the keys,
        whose linear softmax has no tail guard (``BlockSoftmax.whole``), then the last,
        partial or whole, with the guard; the same body in both, so no value passes a
        branch. With the guard in every block, the head dim 64 kernel ran about 100 more
        instructions a block than the static one. A static length with a tail keeps one
        loop: there the two made the head dim 64 kernel with a logsumexp (257 keys)
        spill 8 bytes at its 128 registers."""
        k = self.k
        g, bn, seq = k.g, k.bn, k.Sk
        if isinstance(seq, int) or k.softmax.linear is None:
            return g.loop(start, seq, bn, carried, step)
        # the blocks within the keys end at the last block's start: floor((Sk - 1) / bn) bn
        last = g.mul(g.div(arith.subi(arith.maxui(seq, g.c(1)), g.c(1)), bn), bn)
        split = arith.maxui(last, g.c(start))
        k.softmax.whole = True
        try:
            carried = g.loop(start, last, bn, carried, step)
        finally:
            k.softmax.whole = False
        return g.loop(split, seq, bn, carried, step)

    def key_block(self, n0, carried, stage=None, unmasked=None, causal=None, scores=None):
        """One key block; ``stage``: the block is already in that stage (the pipelined
        loops). Without, it is staged here into stage 0. ``unmasked``: whether the mask
        leaves the whole block alone (its scores then skip it); ``causal``: whether it is
        the causal pattern there (computed, not read). ``scores``: its S accumulator,
        issued earlier (``overlapped``) and complete; the wgmma wait at the end then also
        completes the next block's."""
        k = self.k
        g, mma, sm = k.g, k.mma, k.softmax
        m, l, o = carried[0:2], carried[2:4], carried[4]
        if stage is None:
            k.sync()  # the previous block's readers are done
            k.k_tile.copy_async(n0, 0, 0)
            k.v_tile.copy_async(0, n0, 0)
            nvvm.cp_async_commit_group()
            nvvm.cp_async_wait_group(0)
            k.fence_and_publish()
            stage = g.c(0)
        acc = scores
        if acc is None:
            acc = mma.issue_scores(stage)
            nvvm.wgmma_wait_group_sync_aligned(0)
        m_new, l_new, alpha, p = sm.classified(n0, acc, m, l, unmasked, causal)
        o = sm.rescale(o, alpha)
        nvvm.wgmma_fence_aligned()  # before P's rounding, as ptxas then needs fewer registers
        o = mma.issue_pv(o, mma.p_operands(p), stage, fence=False)
        nvvm.wgmma_wait_group_sync_aligned(0)
        return m_new + l_new + [o]

    def first_scores(self, base=None):
        """The three-stage loops' start: blocks 0 and 1 copied into stages 0 and 1 (block
        0 with Q; by the producer where there is one), block 0's S = Q K^T computed and
        waited for. ``base``: block 0 is the pipeline's block base (persistent)."""
        k = self.k
        g, bn = k.g, k.bn
        if k.barriers is not None:
            k.barriers.wait_full(g.c(0) if base is None else base)
        else:
            for j in range(2):
                k.k_tile.copy_async(j * bn, 0, j)
                k.v_tile.copy_async(0, j * bn, j)
                nvvm.cp_async_commit_group()  # block 0 with Q
            nvvm.cp_async_wait_group(1)
            k.fence_and_publish()
        first = k.mma.issue_scores(g.c(0) if base is None else g.rem(base, 3))
        nvvm.wgmma_wait_group_sync_aligned(0)
        return first

    def pipelined(self, walk=None, classes=None, base=None):
        """The producer/consumer kernel's key loop (FlashAttention-3's intra-warpgroup
        pipeline): block j's S and block j - 1's O += P V are issued together, S is waited
        for alone before its softmax, P V after it. K and V in three stages: j - 1 (V read
        by P V), j (K read by S), j + 1 (copies in flight). ptxas hoists the wait for P V
        above the softmax's exponentials (the row maxima overlap P V, the rest does not;
        seen in the SASS, not in the PTX); waiting for it at the top of the next iteration
        instead kept the whole softmax in the overlap but was slower. P_j is rounded after
        the wait: its loop-carried registers are those P V of block j - 1 reads, and ptxas
        serializes every wgmma (C7513) where an instruction writes them before that P V is
        done.

        ``walk`` (with the block table): the live key blocks only, an i64 bit mask with at
        least one bit set; the i-th of them is in stage i % 3, and ``classes(j)`` gives
        block j's (unmasked, causal) for ``BlockSoftmax.classified``. ``base``
        (persistent kernels): key block j (the walk's j-th block) is the pipeline's block
        base + j; Q is given back once the tile's last S is complete, and the last block
        after its P V."""
        k = self.k
        if walk is not None:
            return self._pipelined_walk(walk, classes, base)
        g, bn, mma, sm, barriers, init = k.g, k.bn, k.mma, k.softmax, k.barriers, k.init
        lazy = lazy_threshold(k.elem, k.p_scale, sm.log2_p) if sm.linear is not None else None
        first = self.first_scores(base)
        m, l, _, p = sm.block(g.c(0), first, init[0:2], init[2:4])[:4]
        carried = m + l + [init[4]] + mma.packed(p)

        def step(n0, c):
            m, l, o, a = c[0:2], c[2:4], c[4], c[5:]
            j = g.div(n0, bn)
            if base is not None:
                j = arith.addi(base, j)
            barriers.wait_full(j)
            acc = mma.issue_scores(g.rem(j, 3))
            o = mma.issue_pv(o, a, g.rem(g.add(j, 2), 3))  # block j - 1
            nvvm.wgmma_wait_group_sync_aligned(1)  # S (groups complete in order)
            if base is not None:  # the tile's last S is complete: Q may be refilled
                g.when(arith.cmpi(arith.CmpIPredicate.eq, n0, g.c((k.n_blocks - 1) * bn)), barriers.release_q)
            out = sm.block(n0, acc, m, l, lazy=lazy)
            m, l, alpha, p = out[:4]
            nvvm.wgmma_wait_group_sync_aligned(0)
            barriers.release(arith.subi(j, g.c(1)))  # block j - 1 is read
            return m + l + [sm.rescaled(o, alpha, out[4] if lazy else None)] + mma.packed(p)

        c = self.key_loop(bn, carried, step)
        if base is not None:
            last = g.add(base, k.n_blocks - 1)
            o = mma.issue_pv(c[4], c[5:], g.rem(last, 3))
        elif isinstance(k.n_blocks, int):
            o = mma.issue_pv(c[4], c[5:], g.c((k.n_blocks - 1) % 3))
        else:  # run-time keys: the last block's stage
            o = mma.issue_pv(c[4], c[5:], g.rem(arith.subi(k.n_blocks, g.c(1)), 3))
        nvvm.wgmma_wait_group_sync_aligned(0)
        if base is not None:
            barriers.release(last)
        return c[0:4] + [o]

    def _pipelined_walk(self, walk, classes, base):
        """``pipelined`` over a walk's live blocks (see there)."""
        k = self.k
        g, bn, mma, sm, barriers, init = k.g, k.bn, k.mma, k.softmax, k.barriers, k.init

        def at(i):  # the pipeline's index of the walk's i-th block
            return i if base is None else arith.addi(base, i)

        count = live_count(walk)
        j0 = cttz(walk)
        barriers.wait_full(at(g.c(0)))
        first = mma.issue_scores(g.c(0) if base is None else g.rem(base, 3))
        nvvm.wgmma_wait_group_sync_aligned(0)
        if base is not None:  # a walk of one block: its S was the tile's last
            g.when(arith.cmpi(arith.CmpIPredicate.eq, count, g.c(1)), barriers.release_q)
        m, l, _, p = sm.classified(block_start(g, j0, bn), first, init[0:2], init[2:4], *classes(j0))
        carried = m + l + [init[4]] + mma.packed(p) + [j0]

        def walked(i, c):
            """The i-th live block (i >= 1) after block c[-1]."""
            m, l, o, a, prev = c[0:2], c[2:4], c[4], c[5:-1], c[-1]
            j = cttz(live_after(walk, prev))
            barriers.wait_full(at(i))
            acc = mma.issue_scores(g.rem(at(i), 3))
            o = mma.issue_pv(o, a, g.rem(g.add(at(i), 2), 3))  # the block before
            nvvm.wgmma_wait_group_sync_aligned(1)
            if base is not None:
                g.when(arith.cmpi(arith.CmpIPredicate.eq, i, arith.subi(count, g.c(1))), barriers.release_q)
            m, l, alpha, p = sm.classified(block_start(g, j, bn), acc, m, l, *classes(j))
            nvvm.wgmma_wait_group_sync_aligned(0)
            barriers.release(arith.subi(at(i), g.c(1)))
            return m + l + [sm.rescale(o, alpha)] + mma.packed(p) + [j]

        loop = scf.ForOp(g.c(1), count, g.c(1), carried)
        with ir.InsertionPoint(loop.body):
            scf.yield_(walked(loop.induction_variable, list(loop.inner_iter_args)))
        c = list(loop.results)
        o = mma.issue_pv(c[4], c[5:-1], g.rem(arith.addi(at(count), g.c(2)), 3))
        nvvm.wgmma_wait_group_sync_aligned(0)
        if base is not None:
            barriers.release(arith.subi(at(count), g.c(1)))
        return c[0:4] + [o]

    def unmasked(self):
        """The producer/consumer kernel without a mask: each tile's blocks ``pipelined``,
        the tiles in turn where the plan is persistent."""
        k = self.k
        if k.scheduler.persistent:
            k.scheduler.tile_loop(lambda i: store_output(k, self.pipelined(base=k.g.mul(i, k.n_blocks))))
        else:
            store_output(k, self.pipelined())

    def walk(self):
        """The table walk's consumers: the first pass over the live blocks as the producer
        copies them (``pipelined``); the second, rare (``two_pass_loop``: a query row
        masked everywhere), over every block, copied by the consumers themselves into
        stage 0, as ``key_block`` does."""
        k = self.k
        g, init = k.g, k.init
        masks = table_masks(g, k.table, k.qblock, k.table_shape[1], k.tid, walk_classes())
        types = [v.type for v in init]
        k.barriers.wait_q()
        classes = functools.partial(walk_classes_of, masks)

        def run_pass(allow):
            state = g.guarded(allow, types, lambda: self._walk_first_pass(masks, classes, types),
                              lambda: self._every_block(masks))
            return state, arith.cmpi(arith.CmpIPredicate.ne, masks["live"], every_block(k.table_shape[1]))

        consumers = (int(NamedBarrier.CONSUMERS), 256)
        store_output(k, two_pass_loop(g, k.ch, init, k.rows, k.bm, run_pass,
                                      reduce=lambda pred: block_reduce(pred, barrier=consumers)))

    def _walk_first_pass(self, masks, classes, types):
        k = self.k
        g = k.g
        if k.Sq % k.bm or k.Sk % k.bn:  # tails: the overlap's guards spilled
            return self._serial(masks, masks["live"])
        live = arith.cmpi(arith.CmpIPredicate.ne, masks["live"], arith.constant(ir.IntegerType.get_signless(64), 0))
        return g.guarded(live, types, lambda: self.pipelined(masks["live"], classes), lambda: list(k.init))

    def _serial(self, masks, walk):
        """The live blocks, each one's P V waited for before the next block's S."""
        k = self.k
        g = k.g
        loop = scf.ForOp(g.c(0), live_count(walk), g.c(1), list(k.init) + [cttz(walk)])
        with ir.InsertionPoint(loop.body):
            i, c = loop.induction_variable, list(loop.inner_iter_args)
            j = c[-1]
            k.barriers.wait_full(i)
            out = self.key_block(block_start(g, j, k.bn), c[:-1], stage=g.rem(i, 3), **block_kinds(masks, j))
            k.barriers.release(i)
            scf.yield_(out + [cttz(live_after(walk, j))])
        return list(loop.results)[:-1]

    def _every_block(self, masks):
        """The second pass: every block, copied by the consumers. Their copy addresses are
        made here: from the kernel's start they were registers through the first pass
        (ptxas spilled 176 bytes)."""
        k = self.k
        g = k.g
        i64 = ir.IntegerType.get_signless(64)
        k.k_tile, k.v_tile = k.kv_tiles(k.tid, 256, False)

        def step(n0, c):
            return self.key_block(n0, c, **block_kinds(masks, arith.index_cast(i64, g.div(n0, k.bn))))
        return g.loop(0, k.Sk, k.bn, list(k.init), step)

    def persistent_walk(self):
        """The persistent walk's consumers: a tile as the producer hands it over on Q's
        barrier (its i-th fill), its walk ``pipelined`` and its O stored, until the tile
        handed over is past the last."""
        k = self.k
        g, sched = k.g, k.scheduler
        idx = ir.IndexType.get()
        i64 = ir.IntegerType.get_signless(64)
        nq, heads, _ = sched.walk
        loop = scf.WhileOp([idx, idx, idx, i64, i64, i64], [g.c(0), g.c(0)])
        before = loop.before.blocks.append(idx, idx)
        with ir.InsertionPoint(before):
            nth, base = before.arguments
            k.barriers.wait_q(nth)
            u = arith.index_cast(idx, memref.load(k.barrier_mem, sched.info(0)))
            masks = [memref.load(k.barrier_mem, sched.info(slot)) for slot in (1, 2, 3)]
            scf.condition(g.lt(u, nq * heads), [nth, base, u] + masks)
        after = loop.after.blocks.append(idx, idx, idx, i64, i64, i64)
        with ir.InsertionPoint(after):
            nth, base, u, walk, whole, causal = after.arguments
            k.place_tile(u)
            classes = functools.partial(walk_classes_of, {"live": walk, "whole": whole, "causal": causal})
            store_output(k, self.pipelined(walk, classes, base=base))
            scf.yield_([g.add(nth, 1), arith.addi(base, live_count(walk))])

    # ---- without a producer warpgroup: the consumers copy

    def two_stages(self):
        """K and V double-buffered: each block waits for its copies, passes one barrier
        (after which nobody reads the other stage) and issues the next block's."""
        k = self.k
        g, bn = k.g, k.bn
        k.k_tile.copy_async(0, 0, 0)
        k.v_tile.copy_async(0, 0, 0)
        nvvm.cp_async_commit_group()

        def step(n0, carried):
            j = g.div(n0, bn)
            nvvm.cp_async_wait_group(0)
            k.fence_and_publish()  # also: every warpgroup is done with the other stage
            nxt = g.rem(g.add(j, 1), 2)
            n1 = g.add(n0, bn)
            k.k_tile.copy_async(n1, 0, nxt)
            k.v_tile.copy_async(0, n1, nxt)
            nvvm.cp_async_commit_group()
            return self.key_block(n0, carried, g.rem(j, 2))

        return self.key_loop(0, k.init, step)

    def overlapped(self):
        """Block j + 1's S = Q K^T runs on the tensor cores during block j's softmax
        (FlashAttention-3's intra-warpgroup overlap, without the overlap of P V). Three
        stages: j (its V read by P V), j + 1 (its K by the early S), j + 2 (copies in
        flight)."""
        k = self.k
        g, bn = k.g, k.bn
        first = self.first_scores()

        def step(n0, carried):
            j = g.div(n0, bn)
            nvvm.cp_async_wait_group(0)  # block j + 1
            # and every warpgroup is done with block j - 1's stage, (j + 2) % 3
            k.fence_and_publish()
            n2 = g.add(n0, 2 * bn)  # past the keys: zero-filled, never read
            k.k_tile.copy_async(n2, 0, g.rem(g.add(j, 2), 3))
            k.v_tile.copy_async(0, n2, g.rem(g.add(j, 2), 3))
            nvvm.cp_async_commit_group()
            # the last block's early S is of a zero-filled stage, and unused
            nxt = k.mma.issue_scores(g.rem(g.add(j, 1), 3))
            return self.key_block(n0, carried[:-1], g.rem(j, 3), scores=carried[-1]) + [nxt]

        return self.key_loop(0, k.init + [first], step)[:-1]

    def skipping(self):
        """A mask's key loop in two stages: the walk over the table's live blocks
        (``table_walk``) up to ``TABLE_WALK_MAX_BLOCKS`` key blocks; else every block, its
        class from the table, or from the workgroup's own test of the mask where there is
        no table (a mask per batch), dead blocks skipped (``skipping_loop``)."""
        k = self.k
        g, bn, table = k.g, k.bn, k.table

        def start_pass():
            """The first block's K and V into stage 0, with Q on the first pass."""
            nvvm.cp_async_wait_group(0)  # a previous pass's last prefetch
            k.k_tile.copy_async(0, 0, 0)
            k.v_tile.copy_async(0, 0, 0)
            nvvm.cp_async_commit_group()

        def table_at(j):
            return memref.load(table, [k.qblock, j])

        def block_class(n0):
            """(live, whole, causal) of a block, from the table: uniform, no test."""
            code = table_at(g.div(n0, bn))
            return (arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(code.type, DEAD)),
                    arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(code.type, WHOLE)),
                    arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(code.type, CAUSAL)))

        def stage_block(n0, allow):
            """The next block's copies into the other stage, and the wait for this block's
            (issued a block earlier). With the block table, the next block's K and V are
            copied only if it is live (or nothing is skipped: ``allow`` false, the second
            pass)."""
            j = g.div(n0, bn)
            cur, nxt, n1 = g.rem(j, 2), g.rem(g.add(j, 1), 2), g.add(n0, bn)
            gpu.barrier()  # every reader of the other stage is done
            nvvm.cp_async_commit_group()

            def copy_next():
                k.k_tile.copy_async(n1, 0, nxt)
                k.v_tile.copy_async(0, n1, nxt)

            if table is None:
                copy_next()
            else:
                last = k.table_shape[1] - 1
                code = table_at(arith.minui(g.add(j, 1), g.c(last)))
                live = arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(code.type, DEAD))
                fetch = arith.andi(g.lt(g.add(j, 1), last + 1),
                                   arith.ori(live, arith.xori(allow, arith.constant(allow.type, 1))))
                g.when(fetch, copy_next)
            nvvm.cp_async_commit_group()
            nvvm.cp_async_wait_group(1)
            k.fence_and_publish()
            return cur

        if table is not None and k.table_shape[1] <= TABLE_WALK_MAX_BLOCKS:
            return self.table_walk()
        return skipping_loop(g, k.pw, k.ch, self.key_block, k.init, k.rows, k.tig2, k.bm, bn, k.s_lead,
                             stage_block, start_pass, whole_blocks=True,
                             block_class=block_class if table is not None else None, uniform=uniform)

    def table_walk(self):
        """The key loop over the live blocks only, from the table's bit masks
        (``table_masks``), in the skipping loop's two passes (``two_pass_loop``: the
        second, over every block, only for a workgroup with a query row masked
        everywhere). The i-th block walked is in stage i % 2; each step waits for its own
        copies, fences them for the async proxy and passes one barrier (after which nobody
        reads the other stage), then issues the next live block's copies into the other
        stage (the lowest set bit above this block: cttz) and computes. Whole and causal
        blocks are told so (``key_block(..., unmasked=, causal=)``); the table is not read
        again."""
        k = self.k
        g, bn, nk = k.g, k.bn, k.table_shape[1]
        i64 = ir.IntegerType.get_signless(64)
        masks = table_masks(g, k.table, k.qblock, nk, k.tid, walk_classes())
        every = every_block(nk)

        def copy_block(n0, stage):
            k.k_tile.copy_async(n0, 0, stage)
            k.v_tile.copy_async(0, n0, stage)

        def run_pass(allow):
            walk = arith.select(allow, masks["live"], every)
            count = live_count(walk)
            first = cttz(walk)
            nvvm.cp_async_wait_group(0)  # a previous pass's last prefetch
            g.when(arith.cmpi(arith.CmpIPredicate.ugt, count, g.c(0)),
                   lambda: copy_block(block_start(g, first, bn), g.c(0)))
            nvvm.cp_async_commit_group()  # with Q's copies on the first pass
            loop = scf.ForOp(g.c(0), count, g.c(1), list(k.init) + [first])
            with ir.InsertionPoint(loop.body):
                i, carried = loop.induction_variable, list(loop.inner_iter_args)
                state, j = carried[:-1], carried[-1]
                nvvm.cp_async_wait_group(0)  # this block's K and V
                k.fence_and_publish()  # and every reader of the other stage is done
                later = live_after(walk, j)
                nxt = cttz(later)
                g.when(arith.cmpi(arith.CmpIPredicate.ne, later, arith.constant(i64, 0)),
                       lambda: copy_block(block_start(g, nxt, bn), g.rem(g.add(i, 1), 2)))
                nvvm.cp_async_commit_group()
                scf.yield_(self.key_block(block_start(g, j, bn), state, stage=g.rem(i, 2), **block_kinds(masks, j))
                           + [nxt])
            state = list(loop.results)[:-1]
            return state, arith.cmpi(arith.CmpIPredicate.ne, walk, every)

        return two_pass_loop(g, k.ch, k.init, k.rows, k.bm, run_pass)
