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


def _gelu(x: ir.Value, approximate: str) -> ir.Value:
    t = x.type
    half = const(t, 0.5)
    one = const(t, 1.0)
    if approximate == "tanh":
        inner = arith.mulf(const(t, math.sqrt(2.0 / math.pi)),
                           arith.addf(x, arith.mulf(const(t, 0.044715), arith.mulf(x, arith.mulf(x, x)))))
        return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.tanh(inner)))
    return arith.mulf(arith.mulf(half, x), arith.addf(one, mmath.erf(arith.mulf(x, const(t, 1 / math.sqrt(2.0))))))


def emit(name: str, args: Sequence[ir.Value], attrs: dict | None = None) -> ir.Value:
    """The scalar result of kf elementwise op ``name`` (``kf.add`` or ``add``) on args.

    Operands of binary ops must already have one type; ``cmp`` returns i1.
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
        return mmath.erf(x)
    if op == "sigmoid":
        return arith.divf(const(t, 1.0), arith.addf(const(t, 1.0), mmath.exp(arith.negf(x))))
    if op == "gelu":
        return _gelu(x, attrs.get("approximate", "none"))
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
