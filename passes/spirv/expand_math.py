"""The math ops upstream's MathToSPIRV lacks (erf, erfc, exp2, trunc, cbrt, atan2, ipowi),
expanded for kf-to-spirv, and powf with torch's values where GLSL's pow is undefined."""

from __future__ import annotations

import math

from mlir import ir

from ..base import PassError
from .walk import walk_ops


#: math ops that upstream's MathToSPIRV (LLVM 22) has no pattern for; kf expands them.
_EXPANDED_MATH = ("math.erf", "math.erfc", "math.exp2", "math.trunc", "math.cbrt", "math.atan2", "math.ipowi",
                  "math.powf")


def _powf(x: ir.Value, y: ir.Value, c) -> ir.Value:
    """x ** y with C's (and torch's) values, from GLSL's pow, which is defined only for
    x > 0: pow(|x|, y) gives the magnitude; a negative base takes the sign of an odd
    integer exponent and is NaN for a non-integer one (except -inf, which C defines for
    every y); a zero base gives 0 or inf (signed by an odd integer exponent); and
    pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1 even for NaN operands, as C's pow."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    t, P = x.type, arith.CmpFPredicate
    ax = m.absf(x)
    p = m.powf(ax, y)
    fy = m.floor(y)
    integer = arith.cmpf(P.OEQ, fy, y)  # false for NaN, true for +-inf
    half = arith.mulf(y, c(t, 0.5))
    odd = arith.andi(integer, arith.cmpf(P.ONE, m.floor(half), half))  # every f32 of magnitude >= 2^25 is even
    signed_p = arith.select(odd, arith.negf(p), p)
    negative = arith.cmpf(P.OLT, x, c(t, 0.0))
    minus_inf = arith.cmpf(P.OEQ, x, c(t, -math.inf))
    r = arith.select(negative, arith.select(arith.ori(integer, minus_inf), signed_p, c(t, math.nan)), p)
    zero = arith.select(arith.cmpf(P.OLT, y, c(t, 0.0)), c(t, math.inf), c(t, 0.0))
    zero = arith.select(odd, m.copysign(zero, x), zero)  # (-0) ** odd keeps the sign
    zero = arith.select(arith.cmpf(P.UNO, y, y), c(t, math.nan), zero)
    r = arith.select(arith.cmpf(P.OEQ, x, c(t, 0.0)), zero, r)
    r = arith.select(arith.cmpf(P.UNO, x, y), c(t, math.nan), r)
    unit = arith.ori(arith.cmpf(P.OEQ, y, c(t, 0.0)), arith.cmpf(P.OEQ, x, c(t, 1.0)))
    unit = arith.ori(unit, arith.andi(arith.cmpf(P.OEQ, x, c(t, -1.0)),
                                      arith.cmpf(P.OEQ, m.absf(y), c(t, math.inf))))
    return arith.select(unit, c(t, 1.0), r)


def expand_math(gm: ir.Operation) -> None:
    """Rewrite the ops of ``_EXPANDED_MATH`` into ops SPIR-V has (GLSL.std.450).

    erf: Taylor series below |x| = 0.5 (relative error < 1e-7), Abramowitz-Stegun 7.1.26
    above (absolute error < 1.5e-7); erfc: 1 - erf below 0.5, A-S directly above (so large
    arguments do not cancel to 0 early); exp2(x) = pow(2, x); trunc(x) = copysign(floor(|x|),
    x); cbrt(x) = copysign(pow(|x|, 1/3), x); atan2 by quadrant from atan(y / x);
    ipowi by square-and-multiply over the exponent's bits (negative exponents: 0, except
    for bases 1 and -1, as upstream's ipowi expansion). powf keeps GLSL's pow for the
    magnitude and takes torch's values where GLSL's pow is undefined (``_powf``)."""
    from mlir.dialects import arith, scf
    from mlir.dialects import math as m

    def c(t, v):
        if isinstance(t, ir.IntegerType):
            return arith.constant(t, int(v))
        return arith.constant(t, float(v))

    def poly(x, coeffs):  # Horner: coeffs[0] + x * (coeffs[1] + ...)
        t = x.type
        acc = c(t, coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = arith.addf(c(t, k), arith.mulf(x, acc))
        return acc

    def erf_parts(x):
        t = x.type
        ax = m.absf(x)
        x2 = arith.mulf(x, x)
        small = arith.mulf(arith.mulf(x, c(t, 2 / math.sqrt(math.pi))),
                           poly(x2, [1.0, -1 / 3, 1 / 10, -1 / 42, 1 / 216, -1 / 1320]))
        tt = arith.divf(c(t, 1.0), arith.addf(c(t, 1.0), arith.mulf(c(t, 0.3275911), ax)))
        tail = arith.mulf(arith.mulf(tt, poly(tt, [0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                                     1.061405429])), m.exp(arith.negf(x2)))
        is_small = arith.cmpf(arith.CmpFPredicate.OLT, ax, c(t, 0.5))
        return ax, small, tail, is_small

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in _EXPANDED_MATH:
            continue
        if isinstance(op.results[0].type, ir.ShapedType):
            raise PassError(f"{op.name} on vectors is not supported by kf-to-spirv: apply it per element", op.location)
        with op.location, ir.InsertionPoint(op):
            x = op.operands[0]
            t = x.type
            if op.name == "math.erf":
                ax, small, tail, is_small = erf_parts(x)
                r = arith.select(is_small, small, m.copysign(arith.subf(c(t, 1.0), tail), x))
            elif op.name == "math.erfc":
                ax, small, tail, is_small = erf_parts(x)
                positive = arith.cmpf(arith.CmpFPredicate.OGE, x, c(t, 0.5))
                near = arith.subf(c(t, 1.0), arith.select(is_small, small, m.copysign(arith.subf(c(t, 1.0), tail), x)))
                r = arith.select(positive, tail, near)
            elif op.name == "math.powf":
                r = _powf(x, op.operands[1], c)
            elif op.name == "math.exp2":
                r = m.powf(c(t, 2.0), x)
            elif op.name == "math.trunc":
                r = m.copysign(m.floor(m.absf(x)), x)
            elif op.name == "math.cbrt":
                r = m.copysign(m.powf(m.absf(x), c(t, 1 / 3)), x)
            elif op.name == "math.atan2":
                y, xx = op.operands[0], op.operands[1]
                a = m.atan(arith.divf(y, xx))
                neg_x = arith.cmpf(arith.CmpFPredicate.OLT, m.copysign(c(t, 1.0), xx), c(t, 0.0))
                a = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, xx, c(t, 0.0)),
                                 arith.addf(a, m.copysign(c(t, math.pi), y)), a)
                both_zero = arith.andi(arith.cmpf(arith.CmpFPredicate.OEQ, xx, c(t, 0.0)),
                                       arith.cmpf(arith.CmpFPredicate.OEQ, y, c(t, 0.0)))
                r = arith.select(both_zero, arith.select(neg_x, m.copysign(c(t, math.pi), y),
                                                         m.copysign(c(t, 0.0), y)), a)
            else:  # math.ipowi
                base, e = op.operands[0], op.operands[1]
                width = ir.IntegerType(t).width
                index = ir.IndexType.get()
                loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, width), arith.constant(index, 1),
                                 [c(t, 1), base, e])
                with ir.InsertionPoint(loop.body):
                    acc, b, k = loop.inner_iter_args
                    bit = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(k, c(t, 1)), c(t, 0))
                    scf.YieldOp([arith.select(bit, arith.muli(acc, b), acc), arith.muli(b, b),
                                 arith.shrui(k, c(t, 1))])
                pos = loop.results[0]
                odd = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(e, c(t, 1)), c(t, 0))
                neg = arith.select(arith.cmpi(arith.CmpIPredicate.eq, base, c(t, 1)), c(t, 1),
                                   arith.select(arith.cmpi(arith.CmpIPredicate.eq, base, c(t, -1)),
                                                arith.select(odd, c(t, -1), c(t, 1)), c(t, 0)))
                r = arith.select(arith.cmpi(arith.CmpIPredicate.slt, e, c(t, 0)), neg, pos)
        op.results[0].replace_all_uses_with(r)
        op.erase()
