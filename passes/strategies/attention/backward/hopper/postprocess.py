"""The Hopper backward's postprocess (FlashAttention-3's ``flash_bwd_postprocess``): dQ
from the f32 sums the main kernel added into the workspace, times the chain's gradient
scale, through the kernel function's epilogue of dq (its casts), stored in the result's
layout (``EmittedKernel.postlude``).

A thread takes 4 consecutive sums of a row (one 16-byte load) and stores 4 results.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, vector

from ....base import EmittedKernel
from ....emit import to_storage
from ....kernel_ir import GpuFunc, Pointwise, elem_bytes, gpu_arg_types

THREADS = 256

#: Rows a workgroup.
ROWS = 32


def emit_postprocess(k) -> EmittedKernel:
    """The postprocess of the backward ``k`` (a HopperBackward)."""
    ch, plan, view = k.ch, k.plan, k.view
    prod = ch.products["dq"]
    d = plan.head_dim
    n_in = len(view.args)
    name = f"{view.name}_post"
    out_t = gpu_arg_types(view, k.target)[n_in + prod.result]
    g = GpuFunc(k.gpu_module, name, gpu_arg_types(view, k.target)[:n_in] + [k.ws_type, out_t], [], (THREADS, 1, 1))
    pw = Pointwise(g, view, g.args[:n_in])
    ws, out = g.args[n_in], g.args[n_in + 1]
    f32 = ir.F32Type.get()
    layout = plan.layout
    spec = view.result_specs[prod.result]
    out_elem = ir.MemRefType(out.type).element_type
    result = view.results[prod.result]
    per_row = d // 4
    with ir.InsertionPoint(g.entry):
        pw.hoist_scalars()
        tid, bh = g.tid(), g.bid("y")
        batch_idx = g.delinearize(bh, ch.batch) if ch.batch else []
        lead = pw.operand_index(spec.shape[:-2], batch_idx, len(ch.batch))
        scale = g.fconst(plan.grad_scale)
        for p in range(ROWS * per_row // THREADS):
            lin = g.add(tid, p * THREADS)
            i = arith.addi(g.mul(g.bid("x"), ROWS), g.div(lin, per_row))
            c0 = g.mul(g.rem(lin, per_row), 4)

            def store(i=i, c0=c0):
                at = arith.addi(g.mul(arith.addi(g.mul(bh, plan.seq_q_padded), i), d), c0)
                sums = vector.load(ir.VectorType.get([4], f32), ws, [g.add(at, layout.dq_at)], alignment=16)
                values = []
                for e in range(4):
                    pw.reset()
                    pw.bind(prod.mm.result, arith.mulf(vector.ExtractOp(sums, [], [e]).result, scale))
                    values.append(to_storage(pw.eval(result, lead + [i, g.add(c0, e)]), out_elem))
                pw.reset()
                vector.store(vector.from_elements(ir.VectorType.get([4], out_elem), values), out, lead + [i, c0],
                             alignment=4 * elem_bytes(out_elem))

            g.when(g.lt(i, ch.seq_q) if ch.seq_q % ROWS else None, store)
        g.finish()
    return EmittedKernel(name, (-(-ch.seq_q // ROWS), math.prod(ch.batch), 1), (THREADS, 1, 1), 0,
                         {"strategy": "attention backward postprocess"})
