"""Handlers of the ops that read a float32's binary exponent: frexp and nextafter, made of
elementwise kf ops (kf has no bit casts): the exponent from log, corrected against exact
powers of two, so every target computes them exactly (where it keeps subnormal numbers)."""

from __future__ import annotations

import math

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import Converter, handles
from .series import F32, INF, const, eq, floor, isnan, le, lt, pow2, result

_LEAST = 2.0 ** -149  # the least positive (subnormal) float32
_LARGEST = 3.4028234663852886e38


def exponent(a):
    """(e, f) with a = f 2^e, 1 <= f < 2, for a finite a > 0 (subnormal too): floor(log2 a),
    off by at most one where log rounds, corrected by comparing with the exact power; values
    below 2^-100 scaled by 2^64 first (a target may flush subnormal operands of log)."""
    tiny = lt(a, const(2.0 ** -100))
    a = kb.mul(a, kb.select(tiny, const(2.0 ** 64), const(1.0)))
    e = floor(kb.mul(kb.log(a), const(1 / math.log(2))))
    e = kb.min(kb.max(e, const(-126.0)), const(127.0))
    p = pow2(e)
    over = lt(a, p)
    e = kb.select(over, kb.sub(e, const(1.0)), e)
    p = kb.select(over, kb.mul(p, const(0.5)), p)
    under = le(kb.add(p, p), a)
    e = kb.select(under, kb.add(e, const(1.0)), e)
    f = kb.mul(kb.div(a, pow2(kb.min(e, const(0.0)))), pow2(kb.neg(kb.max(e, const(0.0)))))
    return kb.select(tiny, kb.sub(e, const(64.0)), e), f


def frexp(x):
    """(m, e) with x = m 2^e, 0.5 <= |m| < 1; (x, 0) at 0, +-inf and NaN."""
    a = kb.abs(x)
    regular = kb.select(lt(const(0.0), a), lt(a, const(INF)), lt(const(0.0), a))
    e, f = exponent(kb.select(regular, a, const(1.0)))
    m = kb.mul(f, const(0.5))
    m = kb.select(kb.signbit(x), kb.neg(m), m)
    return kb.select(regular, m, x), kb.cast(kb.select(regular, kb.add(e, const(1.0)), const(0.0)), "i32")


def nextafter(x, y):
    """The float32 next to x toward y: y where x == y, NaN where either is NaN."""
    a = kb.abs(x)
    e, f = exponent(kb.min(kb.max(a, const(_LEAST)), const(_LARGEST)))
    e = kb.max(e, const(-126.0))  # subnormals step by the least one
    ulp = kb.mul(pow2(e), const(2.0 ** -23))
    # toward 0 from a power of two (not a subnormal) the step is half as large
    half = kb.select(eq(f, const(1.0)), lt(const(2.0 ** -126), a), eq(f, const(1.0)))
    up = lt(x, y)
    away = eq(kb.cast(up, F32), kb.cast(lt(const(0.0), x), F32))
    step = kb.select(away, ulp, kb.select(half, kb.mul(ulp, const(0.5)), ulp))
    r = kb.add(x, kb.select(up, step, kb.neg(step)))
    r = kb.select(eq(a, const(INF)), kb.select(kb.signbit(x), const(-_LARGEST), const(_LARGEST)), r)
    r = kb.select(eq(x, const(0.0)), kb.select(up, const(_LEAST), const(-_LEAST)), r)
    r = kb.select(eq(x, y), y, r)
    return kb.select(kb.select(isnan(x), isnan(x), isnan(y)), kb.add(x, y), r)


@handles("aten.frexp.Tensor")
def _frexp(c: Converter, node, args, kwargs):
    elem = spec_of(args[0].type).elem
    if elem == "f64":
        raise Unsupported("frexp of float64 is not supported by kf (it reads float32's exponent)")
    m, e = frexp(c.tensor(args[0], F32))
    return result(m, elem), e


@handles("aten.nextafter.default")
def _nextafter(c: Converter, node, args, kwargs):
    elem = c.out_elem(node)
    if elem != F32:
        raise Unsupported(f"nextafter of {elem} is not supported by kf (it steps by float32's spacing)")
    return nextafter(c.tensor(args[0], F32), c.tensor(args[1], F32))
