"""The Hopper backward kernel as an object: the state its parts share.

``HopperBackward`` holds the plan, the gpu.func being written, the shared-memory tiles
and their descriptors, the barriers and the thread's place, and writes the three
kernels: the preprocess (``preprocess``), the main kernel from its producer
(``producer.Producer``) and consumers (``consumer.Consumer``), and the postprocess
(``postprocess``).

Shared memory, 128-byte swizzled (``nvidia.wgmma``): K and V of the key block (K-major:
the A operands of S^T = K Q^T and dP^T = V dO^T, and K read MN-major as dQ's B), Q and
dO in ``STAGES`` (K-major B of S^T and dP^T; read MN-major as the B of dK and dV), dS in
``STAGES`` (the MN-major A of dQ = dS K, written by the consumers from their dS^T
registers), a stage's D and logsumexp, and under a mask the consumers' step list.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, nvvm, scf

from ....base import EmittedKernel, NotApplicable, TargetInfo
from ....kernel_ir import GpuFunc, Pointwise, direct_source, gpu_arg_types
from ....nvidia import wgmma as _wg
from ....nvidia.barriers import StageBarriers
from ....nvidia.mma_sync import MmaSync
from ...hopper.producer import CONSUMER_REGISTERS
from ..chain import BackwardChain
from .consumer import Consumer
from .plan import STAGES, WALK_MAX_BLOCKS, HopperBackwardPlan
from .postprocess import emit_postprocess
from .preprocess import emit_preprocess
from .producer import Producer


class HopperBackward:
    """The wgmma attention backward of a plan (``plan.HopperBackwardPlan``) for a
    ``BackwardChain``; ``emit()`` writes it."""

    def __init__(self, ch: BackwardChain, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
                 target: TargetInfo):
        self.ch, self.kernel, self.gpu_module, self.target = ch, kernel, gpu_module, target
        self.plan = p = HopperBackwardPlan.from_dict(plan)
        if (ch.seq_q, ch.seq_k, ch.head_dim) != (p.seq_q, p.seq_k, p.head_dim):
            raise NotApplicable("the plan was made for another kernel")
        self.view = ch.view
        self.bm, self.bn, self.D = p.block_m, p.block_n, p.head_dim
        self.elem = p.elem
        self.et = ir.Type.parse(p.elem)
        self.ws_tensor = ir.RankedTensorType.get([p.workspace], ir.F32Type.get())
        self.ws_type = ir.MemRefType.get([p.workspace], ir.F32Type.get())
        self.roles = set(ch.products)

    def emit(self) -> EmittedKernel:
        """Write the preprocess, the main kernel and (for dq) the postprocess."""
        ch, view, plan = self.ch, self.view, self.plan
        with self.kernel.location:
            pre = emit_preprocess(self)
            post = emit_postprocess(self) if "dq" in self.roles else None
            n_in = len(view.args)
            types = gpu_arg_types(view, self.target)
            dq = ch.products["dq"].result if "dq" in self.roles else None
            self.outputs = [n for n in range(len(view.results)) if n != dq]
            arg_types = types[:n_in] + [self.ws_type] + [types[n_in + n] for n in self.outputs]
            self.g = g = GpuFunc(self.gpu_module, view.name, arg_types, [], (plan.threads, 1, 1))
            self.ws = g.args[n_in]
            self.out_mem = {n: g.args[n_in + 1 + i] for i, n in enumerate(self.outputs)}
            self.pw = Pointwise(g, view, g.args[:n_in])
            self.tc = MmaSync(self.elem)
            with ir.InsertionPoint(g.entry):
                self._set_up()
                self.barriers.initialize(128, 256)
                self.split()
            g.finish()
        return EmittedKernel(view.name, tuple(plan.grid), (plan.threads, 1, 1), g.dynamic_shared_bytes,
                             {"strategy": "attention backward", "kernel": "hopper",
                              "tensor_cores": f"wgmma.m64n{self.bm}k16+m64n{self.D}k16+m64n64k16",
                              "block_m": self.bm, "block_n": self.bn, "workgroup_bytes": plan.shared_bytes},
                             prelude=pre, prelude_output=self.ws_tensor,
                             postlude=post, postlude_results=(dq,) if post is not None else ())

    def _set_up(self) -> None:
        """Shared memory, barriers, the workgroup's key block and batch element, the
        sources of its tiles."""
        g, ch, plan = self.g, self.ch, self.plan
        bm, bn, D, et = self.bm, self.bn, self.D, self.et
        per_row = _wg.SWIZZLE_BYTES // 2
        i64, f32 = ir.IntegerType.get_signless(64), ir.F32Type.get()
        self.n_barriers = StageBarriers.size(STAGES, True)
        views = _wg.carve_aligned(g, [
            (bn * D // per_row, per_row, et), (bn * D // per_row, per_row, et),
            (STAGES * bm * D // per_row, per_row, et), (STAGES * bm * D // per_row, per_row, et),
            (STAGES * bm * bn // per_row, per_row, et), (2 * STAGES, bm, f32), (1, self.n_barriers, i64)]
            + ([(1, WALK_MAX_BLOCKS, ir.IntegerType.get_signless(32))] if plan.masked else []))
        self.Ks, self.Vs, self.Qs, self.dOs, self.dSs, self.stats, mem = views[:7]
        self.steps = views[7] if plan.masked else None  # the consumers' step list (``walk.list_steps``)
        self.barriers = StageBarriers(g, mem, STAGES, q=True)  # Q's barrier: K and V, copied once
        self.tid = g.tid()
        self.n0 = g.mul(g.bid("x"), bn)
        self.bh = g.bid("y")
        self.batch_idx = g.delinearize(self.bh, ch.batch) if ch.batch else []
        nb = len(ch.batch)

        def lead(v):
            return self.pw.operand_index(spec_of(v.type).shape[:-2], self.batch_idx, nb)

        memrefs = g.args[:len(self.view.args)]
        self.q_direct = direct_source(self.view, memrefs, ch.q, lead(ch.q), False)
        self.do_direct = direct_source(self.view, memrefs, ch.do, lead(ch.do), False)
        self.k_direct = direct_source(self.view, memrefs, ch.kt, lead(ch.kt), True)
        self.v_direct = direct_source(self.view, memrefs, ch.vt, lead(ch.vt), True)
        if None in (self.q_direct, self.do_direct, self.k_direct, self.v_direct):
            raise NotApplicable("the wgmma backward reads q, k, v and dO straight from arguments")
        self.stage_bytes = bm * D * 2  # a Q or dO stage
        self.ds_stage_bytes = bm * bn * 2
        self.consumer = Consumer(self)
        self.producer = Producer(self)

    def split(self) -> None:
        """The producer warpgroup (the last) and the consumers, each with its registers."""
        g = self.g
        op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, self.tid, g.c(256)), [], has_else=True)
        with ir.InsertionPoint(op.then_block):
            self.producer.run()
            scf.yield_([])
        with ir.InsertionPoint(op.else_block):
            nvvm.SetMaxRegisterOp(CONSUMER_REGISTERS, ir.Attribute.parse("#nvvm<action increase>"))
            self.consumer.run()
            scf.yield_([])

    # ---- helpers the parts share

    def ws_address(self, element: ir.Value) -> ir.Value:
        """The global address (i64) of workspace element ``element`` (an index)."""
        from mlir.dialects import memref

        i64 = ir.IntegerType.get_signless(64)
        base = arith.index_cast(i64, memref.extract_aligned_pointer_as_index(self.ws))
        return arith.addi(base, arith.index_cast(i64, self.g.mul(element, 4)))

    def row_of(self, m0: ir.Value) -> ir.Value:
        """The workspace row of query m0 of the workgroup's batch element."""
        return arith.addi(self.g.mul(self.bh, self.plan.seq_q_padded), m0)

    @property
    def query_blocks(self) -> int:
        return self.plan.query_blocks

    @staticmethod
    def log2e() -> float:
        return math.log2(math.e)
