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
    if ir.IntegerType(t).width == 1:
        return arith.constant(t, ir.IntegerAttr.get(t, 1 if value else 0))
    return arith.constant(t, int(value))


def convert(v: ir.Value, to: ir.Type) -> ir.Value:
    """Convert a scalar between any two kf element types (torch's rules: float to int
    truncates toward zero, anything to i1 tests for non-zero)."""
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
        if ir.IntegerType(to).width == 1:
            return arith.cmpf(arith.CmpFPredicate.UNE, v, const(src, 0.0))
        return arith.fptosi(to, v)
    sw = ir.IntegerType(src).width
    if is_float(to):
        return arith.uitofp(to, v) if sw == 1 else arith.sitofp(to, v)
    tw = ir.IntegerType(to).width
    if tw == 1:
        return arith.cmpi(arith.CmpIPredicate.ne, v, const(src, 0))
    if sw < tw:
        return arith.extui(to, v) if sw == 1 else arith.extsi(to, v)
    return arith.trunci(to, v)


# ---- erf for values that are rounded to a narrow float (bf16, f16, fp8) when stored
#
# erf(z) = z * R(z^2) for |z| <= NARROW_ERF_CLAMP, +-1 beyond: R (degree 10 in z^2,
# eleven f32 coefficients) is a minimax fit of erf on [0, 3.3] for absolute error with
# 3.3 R(3.3^2) = 1 (scripts/fit_narrow_erf.py), error 3.1e-6 = erfc(3.3) in exact
# arithmetic; evaluated in f32 (Horner with fma) erf's absolute error is <= 2e-5 and
# GELU's <= 4e-5 (checked on every bf16 and a dense f32 grid against float64 math.erf in
# test/python/passes/test_scalar_math.py); a bf16 rounding of GELU(1) is up to 2e-3.
# The clamps make the limits exact: erf = +-1, GELU(x) = x and 0 past |x| = 4.67.
# GELU is 17 PTX instructions (12 fma, 3 min, abs, mul; abs is a free operand modifier)
# against 31 for libdevice erff's two intervals (a select per coefficient, ex2, a branch).
NARROW_ERF_CLAMP = 3.299999952316284  # f32(3.3)
NARROW_ERF_COEFFS = (1.128363847732544, -0.37597909569740295, 0.11244583129882812, -0.026384387165308,
                     0.0048906151205301285, -0.0007101717637851834, 7.843021739972755e-05,
                     -6.2813546719553415e-06, 3.400955108645576e-07, -1.1041480618700916e-08,
                     1.6137417790940134e-10)
# GELU(x) = x * Phi(x), Phi(x) = 1/2 + x * Q(x^2) with Q(s) = R(s / 2) / (2 sqrt 2).
NARROW_GELU_CLAMP = NARROW_ERF_CLAMP * math.sqrt(2.0)
NARROW_GELU_COEFFS = tuple(r / 2.0 ** k / (2.0 * math.sqrt(2.0)) for k, r in enumerate(NARROW_ERF_COEFFS))


def narrow(t: ir.Type | str | None) -> bool:
    """Whether values stored as element type t may take the short erf (bf16, f16, fp8)."""
    return t is not None and (str(t) in ("bf16", "f16") or str(t).startswith("f8"))


def _clamp(x: ir.Value, lo: float, hi: float) -> ir.Value:
    # maximumf/minimumf propagate NaN (one max.NaN/min.NaN on sm_80+).
    return arith.minimumf(arith.maximumf(x, const(x.type, lo)), const(x.type, hi))


def _odd_poly(x: ir.Value, clamp: float, coeffs: Sequence[float], bias: float, nonneg: bool = False) -> ir.Value:
    """bias + xc * P(xc^2), xc = x clamped to [-clamp, clamp] (x >= 0 where nonneg), by
    Horner with fma."""
    t = x.type
    xc = arith.minimumf(x, const(t, clamp)) if nonneg else _clamp(x, -clamp, clamp)
    s = arith.mulf(xc, xc)
    p = const(t, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = mmath.fma(p, s, const(t, c))
    return mmath.fma(xc, p, const(t, bias))


def _erf_narrow(x: ir.Value) -> ir.Value:
    return _clamp(_odd_poly(x, NARROW_ERF_CLAMP, NARROW_ERF_COEFFS, 0.0), -1.0, 1.0)


def erf_narrow_reference(x):
    """NumPy mirror of the emitted short erf (float32 in and out), for tests."""
    import numpy as np
    return np.clip(_odd_poly_np(x, NARROW_ERF_CLAMP, NARROW_ERF_COEFFS, 0.0), -1.0, 1.0).astype(np.float32)


def gelu_narrow_reference(x):
    """NumPy mirror of the emitted short GELU (float32 in and out), for tests."""
    import numpy as np
    x = np.asarray(x, np.float32)
    a = np.abs(x)
    p = np.minimum(_odd_poly_np(a, NARROW_GELU_CLAMP, NARROW_GELU_COEFFS, 0.5), np.float32(1.0))
    return (a.astype(np.float64) * p + np.minimum(x, 0).astype(np.float64)).astype(np.float32)


def _odd_poly_np(x, clamp, coeffs, bias):
    import numpy as np
    f32, f64 = np.float32, np.float64  # an f32 product is exact in f64: fma rounds once (twice, rarely)
    x = np.asarray(x, f32)
    xc = np.clip(x, f32(-clamp), f32(clamp)).astype(f32)
    s = (xc * xc).astype(f32)
    p = np.full_like(s, f32(coeffs[-1]))
    for c in reversed(coeffs[:-1]):
        p = (p.astype(f64) * s.astype(f64) + f64(f32(c))).astype(f32)
    return (xc.astype(f64) * p.astype(f64) + f64(f32(bias))).astype(f32)


def _gelu(x: ir.Value, approximate: str, stored_as=None) -> ir.Value:
    t = x.type
    half = const(t, 0.5)
    one = const(t, 1.0)
    if approximate == "tanh":
        inner = arith.mulf(const(t, math.sqrt(2.0 / math.pi)),
                           arith.addf(x, arith.mulf(const(t, 0.044715), arith.mulf(x, arith.mulf(x, x)))))
        return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.tanh(inner)))
    if narrow(stored_as) and str(t) == "f32":
        # p = Phi(|x|) in [1/2, 1]; GELU(x) = x p for x >= 0 and x (1 - p) = |x| p + x
        # below: one fma, exactly 0 where p is 1 (x <= -4.67).
        a = mmath.absf(x)
        p = arith.minimumf(_odd_poly(a, NARROW_GELU_CLAMP, NARROW_GELU_COEFFS, 0.5, True), one)
        return mmath.fma(a, p, arith.minimumf(x, const(t, 0.0)))
    return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.erf(arith.mulf(x, const(t, 1 / math.sqrt(2.0))))))


def emit(name: str, args: Sequence[ir.Value], attrs: dict | None = None, *,
         stored_as: ir.Type | str | None = None) -> ir.Value:
    """The scalar result of kf elementwise op ``name`` (``kf.add`` or ``add``) on args.

    Operands of binary ops must already have one type; ``cmp`` returns i1.

    ``stored_as`` is the element type of the op's result tensor (callers that know it
    pass it). erf for values stored as bf16/f16 (or fp8) uses the short approximation
    above (``NARROW_ERF_*``: a clamped odd minimax polynomial of degree 21, Horner in
    z^2 with fma, exactly +-1 beyond |z| = 3.3), max error 2e-5 absolute for erf and
    4e-5 for GELU (f32 evaluation included), fifty times below a bf16 rounding of
    GELU(1); for ``kf.erf`` and exact ``kf.gelu`` computed in f32 only. Anything else (f32 and f64
    results, or no ``stored_as``) keeps ``math.erf`` (libdevice erff on CUDA).
    """
    attrs = attrs or {}
    op = name.removeprefix("kf.")
    x = args[0]
    t = x.type
    f = is_float(t)
    if op in ("add", "sub", "mul", "div", "max", "min", "pow"):
        y = args[1]
        if f:
            return {"add": arith.addf, "sub": arith.subf, "mul": arith.mulf, "div": arith.divf,
                    "max": arith.maximumf, "min": arith.minimumf, "pow": mmath.powf}[op](x, y)
        if op == "div":
            raise ValueError("kf.div needs floating-point operands")
        if ir.IntegerType(t).width == 1:
            # torch on bools: + and max are "or", * and min are "and"; - is an error.
            if op in ("add", "max"):
                return arith.ori(x, y)
            if op in ("mul", "min"):
                return arith.andi(x, y)
            raise ValueError(f"kf.{op} is not defined on booleans")
        if op == "pow":
            return mmath.ipowi(x, y)
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
    if op == "sigmoid":
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
    if op == "select":
        return arith.select(args[0], args[1], args[2])
    if op == "masked_fill":
        return arith.select(args[1], const(t, attrs["value"]), x)
    raise ValueError(f"kf.{op} is not an elementwise op")
