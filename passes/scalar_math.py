"""Scalar arithmetic for kf's elementwise ops: the one place that says how each kf
elementwise op is computed, used inside linalg.generic bodies and by kf's own GPU
kernel strategies alike.

Floating-point math runs in the type of its operands; callers that compute low-precision
tensors pass values already extended to f32 (kf's precision policy: f16, bf16 and fp8
values are computed in f32 and rounded once when stored).
"""

from __future__ import annotations

import math
from typing import Sequence

from mlir import ir
from mlir.dialects import arith
from mlir.dialects import math as mmath

_CMP_F = {"eq": arith.CmpFPredicate.OEQ, "ne": arith.CmpFPredicate.UNE, "lt": arith.CmpFPredicate.OLT,
          "le": arith.CmpFPredicate.OLE, "gt": arith.CmpFPredicate.OGT, "ge": arith.CmpFPredicate.OGE}
_CMP_I = {"eq": arith.CmpIPredicate.eq, "ne": arith.CmpIPredicate.ne, "lt": arith.CmpIPredicate.slt,
          "le": arith.CmpIPredicate.sle, "gt": arith.CmpIPredicate.sgt, "ge": arith.CmpIPredicate.sge}

_CMP_U = {"eq": arith.CmpIPredicate.eq, "ne": arith.CmpIPredicate.ne, "lt": arith.CmpIPredicate.ult,
          "le": arith.CmpIPredicate.ule, "gt": arith.CmpIPredicate.ugt, "ge": arith.CmpIPredicate.uge}


def is_float(t: ir.Type) -> bool:
    return isinstance(t, (ir.F16Type, ir.BF16Type, ir.F32Type, ir.F64Type)) or str(t).startswith("f8")


def const(t: ir.Type, value: float) -> ir.Value:
    """A scalar constant of type t (float or integer)."""
    if is_float(t):
        return arith.constant(t, float(value))
    width = ir.IntegerType(t).width
    if width == 1:
        return arith.constant(t, ir.IntegerAttr.get(t, 1 if value else 0))
    value = int(value) & ((1 << width) - 1)  # as the type holds it (200 in an i8 is uint8's 200)
    return arith.constant(t, value - (1 << width) if value >> (width - 1) else value)


def variance(m2: ir.Value, n: int, correction: float) -> ir.Value:
    """A variance from the sum of squared deviations m2 of n elements: m2 / (n -
    correction), and where the correction leaves no degrees of freedom torch's m2 / 0
    (inf, NaN where m2 is 0 or NaN) written out: a division by a constant zero is what
    some Vulkan compilers fold to anything (lavapipe returned the input)."""
    dof = n - correction
    if dof > 0:
        return arith.divf(m2, const(m2.type, dof))
    positive = arith.cmpf(arith.CmpFPredicate.OGT, m2, const(m2.type, 0.0))
    return arith.select(positive, const(m2.type, math.inf), const(m2.type, math.nan))


def convert(v: ir.Value, to: ir.Type, unsigned: bool = False) -> ir.Value:
    """Convert a scalar between any two kf element types (torch's rules: float to int
    truncates toward zero, anything to i1 tests for non-zero, a wider integer to a
    narrower one keeps the low bits). ``unsigned``: v is an unsigned integer (uint8,
    which MLIR's arithmetic holds as a signless i8): it is zero-extended."""
    src = v.type
    if src == to:
        return v
    if is_float(src) and is_float(to):
        wide = lambda t: {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}.get(str(t), 8)
        if wide(src) < wide(to) or (wide(src) == wide(to) and str(to) == "f32"):
            return arith.extf(to, v)
        if wide(src) == wide(to):  # f16 <-> bf16: through f32
            return arith.truncf(to, arith.extf(ir.F32Type.get(), v))
        return arith.truncf(to, v)
    if is_float(src):
        tw = ir.IntegerType(to).width
        if tw == 1:
            return arith.cmpf(arith.CmpFPredicate.UNE, v, const(src, 0.0))
        if tw < 32:  # through i32, then the low bits: torch's -1.5 -> uint8 is 255
            return arith.trunci(to, arith.fptosi(ir.IntegerType.get_signless(32), v))
        return arith.fptosi(to, v)
    sw = ir.IntegerType(src).width
    if is_float(to):
        return arith.uitofp(to, v) if sw == 1 or unsigned else arith.sitofp(to, v)
    tw = ir.IntegerType(to).width
    if tw == 1:
        return arith.cmpi(arith.CmpIPredicate.ne, v, const(src, 0))
    if sw < tw:
        return arith.extui(to, v) if sw == 1 or unsigned else arith.extsi(to, v)
    if sw == tw:
        return v
    return arith.trunci(to, v)


# ---- erf, GELU and sigmoid for values that are rounded to a narrow float (bf16, f16, fp8)
#
# The rule: an op whose result is stored as bf16, f16 or fp8 (``stored_as``, the element
# type of its result tensor; kf computes it in f32 and rounds once when it is stored) takes
# the short forms below; every other result (f32, f64, or a caller that does not say)
# keeps the accurate ones (math.erf / math.tanh / math.exp: libdevice on CUDA).
#
# GELU (exact, erf form): x / (1 + 2^(x Q(x^2))), i.e. x * sigmoid of the logit of Phi:
# Q is a weighted minimax fit of that logit (scripts/fit_narrow_gelu.py: absolute error
# where |GELU| is large, relative error towards the negative tail), of degree 4 for
# bf16 and fp8 results and 6 for f16 (three more significand bits). Measured in f32
# emulation against float64 math.erf on every bf16 and f16 value and a dense f32 grid
# (test/python/passes/test_scalar_math.py):
#   bf16 (degree 4): absolute error <= 1.4e-5 on the whole line; <= 0.06 bf16 ulp of the
#     result for x >= -3, 0.56 for x >= -4 (torch's own f32 erf path, where 1 + erf
#     cancels: 0.03 and 0.99; the clamped erf polynomial this replaces: 0.16 and 22);
#   f16 (degree 6): absolute error <= 8.2e-7; <= 0.016 f16 ulp for x >= -3, 0.15 for
#     x >= -4 (torch: 0.27 and 7.9).
# Further left |GELU| < 1.3e-4 and only the absolute error holds. Q decreases on s >= 0,
# so the limits are exact: GELU = x for large x, -0 for large -x; NaN stays NaN.
# On sm_90 that is 10 (12 for f16) instructions: mul, 4 (6) fma, mul, ex2, add, rcp,
# mul, against 16 for the clamped erf polynomial and ~30 for libdevice erff. The ex2
# and the reciprocal are emitted as math.exp2 and arith.divf with ``fastmath<afn>``
# (kf-to-cuda makes them ex2.approx.ftz.f32 and rcp.approx.ftz.f32, a few f32 ulps;
# other targets keep their exp2 and division).
# GELU (tanh form): 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)) exactly, the same three steps.
# sigmoid: 1 / (1 + 2^(-x log2 e)) (both a few f32 ulps).
#
# erf alone: z * R(z^2) for |z| <= NARROW_ERF_CLAMP, +-1 beyond: R (degree 10 in z^2,
# eleven f32 coefficients) is a minimax fit of erf on [0, 3.3] for absolute error with
# 3.3 R(3.3^2) = 1 (scripts/fit_narrow_erf.py), error 3.1e-6 = erfc(3.3) in exact
# arithmetic; evaluated in f32 (Horner with fma) its absolute error is <= 2e-5. (A
# sigmoid form would lose erf's relative accuracy near 0.)
NARROW_ERF_CLAMP = 3.299999952316284  # f32(3.3)
NARROW_ERF_COEFFS = (1.128363847732544, -0.37597909569740295, 0.11244583129882812, -0.026384387165308,
                     0.0048906151205301285, -0.0007101717637851834, 7.843021739972755e-05,
                     -6.2813546719553415e-06, 3.400955108645576e-07, -1.1041480618700916e-08,
                     1.6137417790940134e-10)
#: Q for GELU stored as bf16/fp8 (degree 4) and as f16 (degree 6), f32 values
NARROW_GELU_COEFFS = (-2.3016536235809326, -0.10579812526702881, 0.0005742133944295347, 6.050080992281437e-05,
                      -2.1133266727701994e-06)
NARROW_GELU_F16_COEFFS = (-2.3021812438964844, -0.1048903614282608, 0.00012458210403565317,
                          0.0001526888954686001, -1.0733431736298371e-05, 3.4987874641956296e-07,
                          -4.584808976915156e-09)
_LOG2E = math.log2(math.e)
# tanh form: -2 log2(e) sqrt(2/pi) (x + 0.044715 x^3) = x (a + b x^2)
NARROW_GELU_TANH_COEFFS = (-2.0 * _LOG2E * math.sqrt(2.0 / math.pi), -2.0 * _LOG2E * math.sqrt(2.0 / math.pi) * 0.044715)


def narrow(t: ir.Type | str | None) -> bool:
    """Whether values stored as element type t take the short forms (bf16, f16, fp8)."""
    return t is not None and (str(t) in ("bf16", "f16") or str(t).startswith("f8"))


def _clamp(x: ir.Value, lo: float, hi: float) -> ir.Value:
    # maximumf/minimumf propagate NaN (one max.NaN/min.NaN on sm_80+).
    return arith.minimumf(arith.maximumf(x, const(x.type, lo)), const(x.type, hi))


def _poly(s: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    """coeffs[0] + s * (coeffs[1] + ...), Horner with fma."""
    p = const(s.type, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = mmath.fma(p, s, const(s.type, c))
    return p


def _odd_poly(x: ir.Value, clamp: float, coeffs: Sequence[float], bias: float) -> ir.Value:
    """bias + xc * P(xc^2), xc = x clamped to [-clamp, clamp], by Horner with fma."""
    t = x.type
    xc = _clamp(x, -clamp, clamp)
    return mmath.fma(xc, _poly(arith.mulf(xc, xc), coeffs), const(t, bias))


def _erf_narrow(x: ir.Value) -> ir.Value:
    return _clamp(_odd_poly(x, NARROW_ERF_CLAMP, NARROW_ERF_COEFFS, 0.0), -1.0, 1.0)


AFN = "#arith.fastmath<afn>"


def _over_one_plus_exp2(num: ir.Value, y: ir.Value) -> ir.Value:
    """num / (1 + 2^y), the exp2 and the division approximate (``fastmath<afn>``): 2^y
    overflows to inf for large y (the result is then +-0) and is 0 for very negative y."""
    t = y.type
    afn = ir.Attribute.parse(AFN)
    return arith.divf(num, arith.addf(mmath.exp2(y, fastmath=afn), const(t, 1.0)), fastmath=afn)


def _gelu_coeffs(approximate: str, stored_as) -> tuple:
    if approximate == "tanh":
        return NARROW_GELU_TANH_COEFFS
    return NARROW_GELU_F16_COEFFS if str(stored_as) == "f16" else NARROW_GELU_COEFFS


def _gelu_narrow(x: ir.Value, approximate: str, stored_as) -> ir.Value:
    q = _gelu_coeffs(approximate, stored_as)
    return _over_one_plus_exp2(x, arith.mulf(x, _poly(arith.mulf(x, x), q)))


def _sigmoid_narrow(x: ir.Value) -> ir.Value:
    return _over_one_plus_exp2(const(x.type, 1.0), arith.mulf(x, const(x.type, -_LOG2E)))


# NumPy mirrors of the emitted short forms (float32 in and out; fma rounds once, ex2 and
# the division are exact here, a few f32 ulps on the GPU), for tests.

def _f32_poly_np(s, coeffs):
    import numpy as np
    f32, f64 = np.float32, np.float64  # an f32 product is exact in f64: fma rounds once (twice, rarely)
    p = np.full_like(s, f32(coeffs[-1]))
    for c in reversed(coeffs[:-1]):
        p = (p.astype(f64) * s.astype(f64) + f64(f32(c))).astype(f32)
    return p


def _over_one_plus_exp2_np(num, y):
    import numpy as np
    f32 = np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        d = (np.exp2(y.astype(np.float64)).astype(f32) + f32(1)).astype(f32)
        return (num.astype(np.float64) / d.astype(np.float64)).astype(f32)


def erf_narrow_reference(x):
    import numpy as np
    f32, f64 = np.float32, np.float64
    xc = np.clip(np.asarray(x, f32), f32(-NARROW_ERF_CLAMP), f32(NARROW_ERF_CLAMP)).astype(f32)
    p = _f32_poly_np((xc * xc).astype(f32), NARROW_ERF_COEFFS)
    return np.clip((xc.astype(f64) * p.astype(f64)).astype(f32), -1.0, 1.0).astype(f32)


def gelu_narrow_reference(x, approximate: str = "none", stored_as: str = "bf16"):
    import numpy as np
    f32 = np.float32
    x = np.asarray(x, f32)
    q = _gelu_coeffs(approximate, stored_as)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (x * _f32_poly_np((x * x).astype(f32), q)).astype(f32)
        # x / d: the reciprocal then the product on CUDA (kf-to-cuda); one rounding here
        return _over_one_plus_exp2_np(x, y)


def sigmoid_narrow_reference(x):
    import numpy as np
    f32 = np.float32
    x = np.asarray(x, f32)
    return _over_one_plus_exp2_np(np.ones_like(x), (x * f32(-_LOG2E)).astype(f32))


def _gelu(x: ir.Value, approximate: str, stored_as=None) -> ir.Value:
    t = x.type
    if narrow(stored_as) and str(t) == "f32":
        return _gelu_narrow(x, approximate, stored_as)
    half = const(t, 0.5)
    one = const(t, 1.0)
    if approximate == "tanh":
        inner = arith.mulf(const(t, math.sqrt(2.0 / math.pi)),
                           arith.addf(x, arith.mulf(const(t, 0.044715), arith.mulf(x, arith.mulf(x, x)))))
        return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.tanh(inner)))
    return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.erf(arith.mulf(x, const(t, 1 / math.sqrt(2.0))))))


def emit(name: str, args: Sequence[ir.Value], attrs: dict | None = None, *,
         stored_as: ir.Type | str | None = None, short_forms: bool = True) -> ir.Value:
    """The scalar result of kf elementwise op ``name`` (``kf.add`` or ``add``) on args.

    Operands of binary ops must already have one type; ``cmp`` returns i1.

    ``stored_as`` is the element type of the op's result tensor (callers that know it
    pass it). Results stored as bf16/f16 (or fp8) and computed in f32 take the short
    forms above: ``kf.gelu`` (both forms) is x / (1 + 2^(x Q(x^2))) (exact GELU: Q a
    degree-4 fit for bf16/fp8, absolute error <= 1.4e-5 and <= 0.06 bf16 ulp for
    x >= -3, degree 6 for f16, 8.2e-7 and 0.016 f16 ulp; tanh GELU: the identity
    0.5 (1 + tanh u) = 1 / (1 + e^(-2u))), ``kf.sigmoid`` is 1 / (1 + 2^(-x
    log2 e)), both with an approximate exp2 and division (``fastmath<afn>``: ex2.approx
    and rcp.approx on CUDA); ``kf.erf`` is a clamped odd polynomial of degree 21
    (absolute error <= 2e-5). Anything else (f32 and f64 results, or no ``stored_as``)
    keeps math.erf / math.tanh / math.exp and exact division. ``short_forms=False`` (the
    elementwise strategy's variant of that name) gives every result the accurate forms.
    """
    attrs = attrs or {}
    if not short_forms:
        stored_as = None
    op = name.removeprefix("kf.")
    x = args[0]
    t = x.type
    f = is_float(t)
    if op == "fmod":
        if not f:
            return integer_division("rem", x, args[1])
        # LLVM's frem is C's fmod on the cpu target, convert-gpu-to-nvvm makes it
        # libdevice's __nv_fmodf; kf-to-spirv expands it exactly (spirv/expand_math.py)
        return arith.remf(x, args[1])
    if op in ("add", "sub", "mul", "div", "max", "min", "pow"):
        y = args[1]
        if f:
            return {"add": arith.addf, "sub": arith.subf, "mul": arith.mulf, "div": arith.divf,
                    "max": arith.maximumf, "min": arith.minimumf, "pow": mmath.powf}[op](x, y)
        if op == "div":
            if ir.IntegerType(t).width == 1:
                raise ValueError("kf.div is not defined on booleans")
            return integer_division("div", x, y)
        if ir.IntegerType(t).width == 1:
            # torch on bools: + and max are "or", * and min are "and"; - is an error.
            if op in ("add", "max"):
                return arith.ori(x, y)
            if op in ("mul", "min"):
                return arith.andi(x, y)
            raise ValueError(f"kf.{op} is not defined on booleans")
        if op == "pow":
            return integer_power(x, y)
        return {"add": arith.addi, "sub": arith.subi, "mul": arith.muli, "max": arith.maxsi,
                "min": arith.minsi}[op](x, y)
    if not f and op in ("neg", "abs", "relu") and ir.IntegerType(t).width == 1:
        if op == "neg":
            raise ValueError("kf.neg is not defined on booleans")
        return x  # |b| and relu(b) are b
    if op == "neg":
        return arith.negf(x) if f else arith.subi(const(t, 0), x)
    if op == "abs":
        return mmath.absf(x) if f else mmath.absi(x)
    if op == "relu":
        return arith.maximumf(x, const(t, 0.0)) if f else arith.maxsi(x, const(t, 0))
    if op == "exp":
        return mmath.exp(x)
    if op == "log":
        return mmath.log(x)
    if op == "sqrt":
        return mmath.sqrt(x)
    if op == "rsqrt":
        return mmath.rsqrt(x)
    if op == "reciprocal":
        return arith.divf(const(t, 1.0), x)
    if op == "tanh":
        return mmath.tanh(x)
    if op == "erf":
        if narrow(stored_as) and str(t) == "f32":
            return _erf_narrow(x)
        return mmath.erf(x)
    if op == "sin":
        return mmath.sin(x)
    if op == "cos":
        return mmath.cos(x)
    if op == "erfc":
        return mmath.erfc(x)
    if op == "trunc":
        # floor and ceil lower on every target (NVVM has no pattern for math.trunc);
        # ceil(-0.5) is -0.0, as trunc(-0.5)
        neg = arith.cmpf(arith.CmpFPredicate.OLT, x, const(t, 0.0))
        return arith.select(neg, mmath.ceil(x), mmath.floor(x))
    if op == "round":
        return mmath.roundeven(x)
    if op == "signbit":
        bits = ir.IntegerType.get_signless({"f64": 64, "f32": 32}.get(str(t), 16))
        return arith.cmpi(arith.CmpIPredicate.slt, arith.bitcast(bits, x), const(bits, 0))
    if op == "sigmoid":
        if narrow(stored_as) and str(t) == "f32":
            return _sigmoid_narrow(x)
        return arith.divf(const(t, 1.0), arith.addf(const(t, 1.0), mmath.exp(arith.negf(x))))
    if op == "gelu":
        return _gelu(x, attrs.get("approximate", "none"), stored_as)
    if op == "cmp":
        pred = attrs["predicate"]
        if f:
            return arith.cmpf(_CMP_F[pred], x, args[1])
        # Booleans order false < true, which is unsigned: signed i1 has true = -1.
        p = _CMP_I[pred] if ir.IntegerType(t).width > 1 else _CMP_U[pred]
        return arith.cmpi(p, x, args[1])
    if op == "bitwise":
        if f:
            raise ValueError("kf.bitwise needs integer operands")
        return bitwise(attrs["kind"], x, args[1])
    if op == "select":
        return arith.select(args[0], args[1], args[2])
    if op == "masked_fill":
        return arith.select(args[1], const(t, attrs["value"]), x)
    raise ValueError(f"kf.{op} is not an elementwise op")


def integer_power(x: ir.Value, y: ir.Value) -> ir.Value:
    """x ** y of integers (math.ipowi, wrapping), with torch's rule for a negative y: 0,
    but 1 where x is 1 and -1 where x is -1 and y odd. ipowi itself is given y >= 0 only:
    its expansion divides 1 by x for a negative y, which traps on the CPU where x is 0."""
    t = x.type
    negative = arith.cmpi(arith.CmpIPredicate.slt, y, const(t, 0))
    power = mmath.ipowi(x, arith.select(negative, const(t, 0), y))
    odd = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(y, const(t, 1)), const(t, 0))
    one, minus_one = (arith.cmpi(arith.CmpIPredicate.eq, x, const(t, v)) for v in (1, -1))
    tiny = arith.select(one, const(t, 1), arith.select(arith.andi(minus_one, odd), const(t, -1),
                                                       arith.select(minus_one, const(t, 1), const(t, 0))))
    return arith.select(negative, tiny, power)


def bitwise(kind: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """x and, or, xor y, or x shifted left ("shl") or right ("shr", arithmetic) by y bits,
    of integers. A shift by a negative amount or by the type's width or more is torch's
    (c10's lshift and rshift): 0 to the left, the sign's bits to the right, where LLVM,
    PTX and SPIR-V leave it undefined."""
    if kind in ("and", "or", "xor"):
        return {"and": arith.andi, "or": arith.ori, "xor": arith.xori}[kind](x, y)
    t = x.type
    width = ir.IntegerType(t).width
    out_of_range = arith.ori(arith.cmpi(arith.CmpIPredicate.slt, y, const(t, 0)),
                             arith.cmpi(arith.CmpIPredicate.sge, y, const(t, width)))
    safe = arith.select(out_of_range, const(t, 0), y)
    if kind == "shl":
        return arith.select(out_of_range, const(t, 0), arith.shli(x, safe))
    return arith.shrsi(x, arith.select(out_of_range, const(t, width - 1), safe))


def integer_division(kind: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """x / y toward zero (``kind`` "div") or its remainder, with the sign of x ("rem"), of
    signed integers, never trapping: a divisor of 0 or -1 divides by 1 (a CPU traps on a
    division by 0 and on INT_MIN / -1; CUDA and SPIR-V leave both undefined). A quotient
    by -1 is then -x, wrapping as torch's INT_MIN // -1 does, a remainder by -1 is 0; by
    0 the quotient is x and the remainder 0 (torch raises ZeroDivisionError on the CPU
    and leaves the value undefined on CUDA)."""
    if ir.IntegerType(x.type).width == 1:
        raise ValueError(f"integer {'division' if kind == 'div' else 'remainder'} is not defined on booleans")
    t = x.type
    zero = const(t, 0)
    minus_one = arith.cmpi(arith.CmpIPredicate.eq, y, const(t, -1))
    bad = arith.ori(arith.cmpi(arith.CmpIPredicate.eq, y, zero), minus_one)
    safe = arith.select(bad, const(t, 1), y)
    if kind == "div":
        return arith.select(minus_one, arith.subi(zero, x), arith.divsi(x, safe))
    return arith.select(minus_one, zero, arith.remsi(x, safe))


def scan_identity(kind: str, t: ir.Type) -> ir.Value:
    """What a kf.scan of kind starts from in type t (0, 1, the lowest or highest value, -inf)."""
    if kind in ("sum", "prod"):
        return const(t, 0 if kind == "sum" else 1)
    if is_float(t):
        return const(t, math.inf if kind == "min" else -math.inf)
    w = ir.IntegerType(t).width
    return const(t, 2 ** (w - 1) - 1 if kind == "min" else -(2 ** (w - 1)))


def scan_step(kind: str, acc: ir.Value, v: ir.Value) -> ir.Value:
    """acc combined with the next element v by a kf.scan of kind (both of one type). A
    logsumexp step is max + log(1 + exp(min - max)), and the max itself where it is
    infinite (both -inf, or +inf), as torch.logcumsumexp gives."""
    if kind in ("sum", "prod", "max", "min"):
        return emit({"sum": "add", "prod": "mul"}.get(kind, kind), [acc, v])
    hi, lo = emit("max", [acc, v]), emit("min", [acc, v])
    r = arith.addf(hi, emit("log", [arith.addf(const(hi.type, 1.0), emit("exp", [arith.subf(lo, hi)]))]))
    infinite = arith.cmpf(arith.CmpFPredicate.OEQ, emit("abs", [hi]), const(hi.type, math.inf))
    return arith.select(infinite, hi, r)


def scatter_step(reduce: str, acc: ir.Value, v: ir.Value) -> ir.Value:
    """acc combined with a source element v landing on it by a kf.scatter_reduce of reduce
    (mean sums: the count divides at the end, ``scatter_mean``)."""
    return v if reduce == "none" else emit({"sum": "add", "mean": "add", "prod": "mul", "amax": "max",
                                             "amin": "min"}[reduce], [acc, v])


def scatter_mean(total: ir.Value, count: ir.Value) -> ir.Value:
    """A scatter mean: total / count (i64) where count > 0 (the input's element where no
    index lands); integers divide with floor, as torch."""
    i64 = count.type
    hit = arith.cmpi(arith.CmpIPredicate.sgt, count, const(i64, 0))
    safe = arith.select(hit, count, const(i64, 1))
    if is_float(total.type):
        mean = arith.divf(total, arith.sitofp(total.type, safe))
    else:
        mean = arith.floordivsi(total, convert(safe, total.type))
    return arith.select(hit, mean, total)
