"""FlashAttention's online softmax over a key block of scores in the mma accumulator
layout, shared by the mma.sync and the Hopper kernels."""

from __future__ import annotations

import math

from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith

from ..kernel_ir import GpuFunc, Pointwise, quad_reduce
from ..run_time_sizes import ragged
from .chain import Chain

def online_softmax(g: GpuFunc, pw: Pointwise, ch: "Chain", s: list[list[ir.Value]], m: list[ir.Value],
                   l: list[ir.Value], rows: list[ir.Value], tig2: ir.Value, n0: ir.Value, bm: int, bn: int,
                   s_lead: list, exp, score_in: ir.Value | None = None,
                   causal: bool = False) -> tuple[list, list, list, list]:
    """One key block of FlashAttention's online softmax on scores in the mma accumulator
    layout (``s[j]``: the 4 values of 8-key tile j: rows gid, gid + 8 -- ``rows`` --,
    columns 2 tig, 2 tig + 1), shared by the mma.sync and wgmma kernels: the elementwise
    chain between the matmuls (scale, mask, bias) per score with the tails at -inf, the
    running row maxima ``m`` and sums ``l`` (quad shuffles), and the probabilities.
    Returns (m_new, l_new, alpha -- the factor the accumulator is rescaled by --, p).
    ``score_in``: the value whose elements are the scores, softmax's operand unless told
    (the scores before the mask, for a block the mask leaves whole). ``causal``: the
    mask condition is known to be ``key > query`` over this block (the block table's
    CAUSAL class), so it is computed from the indices instead of read: per score one
    compare of ``row - n0 - 2 tig`` (once a row) with the column's constant offset."""
    Sq, Sk = ch.seq_q, ch.seq_k
    f32 = ir.F32Type.get()
    zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
    score_in = score_in if score_in is not None else ch.sm.operands[0]
    i32 = ir.IntegerType.get_signless(32)
    # key n0 + 2 tig + c is past query row gi iff c > gi - n0 - 2 tig (signed: negative
    # below the block's first key); i32 as sequences are far below 2^31
    offsets = [arith.index_cast(i32, arith.subi(gi, arith.addi(n0, tig2))) for gi in rows] if causal else []
    x = []
    for j in range(bn // 8):
        xj = []
        for k in range(4):
            gi, gj = rows[k // 2], arith.addi(n0, g.add(tig2, 8 * j + k % 2))

            def score(dot=s[j][k], gi=gi, gj=gj, h=k // 2, c=8 * j + k % 2):
                def real():
                    pw.reset()
                    pw.bind(ch.mm1.result, dot)
                    if causal:
                        pw.bind(ch.mask_cond, arith.cmpi(arith.CmpIPredicate.slt, offsets[h], arith.constant(i32, c)))
                    out = scalar_math.convert(pw.eval(score_in, s_lead + [gi, gj]), f32)
                    if causal:
                        del pw.bound[ch.mask_cond]
                    return [out]

                return g.guarded(g.lt(gi, Sq) if ragged(Sq, bm) else None, [f32], real,
                                 lambda: [zero])

            xj.append(g.guarded(g.lt(gj, Sk) if ragged(Sk, bn) else None, [f32], score, lambda: [neg_inf])[0])
        x.append(xj)
    m_new, alpha = [], []
    for h in range(2):  # rows gid and gid + 8
        mx = x[0][2 * h]
        for j in range(bn // 8):
            for k in (2 * h, 2 * h + 1):
                if (j, k) != (0, 2 * h):
                    mx = arith.maximumf(mx, x[j][k])
        mx = arith.maximumf(m[h], quad_reduce(mx, arith.maximumf))
        m_new.append(mx)
        alpha.append(exp(arith.subf(m[h], mx)))
    p = [[exp(arith.subf(x[j][k], m_new[k // 2])) for k in range(4)] for j in range(bn // 8)]
    return m_new, row_sums(l, alpha, p), alpha, p


def row_sums(l: list[ir.Value], alpha: list[ir.Value], p: list[list[ir.Value]]) -> list[ir.Value]:
    """The running row sums after a key block: l rescaled by alpha plus the block's p
    (in the mma accumulator layout: rows gid -- values 0, 1 -- and gid + 8 -- 2, 3)."""
    out = []
    for h in range(2):
        t_ = arith.mulf(l[h], alpha[h])
        for pj in p:
            t_ = arith.addf(arith.addf(t_, pj[2 * h]), pj[2 * h + 1])
        out.append(t_)
    return out
