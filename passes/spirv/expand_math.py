"""The math ops upstream's MathToSPIRV lacks (erf, erfc, exp2, trunc, cbrt, atan2, ipowi),
expanded for kf-to-spirv, powf with torch's values where GLSL's pow is undefined, sin/cos
with an exact argument reduction (GLSL's Sin/Cos promise an error bound only in [-pi, pi]),
and an exact fmod (arith.remf; SPIR-V's remainders round the quotient)."""

from __future__ import annotations

import math
import struct

from mlir import ir

from ..base import PassError
from .walk import walk_ops


#: math ops that upstream's MathToSPIRV (LLVM 22) has no pattern for; kf expands them.
_EXPANDED_MATH = ("math.asin", "math.acos", "math.erf", "math.erfc", "math.exp2", "math.trunc", "math.cbrt", "math.atan2", "math.ipowi",
                  "math.powf", "math.sin", "math.cos", "arith.remf")

#: The bits of 2/pi after the binary point, as big-endian 32-bit words behind one word of zeros
#: (so that the Payne-Hanek window of arguments down to 2^-7 starts inside the table).
_TWO_OVER_PI_WORDS = (0x00000000, 0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599, 0x3C439041,
                      0xFE5163AB)
#: pi/2 as an f32 and the f32 nearest to the remainder.
_PIO2_HI, _PIO2_LO = 1.5707963705062866, -4.371138828673793e-08
#: Cephes' sinf and cosf minimax coefficients on [-pi/4, pi/4].
_SIN_COEFFS = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS_COEFFS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


def _powf(x: ir.Value, y: ir.Value, c, magnitude=None) -> ir.Value:
    """x ** y with C's (and torch's) values, from GLSL's pow, which is defined only for
    x > 0: pow(|x|, y) (or ``magnitude(|x|, y)``) gives the magnitude; a negative base takes the sign of an odd
    integer exponent and is NaN for a non-integer one (except -inf, which C defines for
    every y); a zero base gives 0 or inf (signed by an odd integer exponent); and
    pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1 even for NaN operands, as C's pow."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    t, P = x.type, arith.CmpFPredicate
    ax = m.absf(x)
    p = magnitude(ax, y) if magnitude is not None else m.powf(ax, y)
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


def _split_f32(v: float) -> float:
    """v as an f32 with the low 12 bits of its significand cleared (an exact 12-bit half)."""
    (b,) = struct.unpack("<I", struct.pack("<f", v))
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFF000))[0]


def _sincos(x: ir.Value, cosine: bool) -> ir.Value:
    """sin(x) or cos(x) of f32 scalars or vectors, within about 1 ulp for every finite x.

    x = q * pi/2 + r with |r| <= pi/4: |x| <= pi/4 is its own r; above, a Payne-Hanek
    reduction in 32-bit integers: the 24-bit mantissa times a 96-bit window of 2/pi chosen by
    the exponent (OpUMulExtended) gives x * 2/pi mod 4 with 94 fraction bits, so even the
    remainders nearest a multiple of pi/2 keep 24 bits. It is exact for every argument, which
    a Cody-Waite reduction in floats is only with a fused fma, and GLSL's Fma may round the
    product (a three-part Cody-Waite with Fma was 1e-3 off at x = 7734 on lavapipe). Every shift is by less than 32 (SPIR-V
    leaves a shift by 32 undefined). r is carried as two floats, r + rl, into Cephes'
    polynomials for sin and cos, picked and signed by the quadrant. sin(-0) = -0; inf and NaN
    give NaN."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    ft = x.type
    shape = ir.VectorType(ft).shape if isinstance(ft, ir.VectorType) else None
    it = ir.VectorType.get(shape, ir.IntegerType.get_signless(32)) if shape else ir.IntegerType.get_signless(32)

    def c(t, v):
        elem = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
        if isinstance(elem, ir.IntegerType):
            v = int(v) & 0xFFFFFFFF
            attr = ir.IntegerAttr.get(elem, v - (1 << 32) if v >= 1 << 31 else v)
        else:
            attr = ir.FloatAttr.get(elem, float(v))
        if isinstance(t, ir.VectorType):
            return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr))
        return arith.constant(t, attr)

    P, I = arith.CmpFPredicate, arith.CmpIPredicate
    shl = lambda a, n: arith.shli(a, c(it, n))
    shr = lambda a, n: arith.shrui(a, c(it, n))
    band = lambda a, n: arith.andi(a, c(it, n))

    def poly(z, coeffs):
        acc = c(ft, coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = m.fma(acc, z, c(ft, k))
        return acc

    def split(v):  # the leading 12 bits of v's significand, so that products of two are exact
        return arith.bitcast(ft, arith.andi(arith.bitcast(it, v), c(it, 0xFFFFF000)))

    ax = m.absf(x)
    bits = arith.bitcast(it, x)
    # Payne-Hanek on |x|: x = mant * 2^e, e = biased exponent - 150; the window starts at the bit of
    # 2/pi worth 2^(1-e) (higher bits give multiples of 4 quadrants), bit e + 30 of the table.
    mant = arith.ori(band(bits, 0x7FFFFF), c(it, 0x800000))
    start = arith.subi(band(shr(bits, 23), 0xFF), c(it, 150 - 30))
    start = arith.maxsi(start, c(it, 0))  # only |x| >= 2^-7 reach here; keeps small x in the table
    k = shr(start, 5)
    sh = band(start, 31)

    def word(offset):
        w = c(it, 0)
        for idx, value in enumerate(_TWO_OVER_PI_WORDS):
            if idx - offset >= 0:
                w = arith.select(arith.cmpi(I.eq, k, c(it, idx - offset)), c(it, value), w)
        return w

    t = [word(i) for i in range(4)]
    inv = arith.subi(c(it, 31), sh)
    w = [arith.ori(arith.shli(t[i], sh), arith.shrui(shr(t[i + 1], 1), inv)) for i in range(3)]
    lo2, hi2 = arith.mului_extended(mant, w[2])
    lo1, hi1 = arith.mului_extended(mant, w[1])
    lo0 = arith.muli(mant, w[0])
    p2 = lo2
    p1 = arith.addi(lo1, hi2)
    carry = arith.extui(it, arith.cmpi(I.ult, p1, lo1)) if shape is None else \
        arith.select(arith.cmpi(I.ult, p1, lo1), c(it, 1), c(it, 0))
    p0 = arith.addi(arith.addi(lo0, hi1), carry)
    q_ph = shr(arith.addi(p0, c(it, 1 << 29)), 30)  # to the nearest quadrant
    hi = arith.ori(shl(p0, 2), shr(p1, 30))  # signed fraction of a quadrant, in [-1/2, 1/2), * 2^32
    lo = arith.ori(shl(p1, 2), shr(p2, 30))
    neg = arith.cmpi(I.slt, hi, c(it, 0))
    lo_m = arith.select(neg, arith.subi(c(it, 0), lo), lo)
    hi_inv = arith.xori(hi, c(it, -1))
    hi_m = arith.select(neg, arith.select(arith.cmpi(I.eq, lo, c(it, 0)), arith.addi(hi_inv, c(it, 1)), hi_inv), hi)
    # |fraction| = A * 2^-24 + B * 2^-32 + C * 2^-56, each part exact in f32; the sum as hi + lo floats
    a = arith.mulf(arith.uitofp(ft, shr(hi_m, 8)), c(ft, 2.0 ** -24))
    b = m.fma(arith.uitofp(ft, band(hi_m, 0xFF)), c(ft, 2.0 ** -32),
              arith.mulf(arith.uitofp(ft, shr(lo_m, 8)), c(ft, 2.0 ** -56)))
    vh = arith.addf(a, b)
    vl = arith.subf(b, arith.subf(vh, a))
    # r = (vh + vl) * pi/2 as rh + rl: the leading product of 12-bit halves is exact in f32 and
    # the rest is small, so their sum's rounding error is kept (no fused fma needed)
    vh1 = split(vh)
    vh2 = arith.subf(vh, vh1)
    h1 = _split_f32(_PIO2_HI)
    h2 = _PIO2_HI - h1
    lead = arith.mulf(vh1, c(ft, h1))
    rest = arith.addf(arith.addf(arith.mulf(vh1, c(ft, h2)), arith.mulf(vh2, c(ft, h1))),
                      arith.addf(arith.mulf(vh2, c(ft, h2)),
                                 arith.addf(arith.mulf(vh, c(ft, _PIO2_LO)), arith.mulf(vl, c(ft, _PIO2_HI)))))
    rh_ph = arith.addf(lead, rest)
    rl_ph = arith.subf(rest, arith.subf(rh_ph, lead))
    flip = arith.xori(neg, arith.cmpi(I.slt, bits, c(it, 0)))
    rh_ph = arith.select(flip, arith.negf(rh_ph), rh_ph)
    rl_ph = arith.select(flip, arith.negf(rl_ph), rl_ph)
    minus = arith.cmpi(I.slt, bits, c(it, 0))
    q_ph = arith.select(minus, arith.subi(c(it, 0), q_ph), q_ph)

    small = arith.cmpf(P.OLE, ax, c(ft, math.pi / 4))  # already reduced (and below the table's reach)
    r = arith.select(small, x, rh_ph)
    rl = arith.select(small, c(ft, 0.0), rl_ph)
    q = arith.select(small, c(it, 0), q_ph)
    if cosine:
        q = arith.addi(q, c(it, 1))
    # sin(r + rl) = r + (r^3 p(r^2) + rl); cos(r + rl) = 1 - z/2 + z^2 p(z) - r rl with z = r^2
    # as z + zl (from r's 12-bit halves) and 1 - z/2 as w plus its rounding error
    z = arith.mulf(r, r)
    s = arith.addf(r, arith.addf(arith.mulf(arith.mulf(r, z), poly(z, _SIN_COEFFS)), rl))
    r1 = split(r)
    r2 = arith.subf(r, r1)
    zl = arith.addf(arith.addf(arith.subf(arith.mulf(r1, r1), z), arith.mulf(arith.mulf(r1, r2), c(ft, 2.0))),
                    arith.mulf(r2, r2))
    half = arith.mulf(z, c(ft, 0.5))
    w = arith.subf(c(ft, 1.0), half)
    tail = arith.subf(arith.subf(c(ft, 1.0), w), half)
    tail = arith.subf(tail, arith.addf(arith.mulf(zl, c(ft, 0.5)), arith.mulf(r, rl)))
    co = arith.addf(w, arith.addf(arith.mulf(arith.mulf(z, z), poly(z, _COS_COEFFS)), tail))
    odd = arith.cmpi(I.ne, band(q, 1), c(it, 0))
    y = arith.select(odd, co, s)
    y = arith.select(arith.cmpi(I.ne, band(q, 2), c(it, 0)), arith.negf(y), y)
    if not cosine:
        y = arith.select(arith.cmpf(P.OEQ, x, c(ft, 0.0)), x, y)  # sin(-0) = -0
    return arith.select(arith.cmpf(P.UEQ, ax, c(ft, math.inf)), c(ft, math.nan), y)


def _fmod(x: ir.Value, y: ir.Value) -> ir.Value:
    """C's fmod of f32 scalars or vectors, exactly (SPIR-V's OpFRem and OpFMod are
    x - y * trunc(x / y) with a rounded quotient: fmod(1.0, 0.1) would be 0).

    With |x| = mx 2^kx and |y| = my 2^ky (24-bit integer significands, kx >= ky where
    |x| >= |y|), fmod(|x|, |y|) = ((mx 2^(kx - ky)) mod my) 2^ky: 2^(kx - ky) mod my by
    square-and-multiply over the 8 bits of kx - ky (at most 253), every product of two
    residues below 2^48 in 64-bit integers; the residue r < my is exact in f32 and so is
    r 2^ky, which is below |y| on y's grid. The sign is x's; |x| < |y| gives x; y = 0,
    x infinite or NaN give NaN; y infinite gives x."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    ft = x.type
    shape = ir.VectorType(ft).shape if isinstance(ft, ir.VectorType) else None

    def typ(elem):
        return ir.VectorType.get(shape, elem) if shape else elem

    i32, i64 = typ(ir.IntegerType.get_signless(32)), typ(ir.IntegerType.get_signless(64))

    def c(t, v):
        elem = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
        attr = ir.IntegerAttr.get(elem, int(v)) if isinstance(elem, ir.IntegerType) else ir.FloatAttr.get(elem, float(v))
        if isinstance(t, ir.VectorType):
            return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr))
        return arith.constant(t, attr)

    P, I = arith.CmpFPredicate, arith.CmpIPredicate
    ax, ay = m.absf(x), m.absf(y)
    bx, by = arith.bitcast(i32, ax), arith.bitcast(i32, ay)

    def parts(bits):  # (significand as an integer, exponent of its unit, biased: kx - 150 is the power)
        e = arith.shrui(bits, c(i32, 23))
        frac = arith.andi(bits, c(i32, 0x7FFFFF))
        normal = arith.cmpi(I.ne, e, c(i32, 0))
        mant = arith.select(normal, arith.ori(frac, c(i32, 0x800000)), frac)
        return mant, arith.maxsi(e, c(i32, 1))

    mx, kx = parts(bx)
    my, ky = parts(by)
    d = arith.subi(kx, ky)
    my64 = arith.extui(i64, my)
    p = c(i64, 1)
    for bit in range(7, -1, -1):
        p = arith.remui(arith.muli(p, p), my64)
        doubled = arith.remui(arith.shli(p, c(i64, 1)), my64)
        set_ = arith.cmpi(I.ne, arith.andi(arith.shrui(d, c(i32, bit)), c(i32, 1)), c(i32, 0))
        p = arith.select(set_, doubled, p)
    r = arith.remui(arith.muli(arith.extui(i64, mx), p), my64)
    # 2^(ky - 150) as f32 bits: normal from ky >= 24 on, else the subnormal 2^(ky - 1) units
    scale_bits = arith.select(arith.cmpi(I.sge, ky, c(i32, 24)),
                              arith.shli(arith.subi(ky, c(i32, 23)), c(i32, 23)),
                              arith.shli(c(i32, 1), arith.subi(ky, c(i32, 1))))
    mag = arith.mulf(arith.uitofp(ft, arith.trunci(i32, r)), arith.bitcast(ft, scale_bits))
    out = m.copysign(mag, x)
    out = arith.select(arith.cmpf(P.OLT, ax, ay), x, out)  # also x = +-0, and y = inf for finite x
    bad = arith.ori(arith.cmpf(P.OEQ, ay, c(ft, 0.0)),
                    arith.ori(arith.cmpf(P.UNO, x, y), arith.cmpf(P.OEQ, ax, c(ft, math.inf))))
    return arith.select(bad, c(ft, math.nan), out)


def _unroll_vectors(gm: ir.Operation) -> None:
    """Each op of ``_EXPANDED_MATH`` but sin, cos and remf (expanded on vectors as they are) on a
    1-D vector becomes one op per lane, joined again with vector.from_elements: the
    expansions below are written for scalars (a row-wise kernel applies a power to the
    vectors it loads)."""
    from mlir.dialects import vector

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in _EXPANDED_MATH or op.name in ("math.sin", "math.cos", "arith.remf"):
            continue
        vt = op.results[0].type
        if not isinstance(vt, ir.VectorType):
            continue
        if vt.rank != 1:
            raise PassError(f"{op.name} on a vector of rank {vt.rank} is not supported by kf-to-spirv",
                            op.location)
        with op.location, ir.InsertionPoint(op):
            lanes = []
            for i in range(vt.shape[0]):
                operands = [vector.extract(x, [], [i]) for x in op.operands]
                lanes.append(ir.Operation.create(op.name, results=[vt.element_type], operands=operands,
                                                 attributes={a: op.attributes[a] for a in op.attributes}).result)
            r = vector.from_elements(vt, lanes)
        op.results[0].replace_all_uses_with(r)
        op.erase()


#: math ops whose GLSL.std.450 instruction (or kf's expansion into such) takes 64-bit floats;
#: the transcendental ones (Exp, Log, Sin, Pow, ...) take only 16- and 32-bit floats.
_F64_MATH = ("math.absf", "math.ceil", "math.floor", "math.round", "math.roundeven", "math.trunc", "math.sqrt",
             "math.rsqrt", "math.fma", "math.copysign", "math.isnan", "math.isinf", "math.isfinite")


def _is_f64(t: ir.Type) -> bool:
    elem = ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t
    return isinstance(elem, ir.F64Type)


def refuse_f64_math(gm: ir.Operation) -> None:
    """Raise a PassError at the first math op on f64 values that SPIR-V's GLSL.std.450 has
    no 64-bit form of (exp, log, sin, pow, ...): computing it in f32 would give a float64
    result with float32's precision."""
    for op in walk_ops(gm.regions[0].blocks[0]):
        if not op.name.startswith("math.") or op.name in _F64_MATH:
            continue
        if any(_is_f64(v.type) for v in list(op.operands) + list(op.results)):
            raise PassError(f"{op.name.removeprefix('math.')} of float64 values is not supported on SPIR-V targets "
                            "(GLSL.std.450 has it for 16- and 32-bit floats only): compute it in float32",
                            op.location)


def expand_math(gm: ir.Operation) -> None:
    """Rewrite the ops of ``_EXPANDED_MATH`` into ops SPIR-V has (GLSL.std.450).

    asin, acos: Cephes asinf/acosf (``asin_acos``); erf: Taylor series below |x| = 0.5 (relative error < 1e-7), Abramowitz-Stegun 7.1.26
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

    def asin_small(u):  # asin(u) for |u| <= 0.5: Cephes asinf's odd polynomial (about 1 ulp)
        t = u.type
        z = arith.mulf(u, u)
        p = poly(z, [1.6666752422e-1, 7.4953002686e-2, 4.5470025998e-2, 2.4181311049e-2, 4.2163199048e-2])
        return arith.addf(u, arith.mulf(arith.mulf(p, z), u))

    def asin_acos(x, acos: bool):
        """Cephes asinf/acosf: past |x| = 0.5 through asin(sqrt((1 - |x|) / 2)), so the
        polynomial only meets |u| <= 0.5; NaN outside [-1, 1] (GLSL's Asin, Acos err by
        up to 4e-4 on lavapipe)."""
        t = x.type
        P = arith.CmpFPredicate
        ax = m.absf(x)
        half = c(t, 0.5)
        outer = asin_small(m.sqrt(arith.mulf(half, arith.subf(c(t, 1.0), ax))))  # |x| > 0.5
        if acos:
            pos = arith.mulf(c(t, 2.0), outer)
            r = arith.select(arith.cmpf(P.OGT, x, half), pos,
                             arith.select(arith.cmpf(P.OLT, x, arith.negf(half)), arith.subf(c(t, math.pi), pos),
                                          arith.subf(c(t, math.pi / 2), asin_small(x))))
        else:
            big = arith.subf(c(t, math.pi / 2), arith.mulf(c(t, 2.0), outer))
            r = m.copysign(arith.select(arith.cmpf(P.OGT, ax, half), big, asin_small(ax)), x)
        return arith.select(arith.cmpf(P.OGT, ax, c(t, 1.0)), c(t, math.nan), r)

    _unroll_vectors(gm)
    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in _EXPANDED_MATH:
            continue
        if op.name == "arith.remf":
            with op.location, ir.InsertionPoint(op):
                x, y = op.operands[0], op.operands[1]
                elem = ir.VectorType(x.type).element_type if isinstance(x.type, ir.VectorType) else x.type
                if isinstance(elem, ir.F32Type):
                    r = _fmod(x, y)
                elif isinstance(elem, ir.F16Type):  # exact in f32, and so exactly an f16
                    wide = ir.VectorType.get(ir.VectorType(x.type).shape, ir.F32Type.get()) \
                        if isinstance(x.type, ir.VectorType) else ir.F32Type.get()
                    r = arith.truncf(x.type, _fmod(arith.extf(wide, x), arith.extf(wide, y)))
                else:
                    raise PassError(f"fmod of {elem} is not supported by kf-to-spirv (float32 and float16 are)",
                                    op.location)
            op.results[0].replace_all_uses_with(r)
            op.erase()
            continue
        if op.name in ("math.sin", "math.cos"):
            with op.location, ir.InsertionPoint(op):
                x = op.operands[0]
                elem = ir.VectorType(x.type).element_type if isinstance(x.type, ir.VectorType) else x.type
                if isinstance(elem, ir.F32Type):
                    r = _sincos(x, op.name == "math.cos")
                else:  # f16 (bf16 is emulated in f32 before this point): computed in f32, as torch does
                    from mlir.dialects import arith
                    wide = ir.VectorType.get(ir.VectorType(x.type).shape, ir.F32Type.get()) \
                        if isinstance(x.type, ir.VectorType) else ir.F32Type.get()
                    r = arith.truncf(x.type, _sincos(arith.extf(wide, x), op.name == "math.cos"))
            op.results[0].replace_all_uses_with(r)
            op.erase()
            continue
        if isinstance(op.results[0].type, ir.ShapedType):
            raise PassError(f"{op.name} on vectors is not supported by kf-to-spirv: apply it per element", op.location)
        with op.location, ir.InsertionPoint(op):
            x = op.operands[0]
            t = x.type
            if op.name in ("math.asin", "math.acos"):
                r = asin_acos(x, op.name == "math.acos")
            elif op.name == "math.erf":
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
