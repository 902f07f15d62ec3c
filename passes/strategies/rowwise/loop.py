"""The loop kernel: each phase a row loop ``scf.for j = tid to R step T {kf.row_loop}``
of per-thread partials, then the workgroup reduction; the outputs in one more loop.
The loops' scalar loads and stores are what kf-vectorize turns into vector accesses,
and loads marked ``kf.promote`` what kf-promote-shared reads once into workgroup memory."""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, memref, scf

from kf.passes import scalar_math as sm

from ..emit import to_storage
from .analysis import Node, full_tokens, natural
from .emit import ROW_LOOP, VECTOR_LANES, RowEmitter, compute_type, const_index


class LoopEmitter(RowEmitter):
    """The loop kernel's phases and outputs."""

    def row_loop(self, iter_inits: list[ir.Value]):
        """scf.for j = tid to R step T, marked for kf-vectorize and kf-promote-shared."""
        loop = scf.ForOp(self.tid, const_index(self.a.row_length), const_index(self.T), iter_inits)
        loop.operation.attributes[ROW_LOOP] = ir.UnitAttr.get()
        loop.operation.attributes[VECTOR_LANES] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), self.plan["vector_lanes"] if self.a.nred == 1 else 1)
        return loop

    def phase(self, kind: str, x: Node) -> None:
        """One statistic of x over the row: a row loop of per-thread partials, then the
        workgroup reduction."""
        ct = compute_type(x.elem)
        combine = "max" if kind == "max" else "min" if kind == "min" else "add"
        neutral = {"add": 0.0, "max": -math.inf, "min": math.inf}[combine]
        with x.loc or ir.Location.unknown():
            loop = self.row_loop([sm.const(ct, neutral)])
            self.loop_op, self.loop_memo = loop.operation, {}
            with ir.InsertionPoint(loop.body):
                self.col = self._col_values(loop.induction_variable)
                v = self.value(x, full_tokens(self.a))
                if kind == "m2":  # two-pass variance: squared deviations from the mean
                    d = arith.subf(v, self.row_mean(x))
                    v = arith.mulf(d, d)
                elif kind == "sumexp":  # softmax: exp(x - max), never overflows
                    v = self.shifted_exp(x, full_tokens(self.a))
                acc = loop.inner_iter_args[0]
                scf.YieldOp([self._combine(combine, acc, v)])
            self.col, self.loop_op = None, None
            self.stats[(kind, id(x))] = self.workgroup_reduce(loop.results[0], combine)

    def outputs(self) -> None:
        a = self.a
        n_in = len(a.inputs)
        col_outs, row_outs = [], []
        for i, o in enumerate(a.outputs):
            if o.op == "partial":
                continue
            coords = natural(a, o)
            (col_outs if any(c and c[0] == "c" for c in coords) else row_outs).append((i, o, coords))
        if col_outs or a.partials:
            loop = self.row_loop([])
            self.loop_op, self.loop_memo = loop.operation, {}
            with ir.InsertionPoint(loop.body):
                self.col = self._col_values(loop.induction_variable)
                for i, o, coords in col_outs:
                    with o.loc:
                        v = self.value(o, coords)
                        mem = self.args[n_in + i]
                        memref.store(to_storage(v, ir.MemRefType(mem.type).element_type), mem,
                                     [self._idx(c) for c in coords])
                for i, o in a.partials:
                    # the group's sums so far live in the partial output itself: each thread
                    # reads back only what it wrote (its own columns), so no barrier is needed
                    with o.loc:
                        v = self.value(o.operands[0], full_tokens(a))
                        mem = self.args[n_in + i]
                        idx = [self._idx(c) for c in natural(a, o)]
                        st = ir.MemRefType(mem.type).element_type
                        v = sm.convert(v, compute_type(o.elem))
                        so_far = sm.convert(memref.load(mem, idx), compute_type(o.elem))
                        total = arith.select(self.first_row, v, arith.addf(so_far, v))
                        memref.store(to_storage(total, st), mem, idx)
                scf.YieldOp([])
            self.col, self.loop_op = None, None
        if row_outs:
            self.row_outputs(row_outs)
