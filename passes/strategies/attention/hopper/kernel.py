"""The Hopper attention kernel as an object: the state its parts share.

``HopperAttention`` holds what every part of the kernel reads -- the plan, the gpu.func
being written, the shared-memory tiles and their descriptors, the barriers, the thread's
place in its warpgroup, and the tile it works on (``place_tile`` sets that again for each
tile of a persistent workgroup) -- and writes the kernel from its parts: the tile order
(``scheduler.TileScheduler``), the producer warpgroup (``producer.Producer``), the
consumers' key loops (``consumer.Consumer``), their products (``mma.Products``) and
softmax (``softmax.BlockSoftmax``), the epilogue (``epilogue.store_output``) and the
mask's block table (``block_table``).
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, llvm, nvvm, scf

from ...base import EmittedKernel, NotApplicable, TargetInfo
from ...kernel_ir import GpuFunc, Pointwise, direct_source
from ...nvidia import wgmma as _wg
from ...nvidia.barriers import NamedBarrier, StageBarriers, named_sync
from ...nvidia.mma_sync import FP8_PTX, MmaSync
from .. import run_time
from .block_table import emit_block_table, table_columns, table_masks
from .consumer import Consumer
from .epilogue import store_output
from .mma import Products, fp8_key_order
from .plan import HopperPlan, p_scale
from .producer import CONSUMER_REGISTERS, Producer
from .scheduler import WALK_INFO_SLOTS, TileScheduler
from .softmax import BlockSoftmax, linear_factors


class HopperAttention:
    """The wgmma attention kernel of a plan (``plan.HopperPlan``) for an attention kernel
    function (``ch``: its ``attention.chain.Chain``); ``emit()`` writes it."""

    def __init__(self, ch, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo):
        self.ch, self.kernel, self.gpu_module, self.target = ch, kernel, gpu_module, target
        self.plan = p = HopperPlan.from_dict(plan)
        self.view = ch.view
        self.bm, self.bn, self.threads, self.stages = p.block_m, p.block_n, p.threads, p.stages
        self.D, self.Dv, self.Sq, self.Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
        self.elem = spec_of(ch.q.type).elem
        self.et = ir.Type.parse(self.elem)
        self.fp8 = self.elem in FP8_PTX
        self.esize = 1 if self.fp8 else 2
        self.k_inst = 32 // self.esize  # k of one wgmma: 16, 32 for fp8
        self.p_scale = p_scale(ch)
        self.s_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (self.bn // 2)) + ")>")
        self.o_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (self.Dv // 2)) + ")>")
        self.s_attrs = _wg.wgmma_attrs(self.elem, self.bn, self.k_inst, False)
        self.n_in = len(self.view.args)
        self.specialized = p.warp_specialized
        self.table_shape = p.block_table if p.skip_masked_blocks else None
        self.walk_persistent = p.persistent_walk if self.table_shape else None
        # Q refilled a tile (persistent kernels): a barrier on which the consumers give it back
        self.reuses_q = bool(p.persistent or self.walk_persistent)
        self.n_barriers = StageBarriers.size(self.stages, bool(self.table_shape), self.reuses_q)
        self.n_blocks = -(-self.Sk // self.bn)
        self.table_t = None
        #: run-time sequence lengths (``run_time.SeqLengths``, set in ``emit``), or None
        self.slots = [tuple(s) for s in plan.get("sizes", [])]
        self.seq = None
        if self.slots and (self.table_shape or p.persistent or self.fp8):
            raise ValueError("the wgmma attention plan's block table, persistent grid and fp8 products take "
                             "static sizes")

    # ---- the tile placed

    def place_rows(self) -> None:
        """The tile's first query row and each thread's two rows."""
        g = self.g
        self.q0 = g.mul(self.qblock, self.bm)
        r0 = arith.addi(self.q0, arith.addi(g.mul(self.wg, 64), arith.addi(g.mul(g.rem(self.warp, 4), 16), self.gid)))
        self.rows = [r0, g.add(r0, 8)]

    def lead(self, value):
        """The tile's batch index of ``value``'s leading dims."""
        return self.pw.operand_index(spec_of(value.type).shape[:-2], self.batch_idx, len(self.ch.batch))

    def place_sources(self) -> None:
        """Where the tile's Q, K and V lie."""
        ch, memrefs = self.ch, self.g.args[:self.n_in]
        flat = self.seq.flat_inputs if self.seq is not None else None
        self.q_direct = direct_source(self.view, memrefs, ch.q, self.lead(ch.q), False, flat)
        self.k_direct = direct_source(self.view, memrefs, ch.kt, self.lead(ch.kt), True, flat)
        # fp8: V^T as stored ([.., Dv, Sk], K-major for the second product)
        self.v_direct = direct_source(self.view, memrefs, ch.v, self.lead(ch.v), self.fp8, flat)

    def place_tile(self, t: ir.Value) -> None:
        """A persistent workgroup's tile t (``TileScheduler.tile``) and what follows from
        it, set again for each tile."""
        self.qblock, batch = self.scheduler.tile(t)
        self.batch_idx = self.g.delinearize(batch, self.ch.batch) if self.ch.batch else []
        self.s_lead = self.pw.operand_index(self.ch.scores.shape[:-2], self.batch_idx, len(self.ch.batch))
        self.place_rows()
        self.place_sources()

    def kv_tiles(self, tid, threads, lean, producer=False):
        """K's and V's SwizzledTiles, copied by ``threads`` threads (``tid`` from 0);
        ``producer``: the producer warpgroup's (see SwizzledTile)."""
        g, bn, D, Dv, esize = self.g, self.bn, self.D, self.Dv, self.esize
        k = _wg.SwizzledTile(g, tid, threads, self.Ks, self.k_direct, bn, D, esize, self.Sk, D, False, width=D,
                             row_perm=(lambda j: fp8_key_order(j, g)) if self.fp8 else None, lean=lean,
                             producer=producer)
        if self.fp8:  # V^T, K-major
            return k, _wg.SwizzledTile(g, tid, threads, self.Vs, self.v_direct, Dv, bn, esize, Dv, self.Sk, False,
                                       width=bn, lean=lean, producer=producer)
        return k, _wg.SwizzledTile(g, tid, threads, self.Vs, self.v_direct, Dv, bn, esize, Dv, self.Sk, True,
                                   lean=lean, producer=producer)

    # ---- synchronization of the threads that compute

    def sync(self):
        """A barrier of every thread that computes (with a producer warpgroup: the 256 of
        the consumer warpgroups; else the workgroup)."""
        if self.specialized:
            named_sync(NamedBarrier.CONSUMERS, 256)
        else:
            gpu.barrier()

    def fence_and_publish(self):
        """This thread's landed copies fenced for the async proxy (wgmma reads through it),
        and published to the others by ``sync``."""
        nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                          space=ir.Attribute.parse("#nvvm.shared_space<cta>"))
        self.sync()

    def split(self, produce, consume):
        """The producer warpgroup (the last) and the consumers' code, each with its
        registers (setmaxnreg)."""
        op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, self.tid, self.g.c(self.threads - 128)), [], has_else=True)
        with ir.InsertionPoint(op.then_block):
            produce()
            scf.yield_([])
        with ir.InsertionPoint(op.else_block):
            nvvm.SetMaxRegisterOp(CONSUMER_REGISTERS, ir.Attribute.parse("#nvvm<action increase>"))
            consume()
            scf.yield_([])

    # ---- the kernel

    def emit(self) -> EmittedKernel:
        """Write the kernel (and the block table's, its prelude) into the gpu.module."""
        view, plan = self.view, self.plan
        arg_types, strided = run_time.arg_types(view, self.target, self.slots)
        prelude = None
        with self.kernel.location:
            if self.table_shape:
                i32 = ir.IntegerType.get_signless(32)
                self.table_t = ir.MemRefType.get(
                    [self.table_shape[0], table_columns(self.table_shape[1], bool(self.walk_persistent))], i32)
                prelude = emit_block_table(self.ch, self.gpu_module, self.target, self.bm, self.bn, self.table_t,
                                           rows_live=bool(self.walk_persistent))
                arg_types = arg_types[:self.n_in] + [self.table_t] + arg_types[self.n_in:]
            self.g = g = GpuFunc(self.gpu_module, view.name, arg_types, [], (self.threads, 1, 1))  # window: carved
            if self.slots:  # the sequences' lengths from here on are the run-time ones
                self.seq = run_time.SeqLengths(g, self.ch, self.slots, strided)
                self.Sq, self.Sk = self.ch.seq_q, self.ch.seq_k
            if plan.max_registers:
                g.op.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32),
                                                                     plan.max_registers)
            self.table = g.args[self.n_in] if self.table_shape else None
            self.out_mem = g.args[self.n_in + (1 if self.table_shape else 0) + self.ch.out_pos]
            self.pw = Pointwise(g, view, g.args[:self.n_in])
            if self.seq is not None:
                self.pw.flat = self.seq.flat_inputs
            self.zero, self.neg_inf = g.fconst(0.0), g.fconst(-math.inf)
            self.tc = MmaSync(self.elem)
            with ir.InsertionPoint(g.entry):
                self._set_up()
                self._key_loops()
            g.finish()
        tensor_cores = f"wgmma.m64n{self.bn}k{self.k_inst}+m64n{self.Dv}k{self.k_inst}" + (
            f".{FP8_PTX[self.elem]}" if self.fp8 else "")
        run_time_grid = {} if self.seq is None else {
            "sizes": tuple(self.slots), "grid_sizes": self.seq.grid(self.bm, math.prod(self.ch.batch))}
        return EmittedKernel(view.name, tuple(plan.grid), (self.threads, 1, 1), g.dynamic_shared_bytes,
                             {"strategy": "attention", "tensor_cores": tensor_cores,
                              "workgroup_bytes": plan.shared_bytes, "block_m": self.bm, "block_n": self.bn,
                              "stages": self.stages},
                             prelude=prelude,
                             prelude_output=ir.RankedTensorType.get(ir.MemRefType(self.table_t).shape,
                                                                    ir.IntegerType.get_signless(32))
                             if self.table_shape else None, **run_time_grid)

    def _set_up(self) -> None:
        """The entry block: shared memory, barriers, the thread's place, the first tile,
        the scale of the scores, the tiles' copies and descriptors."""
        g, plan, ch, pw = self.g, self.plan, self.ch, self.pw
        bm, bn, D, Dv, stages = self.bm, self.bn, self.D, self.Dv, self.stages
        i64 = ir.IntegerType.get_signless(64)
        per_row = _wg.SWIZZLE_BYTES // self.esize
        et = self.et
        if not isinstance(self.Sk, int):  # run-time keys: the key blocks' count, ceil(Sk / bn)
            self.n_blocks = g.div(g.add(self.Sk, bn - 1), bn)
        # Q: bm rows x D; K: bn rows x D a stage; V: bn k-rows x Dv a stage (MN-major)
        self.Qs, self.Ks, self.Vs, *rest = _wg.carve_aligned(
            g, [(bm * D // per_row, per_row, et), (stages * bn * D // per_row, per_row, et),
                (stages * bn * Dv // per_row, per_row, et)]
            + ([(1, self.n_barriers + (WALK_INFO_SLOTS if self.walk_persistent else 0), i64)]
               if self.specialized else []))
        # with the table, a barrier for Q too: a workgroup may walk no block; persistent:
        # one on which the consumers give Q back for the next tile
        self.barrier_mem = rest.pop() if self.specialized else None
        self.barriers = StageBarriers(g, self.barrier_mem, stages, bool(self.table_shape),
                                      q_free=self.reuses_q) if self.specialized else None
        self.tid = g.tid()
        self.scheduler = TileScheduler(self)
        self.qblock = g.bid("x")
        if plan.reverse_q_blocks:  # the last query blocks, with the most live keys, first
            last = g.c(plan.grid[0] - 1) if self.seq is None else arith.subi(self.seq.q_blocks(bm), g.c(1))
            self.qblock = arith.subi(last, self.qblock)
        batch = g.bid("y")
        if self.scheduler.persistent:  # the first tile's (the loops place each: ``place_tile``)
            self.qblock, batch = self.scheduler.tile_of(self.qblock)
        self.batch_idx = g.delinearize(batch, ch.batch) if ch.batch else []
        self.warp, lane = g.div(self.tid, 32), g.rem(self.tid, 32)
        self.wg = g.div(self.warp, 4)
        self.gid, self.tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
        self.place_rows()
        pw.reciprocal_of_constants = True
        pw.hoist_scalars()
        self.softmax = BlockSoftmax(self)
        factors = linear_factors(ch) if ch.mask_cond is None else None
        if factors is not None:
            self.softmax.set_linear(factors, self.p_scale)
        self.place_sources()
        if None in (self.q_direct, self.k_direct, self.v_direct):
            raise NotApplicable("the wgmma attention plan reads q, k and v straight from arguments")
        # lean copies' four more registers through the loop made the kernels held to 128
        # (two workgroups an SM, head dim 64) spill 8 bytes, and fp8 head dim 256 over two
        # key blocks (a loop of one trip, which LLVM removes) 92
        lean = not plan.max_registers and isinstance(self.Sk, int) and self.Sk > 2 * bn and not self.specialized
        self.q_tile = _wg.SwizzledTile(g, self.tid, self.threads, self.Qs, self.q_direct, bm, D, self.esize, self.Sq,
                                       D, False, width=D, lean=False)
        # with a producer: copied by the consumers where they copy (the walk's second pass)
        self.k_tile, self.v_tile = self.kv_tiles(self.tid, 256 if self.specialized else self.threads, lean)
        self.s_lead = pw.operand_index(ch.scores.shape[:-2], self.batch_idx, len(ch.batch))
        self.q_desc = arith.addi(self.q_tile.descriptor_base(),
                                 arith.index_cast(i64, g.mul(self.wg, 64 * _wg.SWIZZLE_BYTES // 16)))
        self.k_desc0, self.v_desc0 = self.k_tile.descriptor_base(), self.v_tile.descriptor_base()
        self.log2e = g.fconst(math.log2(math.e))
        if self.specialized and ch.mask_cond is not None:
            whole_factors = linear_factors(ch, ch.unmasked_scores)
            self.softmax.masked_linear = self.softmax.linear_scale(whole_factors) if whole_factors is not None \
                else None
        self.mma = Products(self)
        self.consumer = Consumer(self)
        self.producer = Producer(self)

    def _key_loops(self) -> None:
        """The key loop the plan says, and the output's store."""
        g, ch, plan = self.g, self.ch, self.plan
        consumer, producer = self.consumer, self.producer
        self.init = [self.neg_inf, self.neg_inf, self.zero, self.zero, llvm.mlir_zero(self.o_t)]
        if not self.specialized:
            self.q_tile.copy_async(self.q0, 0, 0)
        skip = plan.skip_masked_blocks and ch.mask_cond is not None
        final = None
        if skip and self.specialized and self.walk_persistent:
            self.barriers.initialize(128, 256, q_extra=1)  # the producer's announce_q
            self.split(producer.run_walk, consumer.persistent_walk)
        elif skip and self.specialized:
            self.barriers.initialize(128, 256)
            self.split(lambda: producer.run(lambda: table_masks(g, self.table, self.qblock, self.table_shape[1],
                                                                self.tid, ("live",))["live"]),
                       consumer.walk)
        elif skip:
            final = consumer.skipping()
        elif self.stages == 3 and not plan.overlap_pv:
            final = consumer.overlapped()
        elif self.stages == 3:
            self.barriers.initialize(128, 256)
            self.split(producer.run, consumer.unmasked)
        else:
            final = consumer.two_stages()
        if final is not None:
            nvvm.cp_async_wait_group(0)
            store_output(self, final)
