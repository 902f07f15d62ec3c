"""The consumers' epilogue: O / l, through the kernel function's ops after P V (fp8's
dequantization scales), stored from the accumulators; and where the kernel function
returns the scores' row logsumexp too (``Chain.lse_pos``), ``m + log(l)`` of each row,
stored by the first thread of its quad (in the log2 domain of the linear softmax, ``(m
+ log2(l)) ln 2``: m there is a maximum of scores times log2 e).

O is multiplied by 1 / l, the reciprocal once a row (a division a value was a slow-path
check and call each, 64 a thread), and each thread's two neighbouring columns go out as
one store (the runtime's buffers are 16-byte aligned; the columns' offsets and the rows'
lengths are even).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, vector

from ...emit import to_storage as emit_to_storage
from ...kernel_ir import elem_bytes, quad_reduce, store_value
from ...run_time_sizes import ragged
from ..chain import lse_index, row_lse
from ..run_time import lse_position, out_position


def store_output(k, final) -> None:
    """Store the tile of the kernel ``k`` (a HopperAttention) whose key loop left
    ``final`` (m, l, O)."""
    g, ch, pw = k.g, k.ch, k.pw
    f32 = ir.F32Type.get()
    log2_p = k.softmax.log2_p
    totals = [quad_reduce(final[2 + h], arith.addf) for h in range(2)]
    if log2_p:  # l summed c * p (linear_softmax)
        totals = [arith.mulf(t, g.fconst(2.0 ** -log2_p)) for t in totals]
    epilogue = getattr(ch, "epilogue_value", ch.mm2.result)
    epilogue = None if epilogue == ch.mm2.result else epilogue
    out_elem = ir.MemRefType(k.out_mem.type).element_type
    pair_t = ir.VectorType.get([2], out_elem)
    o = final[4]
    rows, batch_idx, tig2 = k.rows, k.batch_idx, k.tig2
    # run-time sizes: the queries' length and the flat results' strides, computed here
    ep = k.seq.epilogue() if k.seq is not None else None
    Sq = k.Sq if ep is None else ep.seq_q
    for h in range(2):
        def store(h=h):
            inverse = arith.divf(g.fconst(1.0), totals[h])
            for n in range(k.Dv // 8):
                pair = []
                for i in (2 * h, 2 * h + 1):
                    v = arith.mulf(llvm.extractvalue(f32, o, [4 * n + i]), inverse)
                    if epilogue is not None:  # ops after P V (fp8: the scales)
                        pw.reset()
                        pw.bind(ch.mm2.result, v)
                        v = pw.eval(epilogue, list(batch_idx) + [rows[h], g.add(tig2, 8 * n + i % 2)])
                    pair.append(emit_to_storage(v, out_elem))
                value = vector.from_elements(pair_t, pair)
                at = list(batch_idx) + [rows[h], g.add(tig2, 8 * n)]
                if ep is not None:
                    at = ep.at(out_position(ch), at)
                vector.store(value, k.out_mem, at, alignment=2 * elem_bytes(out_elem))

        g.when(g.lt(rows[h], Sq) if ragged(Sq, k.bm) else None, store)
    if ch.lse_pos is not None:
        lse_mem = k.g.args[k.n_in + (1 if k.table_shape else 0) + ch.lse_pos]
        for h in range(2):
            def store_lse(h=h):
                at = lse_index(ch, batch_idx, rows[h], g.c(0))
                if ep is not None:
                    at = ep.at(lse_position(ch), at)
                store_value(row_lse(final[h], totals[h], k.softmax.linear is not None), lse_mem, at)

            first = arith.cmpi(arith.CmpIPredicate.eq, tig2, g.c(0))
            g.when(arith.andi(first, g.lt(rows[h], Sq)) if ragged(Sq, k.bm) else first, store_lse)
