"""The Hopper kernel's softmax of a key block: the online softmax of the scores in the
wgmma accumulators, in the log2 domain where the chain before it only scales them.

Scores that the chain between the products only scales (muls and divs by rank-0 values
and constants, casts: the seed's ``/ sqrt(d)``, fp8's dequantization factors) take
``linear_softmax``: the factors (times log2 e) folded into one value at the kernel's
start; a score then costs a max, an FFMA, an ex2 and an add (and the P chain's
power-of-two scale goes into the exponent), where the general chain (``online_softmax``)
costs its ops one by one. Casts of the scores to a narrower float are not rounded there,
as the products' own 16-bit result types are not (both kernels keep S in f32).

``BlockSoftmax`` is the kernel's part: the scale and the P chain's exponent, the
softmax of a block whatever its class under the mask (whole, causal, partial), O's
rescale.
"""

from __future__ import annotations

import math
from typing import Callable

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import defining
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, llvm, nvvm
from mlir.dialects import math as mmath

from ...kernel_ir import GpuFunc, Pointwise, float_constant, quad_reduce
from ...run_time_sizes import ragged
from ..softmax import online_softmax, row_sums

#: Where the scores are linear and the producer warpgroup overlaps products with the
#: softmax, the running row maxima move only when a row of the warp would gain more than
#: this (log2 units: P then up to 2^8, which bf16 and f16 hold, and O and l in f32 keep
#: their sums; fp8 less, ``lazy_threshold``), and O's rescale (Dv / 2 FMULs a thread a
#: block) is skipped where they did not -- exact, as O and l share the maxima they were
#: summed under (FlashAttention-4's conditional rescaling).
LAZY_RESCALE = 8.0

#: The largest finite value of each fp8 type (e4m3fn saturates there).
FP8_MAX = {"f8E4M3FN": 448.0, "f8E5M2": 57344.0}

#: kf ops whose result is >= 0 (or NaN) when their operands are (``nonnegative``).
_KEEPS_SIGN = {"kf.mul", "kf.div", "kf.add", "kf.min", "kf.cast", "kf.reciprocal", "kf.rsqrt", "kf.sqrt"}
_NONNEGATIVE = {"kf.abs", "kf.exp", "kf.sigmoid", "kf.relu"}


def lazy_threshold(elem: str, p_scale: float, log2_p: float) -> float | None:
    """``LAZY_RESCALE``'s threshold (log2 units) for P of type ``elem``, or None for every
    block's rescale: P is up to 2^threshold times the P chain's scale c, which fp8 must
    hold (e4m3 at c = 256: 448 / 256 leaves 0.75, in eighths)."""
    if elem not in FP8_MAX:
        return LAZY_RESCALE
    c = 2.0 ** log2_p if log2_p else p_scale
    room = math.floor(math.log2(FP8_MAX[elem] / c) * 8) / 8 if c > 0 else 0.0
    return min(LAZY_RESCALE, room) if room > 0 else None


def linear_factors(ch, scores: ir.Value | None = None) -> list[tuple[ir.Value, bool]] | None:
    """The rank-0 values the chain from q k^T to the softmax (or to ``scores``: the
    scores before a mask) multiplies (False) or divides (True) the scores by, in order,
    when that is all it does besides casts between floats; None otherwise (a mask, a
    bias, any other op)."""
    v, factors = scores if scores is not None else ch.sm.operands[0], []
    while v != ch.mm1.result:
        op = defining(v)
        if op is None:
            return None
        if op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(v.type).is_float:
            v = op.operands[0]
            continue
        if op.name not in ("kf.mul", "kf.div"):
            return None
        a, b = op.operands
        if spec_of(b.type).shape and op.name == "kf.mul" and not spec_of(a.type).shape:
            a, b = b, a
        if spec_of(b.type).shape:
            return None
        factors.append((b, op.name == "kf.div"))
        v = a
    return factors


def positive_constant(pw: Pointwise, factors) -> float | None:
    """The product of the factors where all are compile-time constants and it is
    positive (then the row maximum may be taken on the unscaled scores)."""
    prod = 1.0
    for x, div in factors:
        c = float_constant(pw.eval(x, []))
        if c is None or c == 0:
            return None
        prod = prod / c if div else prod * c
    return prod if prod > 0 else None


def nonnegative(v: ir.Value) -> bool:
    """Whether a rank-0 value of the kernel is >= 0 (or NaN) by construction: fills,
    abs, exp, max with something non-negative, and products, quotients, sums, casts of
    such values -- fp8's dequantization factor 1 / ((448 / max(amax_q, eps)) (448 /
    max(amax_k, eps))), which kf-fuse computes in the attention kernel. Arguments are
    not: the caller's scales could be negative."""
    op = defining(v)
    if op is None or spec_of(v.type).shape:
        return False
    if op.name == "kf.fill":
        return op_attrs(op)["value"] >= 0
    if op.name in _NONNEGATIVE:
        return True
    if op.name == "kf.max":
        return any(nonnegative(x) for x in op.operands)
    if op.name == "kf.pow":
        return nonnegative(op.operands[0])
    if op.name in _KEEPS_SIGN:
        return all(nonnegative(x) for x in op.operands)
    return False


def uniform(pred: ir.Value) -> ir.Value:
    """``pred``, the same in every lane, as a warp vote's result (``vote.sync.ballot``
    != 0), which ptxas knows to be uniform over the warp. The key loops' branches around
    products (which kind of softmax a block takes; in the per-block loop, whether the
    block runs at all) test such votes: their conditions are the same in every thread
    (table entries, bar.red results), but where ptxas cannot tell, a wgmma whose register
    operands come out of a branch it thinks divergent makes it serialize every wgmma of
    the kernel (C7520)."""
    i32 = ir.IntegerType.get_signless(32)
    b = nvvm.vote_sync(i32, arith.constant(i32, -1), pred, nvvm.VoteSyncKind.ballot)
    return arith.cmpi(arith.CmpIPredicate.ne, b, arith.constant(i32, 0))


def softmax_exp2(x: ir.Value) -> ir.Value:
    """2^x in f32 for ``linear_softmax``: ``math.exp2`` with ``fastmath<afn>``, which
    kf-to-cuda makes the ``ex2.approx.ftz`` intrinsic (passes/to_cuda.py,
    ``_approximate_math``): one MUFU.EX2, where ``ex2.approx.f32`` without ftz makes ptxas
    keep subnormal results by wrapping each MUFU.EX2 in an FSETP, a predicated FMUL before
    and a predicated squaring after. Flushed are only probabilities below 2^-126 of the
    row's maximum, which no bf16 or fp8 P, and no f32 row sum, can tell from 0. The masked
    kernels' general chains keep ``math.exp2``: with the ftz form they spilled."""
    return mmath.exp2(x, fastmath=ir.Attribute.parse(scalar_math.AFN))


def linear_softmax(g: GpuFunc, ch, s, m, l, scale, positive: bool, log2_p: float, tig2, n0, bn: int,
                   lazy: float | None = None, masked: Callable[[int, int], ir.Value] | None = None,
                   whole: bool = False):
    """``online_softmax`` for scores the chain only scales (``linear_factors``), in the
    log2 domain: ``scale`` is the factors' product times log2 e, ``m`` the running
    maxima of scaled scores; p = 2^(s scale - m + log2_p) (the P chain's power-of-two
    scale c = 2^log2_p inside the exponent), and l sums those p, so l / c is the sum of
    the unscaled ones. With a positive scale (a constant, or ``nonnegative`` factors)
    the maximum is taken on the raw scores and each p is one FFMA and one ex2; else
    each score is scaled first.

    ``lazy`` (``LAZY_RESCALE``, log2 units): the running maxima move only when a row of
    the warp would gain more than that, and then every row of the warp takes its own;
    else p is up to 2^lazy and alpha is 1. Returns, after (m, l, alpha, p), whether the
    maxima moved (a warp-uniform i1; None without ``lazy``), so that the caller may skip
    O's rescale (FlashAttention-4's conditional rescaling). ``masked(j, k)``: an i1,
    whether a mask takes score k of 8-key tile j out (-inf). ``whole``: the block lies within the keys
    (no tail guard, where the keys' length is ragged)."""
    Sk = ch.seq_k
    neg_inf = g.fconst(-math.inf)
    tail = ragged(Sk, bn) and not whole
    x = []
    for j in range(bn // 8):
        xj = []
        for k in range(4):
            v = s[j][k] if positive else arith.mulf(s[j][k], scale)
            if tail:
                gj = arith.addi(n0, g.add(tig2, 8 * j + k % 2))
                v = arith.select(g.lt(gj, Sk), v, neg_inf)
            if masked is not None:
                v = arith.select(masked(j, k), neg_inf, v)
            xj.append(v)
        x.append(xj)
    m_new, alpha, shift = [], [], []

    def scale_of(h, mx):
        alpha.append(softmax_exp2(arith.subf(m[h], mx)))
        # a row with no finite score yet (-inf everywhere) takes p = 0, not NaN
        safe = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mx, neg_inf), g.fconst(0.0), mx)
        shift.append(arith.subf(g.fconst(log2_p), safe) if log2_p else arith.negf(safe))

    for h in range(2):
        mx = x[0][2 * h]
        for j in range(bn // 8):
            for k in (2 * h, 2 * h + 1):
                if (j, k) != (0, 2 * h):
                    mx = arith.maximumf(mx, x[j][k])
        mx = quad_reduce(mx, arith.maximumf)
        if positive:
            mx = arith.mulf(mx, scale)
        m_new.append(arith.maximumf(m[h], mx))
        if lazy is None:
            scale_of(h, m_new[h])
    moved = None
    if lazy is not None:
        # any row of the warp gaining more than lazy (from -inf: the first block) moves all
        gains = [arith.cmpf(arith.CmpFPredicate.UGT, arith.subf(m_new[h], m[h]), g.fconst(lazy)) for h in range(2)]
        moved = uniform(arith.ori(*gains))
        m_new = [arith.select(moved, m_new[h], m[h]) for h in range(2)]
        for h in range(2):
            scale_of(h, m_new[h])
    if positive:
        p = [[softmax_exp2(mmath.fma(x[j][k], scale, shift[k // 2])) for k in range(4)] for j in range(bn // 8)]
    else:
        p = [[softmax_exp2(arith.addf(x[j][k], shift[k // 2])) for k in range(4)] for j in range(bn // 8)]
    if lazy is not None:
        return m_new, row_sums(l, alpha, p), alpha, p, moved
    return m_new, row_sums(l, alpha, p), alpha, p


class BlockSoftmax:
    """The kernel's softmax part (``k``: the HopperAttention whose tile it reads):
    ``linear`` ((scale, positive) of ``linear_softmax``, or None for the general chain),
    ``log2_p`` (the P chain's power-of-two scale, inside the exponent; else 0) and
    ``masked_linear`` (the walk's whole and causal blocks: the scale of the scores before
    the mask)."""

    def __init__(self, k):
        self.k = k
        self.linear, self.log2_p, self.masked_linear = None, 0.0, None
        #: the blocks being written lie within the keys (``Consumer.key_loop``'s first
        #: loop): the linear softmax leaves out its tail guard
        self.whole = False

    def linear_scale(self, factors):
        """(the factors' product times log2 e, whether the maximum may be taken on the
        raw scores) for ``linear_softmax``."""
        g, pw = self.k.g, self.k.pw
        positive = positive_constant(pw, factors)
        if positive is not None:
            return g.fconst(positive * math.log2(math.e)), True
        scale = g.fconst(math.log2(math.e))
        for x, div in factors:
            xv = scalar_math.convert(pw.eval(x, []), ir.F32Type.get())
            scale = arith.divf(scale, xv) if div else arith.mulf(scale, xv)
        if all(nonnegative(x) for x, _ in factors):
            # >= 0, so the row maximum may be taken on the raw scores (one FMUL a score
            # fewer); at least the least normal float, so that a zero cannot make a ragged
            # tail's -inf * 0 a NaN
            return arith.maximumf(scale, g.fconst(2.0 ** -126)), True
        return scale, False

    def set_linear(self, factors, p_scale: float) -> None:
        """The linear scores' scale, and the P chain's exponent where its scale is a power
        of two."""
        self.linear = self.linear_scale(factors)
        e = math.frexp(p_scale)
        if p_scale > 0 and e[0] == 0.5:  # a power of two: into the exponent
            self.log2_p = float(e[1] - 1)

    def exp(self, x):
        """e^x as 2^(x log2 e) (the masked and general chains: with ex2.approx.ftz the
        masked kernel spilled)."""
        return mmath.exp2(arith.mulf(x, self.k.log2e))

    def block(self, n0, acc, m, l, score_in=None, causal_mask=False, lazy=None):
        """The online softmax of a key block's S accumulator: (m, l, alpha, p), and
        with ``lazy`` (linear scores only) whether the maxima moved."""
        k = self.k
        f32 = ir.F32Type.get()
        s = [[llvm.extractvalue(f32, acc, [4 * j + i]) for i in range(4)] for j in range(k.bn // 8)]
        if self.linear is not None:
            return linear_softmax(k.g, k.ch, s, m, l, self.linear[0], self.linear[1], self.log2_p, k.tig2, n0, k.bn,
                                  lazy, whole=self.whole)
        return online_softmax(k.g, k.pw, k.ch, s, m, l, k.rows, k.tig2, n0, k.bm, k.bn, k.s_lead, self.exp, score_in,
                              causal=causal_mask)

    def classified(self, n0, acc, m, l, unmasked=None, causal=None):
        """``block`` of a block the mask may leave alone (``unmasked``) or give the
        causal pattern (``causal``): uniform branches over the three. With
        ``masked_linear`` (the walk's blocks) the first two take ``linear_softmax``, in
        the log2 domain: m is kept in the scores' units (the mask's fill compares with
        it), so it is scaled by log2 e into it and back out."""
        k = self.k
        g, bn = k.g, k.bn
        f32 = ir.F32Type.get()

        def softmax(score_in=None, causal_mask=False):
            if self.masked_linear is not None and (score_in is not None or causal_mask):
                s = [[llvm.extractvalue(f32, acc, [4 * j + i]) for i in range(4)] for j in range(bn // 8)]
                masked = None
                if causal_mask:  # key n0 + 2 tig + c past query row: c > row - n0 - 2 tig
                    i32 = ir.IntegerType.get_signless(32)
                    offsets = [arith.index_cast(i32, arith.subi(gi, arith.addi(n0, k.tig2))) for gi in k.rows]
                    masked = lambda j, i: arith.cmpi(arith.CmpIPredicate.slt, offsets[i // 2],  # noqa: E731
                                                     arith.constant(i32, 8 * j + i % 2))
                m2 = [arith.mulf(x, k.log2e) for x in m]
                m_, l_, a_, p_ = linear_softmax(g, k.ch, s, m2, l, self.masked_linear[0], self.masked_linear[1], 0.0,
                                                k.tig2, n0, bn, masked=masked)
                m_ = [arith.mulf(x, g.fconst(math.log(2.0))) for x in m_]
            else:
                m_, l_, a_, p_ = self.block(n0, acc, m, l, score_in, causal_mask)
            return m_ + l_ + a_ + [x for pj in p_ for x in pj]

        flat_types = [f32] * (6 + bn // 2)

        def masked_softmax():
            if causal is None:
                return softmax()
            return g.guarded(uniform(causal), flat_types, lambda: softmax(causal_mask=True), softmax)

        if unmasked is None:
            flat = masked_softmax()
        else:
            flat = g.guarded(uniform(unmasked), flat_types, lambda: softmax(k.ch.unmasked_scores), masked_softmax)
        return flat[0:2], flat[2:4], flat[4:6], [flat[6 + 4 * j: 10 + 4 * j] for j in range(bn // 8)]

    def rescale(self, o, alpha):
        """O *= alpha (the rows' rescale), in the accumulator registers."""
        k = self.k
        f32 = ir.F32Type.get()
        ov = [arith.mulf(llvm.extractvalue(f32, o, [i]), alpha[(i % 4) // 2]) for i in range(k.Dv // 2)]
        o = llvm.mlir_undef(k.o_t)
        for i, v in enumerate(ov):
            o = llvm.insertvalue(o, v, [i])
        return o

    def rescaled(self, o, alpha, moved):
        """``rescale``, skipped where ``moved`` (the lazy rescale's warp vote) is false:
        alpha is 1 there."""
        if moved is None:
            return self.rescale(o, alpha)
        return self.k.g.guarded(moved, [self.k.o_t], lambda: [self.rescale(o, alpha)], lambda: [o])[0]
