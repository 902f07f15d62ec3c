"""The Hopper backward's preprocess (FlashAttention-3's ``flash_bwd_preprocess``): per
query row D = rowsum(dO * O) and the logsumexp times log2 e, and the row's dQ sums
zeroed, into the workspace (``plan.Workspace``).

A workgroup takes 64 rows of one batch element: ``head_dim / 8`` threads a row, each
reading 8 consecutive elements of dO and O (one 16-byte load of each, where D's operand
is their product as kf-fuse writes it; else element by element), the row's partial sums
added by xor shuffles. Rows past the queries (the padding up to whole query blocks) get
D = 0 and a logsumexp of +inf, so that their P is 0.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref, vector

from ....base import EmittedKernel
from ....kernel_ir import GpuFunc, Pointwise, direct_source, gpu_arg_types

#: Rows a workgroup of the preprocess, and its threads.
ROWS, THREADS = 64, 256


def _product_operands(ch) -> tuple | None:
    """(a, b) where D's operand is a * b of two arguments (through float casts), else None."""
    from kf.dialects.types import defining

    op = defining(ch.d_src)
    if op is None or op.name != "kf.mul":
        return None
    out = []
    for v in op.operands:
        d = defining(v)
        if d is not None and d.name == "kf.cast":
            v = d.operands[0]
        if ch.view.arg_index(v) is None or spec_of(v.type).shape != spec_of(ch.d_src.type).shape:
            return None
        out.append(v)
    return tuple(out)


def emit_preprocess(k) -> EmittedKernel:
    """The preprocess of the backward ``k`` (a HopperBackward)."""
    ch, plan, view = k.ch, k.plan, k.view
    d = plan.head_dim
    lanes = d // 8
    per_pass = THREADS // lanes
    name = f"{view.name}_pre"
    n_in = len(view.args)
    g = GpuFunc(k.gpu_module, name, gpu_arg_types(view, k.target)[:n_in] + [k.ws_type], [], (THREADS, 1, 1))
    pw = Pointwise(g, view, g.args[:n_in])
    ws = g.args[-1]
    f32 = ir.F32Type.get()
    layout = plan.layout
    nb = len(ch.batch)
    with ir.InsertionPoint(g.entry):
        tid = g.tid()
        m0, bh = g.mul(g.bid("x"), ROWS), g.bid("y")
        batch_idx = g.delinearize(bh, ch.batch) if ch.batch else []
        lane = g.rem(tid, lanes)
        c0 = g.mul(lane, 8)
        d_spec = spec_of(ch.d_src.type)
        lead = pw.operand_index(d_spec.shape[:-2], batch_idx, nb)
        operands = _product_operands(ch)
        memrefs = g.args[:n_in]
        for p in range(ROWS // per_pass):
            r = g.add(g.div(tid, lanes), p * per_pass)
            i = arith.addi(m0, r)

            def partial(i=i):
                if operands is not None:
                    prod = None
                    for v in operands:
                        src = direct_source(view, memrefs, v, lead, False)
                        et = ir.MemRefType(src.mem.type).element_type
                        x = vector.load(ir.VectorType.get([8], et), src.mem, src.lead + [i, c0], alignment=16)
                        x = arith.extf(ir.VectorType.get([8], f32), x) if et != f32 else x
                        prod = x if prod is None else arith.mulf(prod, x)
                    return [vector.reduction(f32, vector.CombiningKind.ADD, prod)]
                acc = g.fconst(0.0)
                for e in range(8):
                    pw.reset()
                    acc = arith.addf(acc, scalar_math.convert(pw.eval(ch.d_src, lead + [i, g.add(c0, e)]), f32))
                pw.reset()
                return [acc]

            inside = g.lt(i, ch.seq_q) if plan.seq_q_padded != ch.seq_q else None
            total = g.guarded(inside, [f32], partial, lambda: [g.fconst(0.0)])[0]
            i32 = ir.IntegerType.get_signless(32)
            for off in (1, 2, 4, 8)[:int(math.log2(lanes))]:
                other = gpu.shuffle(total, arith.constant(i32, off), arith.constant(i32, 32), gpu.ShuffleMode.XOR)[0]
                total = arith.addf(total, other)

            def write(i=i, total=total):
                row = arith.addi(g.mul(bh, plan.seq_q_padded), i)

                def lse():
                    pw.reset()
                    idx = pw.operand_index(spec_of(ch.lse.type).shape, batch_idx + [i, g.c(0)], ch.scores.rank)
                    value = scalar_math.convert(pw.eval(ch.lse, idx), f32)
                    pw.reset()
                    return [arith.mulf(value, g.fconst(math.log2(math.e)))]

                l2 = g.guarded(inside, [f32], lse, lambda: [g.fconst(math.inf)])[0]
                memref.store(total, ws, [g.add(row, layout.d_at)])
                memref.store(l2, ws, [g.add(row, layout.lse_at)])

            g.when(arith.cmpi(arith.CmpIPredicate.eq, lane, g.c(0)), write)
        # the block's dQ sums: ROWS x d floats from dq_at + (bh * Sqp + m0) * d
        zeros = arith.constant(ir.VectorType.get([4], f32), ir.DenseElementsAttr.get_splat(
            ir.VectorType.get([4], f32), ir.FloatAttr.get(f32, 0.0)))
        base = g.add(g.mul(arith.addi(g.mul(bh, plan.seq_q_padded), m0), d), layout.dq_at)
        for u in range(ROWS * d // (4 * THREADS)):
            vector.store(zeros, ws, [arith.addi(base, g.mul(g.add(tid, u * THREADS), 4))], alignment=16)
        g.finish()
    return EmittedKernel(name, (plan.query_blocks * plan.block_m // ROWS, math.prod(ch.batch), 1), (THREADS, 1, 1),
                         0, {"strategy": "attention backward preprocess"})
