"""exp, log, log2, log10 and pow of f64 values (scalars or vectors) for kf-to-spirv, from
the operations SPIR-V has for 64 bits: GLSL.std.450's Exp, Log and Pow take only 16- and
32-bit floats, and computing them in f32 would give float64 results with float32's
precision.

- exp(x): x = k ln2 + r with k = roundeven(x / ln2) and a two-part ln2 (k ln2_hi is exact),
  |r| <= ln2 / 2; exp(r) by its Taylor series to r^13 (the rest is below 2^-56), scaled by
  2^k as two factors 2^(k>>1) and 2^(k - (k>>1)), each a normal f64 built from its bits,
  so that results near overflow and subnormal results come out right. About 1 ulp.
- log(x): subnormals scaled by 2^54 first; x = 2^e m with m in [sqrt(1/2), sqrt(2)) from
  the bits; log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its odd series
  to s^23; e ln2 added in two parts. A few ulps. log2 and log10 are log times a constant.
- pow(x, y): the magnitude exp(y log|x|) (relative error about |y log|x|| ulps: 1e-13 at
  the edge of the f64 range), and C's values for negative and zero bases, infinities and
  NaN as kf's f32 pow (``expand_math._powf``).

Special values: exp(+inf) = inf, exp(-inf) = 0, log(0) = -inf, log(x < 0) = NaN,
log(inf) = inf, NaN in NaN out. The expansions run before ``refuse_f64_math``, which
refuses the f64 math that is left."""

from __future__ import annotations

import math

from mlir import ir

from .walk import walk_ops

_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # fdlibm's split: k * hi is exact
_EXP_MAX, _EXP_MIN = 709.782712893384, -745.1332191019412  # exp overflows above, is 0 below

EXPANDED = ("math.exp", "math.log", "math.log2", "math.log10", "math.powf")


def _elem(t: ir.Type) -> ir.Type:
    return ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t


def _like(t: ir.Type, elem: ir.Type) -> ir.Type:
    """t's shape (scalar or vector) with element type elem."""
    return ir.VectorType.get(ir.VectorType(t).shape, elem) if isinstance(t, ir.VectorType) else elem


def _const(t: ir.Type, value):
    from mlir.dialects import arith

    elem = _elem(t)
    attr = ir.IntegerAttr.get(elem, int(value)) if isinstance(elem, ir.IntegerType) else ir.FloatAttr.get(elem, value)
    if isinstance(t, ir.VectorType):
        return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr))
    return arith.constant(t, attr)


def _poly(x, coeffs):
    """coeffs[0] + x * (coeffs[1] + x * (...)) (Horner)."""
    from mlir.dialects import arith

    acc = _const(x.type, coeffs[-1])
    for k in reversed(coeffs[:-1]):
        acc = arith.addf(_const(x.type, k), arith.mulf(x, acc))
    return acc


def _pow2(k):
    """2^k as f64 for i64 k in [-1022, 1023] (a normal number, built from its exponent bits)."""
    from mlir.dialects import arith

    t = k.type
    bits = arith.shli(arith.addi(k, _const(t, 1023)), _const(t, 52))
    return arith.bitcast(_like(t, ir.F64Type.get()), bits)


def exp64(x):
    from mlir.dialects import arith
    from mlir.dialects import math as m

    t, P = x.type, arith.CmpFPredicate
    i64 = _like(t, ir.IntegerType.get_signless(64))
    # k is clamped so that its 2^k factors stay normal; x outside the range is settled below
    kf = m.roundeven(arith.mulf(x, _const(t, 1 / math.log(2))))
    kf = arith.select(arith.cmpf(P.OLT, kf, _const(t, -1080.0)), _const(t, -1080.0), kf)
    kf = arith.select(arith.cmpf(P.OGT, kf, _const(t, 1030.0)), _const(t, 1030.0), kf)
    r = arith.subf(arith.subf(x, arith.mulf(kf, _const(t, _LN2_HI))), arith.mulf(kf, _const(t, _LN2_LO)))
    er = _poly(r, [1.0 / math.factorial(n) for n in range(14)])
    k = arith.fptosi(i64, kf)
    half = arith.shrsi(k, _const(i64, 1))
    out = arith.mulf(arith.mulf(er, _pow2(half)), _pow2(arith.subi(k, half)))
    out = arith.select(arith.cmpf(P.OGT, x, _const(t, _EXP_MAX)), _const(t, math.inf), out)
    out = arith.select(arith.cmpf(P.OLT, x, _const(t, _EXP_MIN)), _const(t, 0.0), out)
    return arith.select(arith.cmpf(P.UNO, x, x), x, out)


def log64(x):
    from mlir.dialects import arith

    t, P = x.type, arith.CmpFPredicate
    i64 = _like(t, ir.IntegerType.get_signless(64))
    tiny = arith.cmpf(P.OLT, x, _const(t, 2.0 ** -1022))
    xs = arith.select(tiny, arith.mulf(x, _const(t, 2.0 ** 54)), x)
    bits = arith.bitcast(i64, xs)
    e = arith.subi(arith.andi(arith.shrui(bits, _const(i64, 52)), _const(i64, 0x7FF)), _const(i64, 1023))
    e = arith.select(tiny, arith.subi(e, _const(i64, 54)), e)
    mant = arith.bitcast(t, arith.ori(arith.andi(bits, _const(i64, (1 << 52) - 1)), _const(i64, 1023 << 52)))
    big = arith.cmpf(P.OGT, mant, _const(t, math.sqrt(2.0)))
    mant = arith.select(big, arith.mulf(mant, _const(t, 0.5)), mant)
    e = arith.select(big, arith.addi(e, _const(i64, 1)), e)
    s = arith.divf(arith.subf(mant, _const(t, 1.0)), arith.addf(mant, _const(t, 1.0)))
    s2 = arith.mulf(s, s)
    # 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...): the tail below s^2, then 2 s added last
    tail = arith.mulf(s2, _poly(s2, [2.0 / (2 * n + 1) for n in range(1, 12)]))
    log_m = arith.addf(arith.mulf(s, _const(t, 2.0)), arith.mulf(s, tail))
    ef = arith.sitofp(t, e)
    out = arith.addf(arith.mulf(ef, _const(t, _LN2_HI)), arith.addf(arith.mulf(ef, _const(t, _LN2_LO)), log_m))
    out = arith.select(arith.cmpf(P.OEQ, x, _const(t, math.inf)), x, out)
    out = arith.select(arith.cmpf(P.OEQ, x, _const(t, 0.0)), _const(t, -math.inf), out)
    out = arith.select(arith.cmpf(P.OLT, x, _const(t, 0.0)), _const(t, math.nan), out)
    return arith.select(arith.cmpf(P.UNO, x, x), x, out)


def _is_f64(t: ir.Type) -> bool:
    return isinstance(_elem(t), ir.F64Type)


def expand_float64_math(gm: ir.Operation) -> None:
    """Rewrite exp, log, log2, log10 and powf of f64 values into arithmetic SPIR-V has for
    64 bits."""
    from mlir.dialects import arith

    from .expand_math import _powf

    def c(t, v):
        return _const(t, v)

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in EXPANDED or not _is_f64(op.results[0].type):
            continue
        with op.location, ir.InsertionPoint(op):
            x = op.operands[0]
            if op.name == "math.exp":
                r = exp64(x)
            elif op.name == "math.log":
                r = log64(x)
            elif op.name == "math.log2":
                r = arith.mulf(log64(x), c(x.type, 1 / math.log(2)))
            elif op.name == "math.log10":
                r = arith.mulf(log64(x), c(x.type, 1 / math.log(10)))
            else:
                r = _powf(x, op.operands[1], c,
                          magnitude=lambda ax, y: exp64(arith.mulf(y, log64(ax))))
        op.results[0].replace_all_uses_with(r)
        op.erase()
