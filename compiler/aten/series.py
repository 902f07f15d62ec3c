"""Building blocks of kf's special functions in float32, each a composition of elementwise
kf ops that every target computes: constants, Horner and Chebyshev (Clenshaw) evaluation,
comparisons and logical operations on their masks, floor, log1p, and the float32 operand
and result of a handler (float64 refused: the series are fitted for float32)."""

from __future__ import annotations

from kf.dialects import builders as kb

from ..errors import Unsupported
from .core import Converter

F32 = "f32"
INF = float("inf")


def const(v: float):
    return kb.scalar(float(v), F32)


def horner(u, coeffs):
    """sum coeffs[i] u^i (lowest power first)."""
    r = const(coeffs[-1])
    for a in reversed(coeffs[:-1]):
        r = kb.add(kb.mul(r, u), const(a))
    return r


def chebyshev(t, coeffs):
    """sum coeffs[i] T_i(t) for t in [-1, 1] by Clenshaw's recurrence (stable there, unlike
    the same series turned into powers of t)."""
    if len(coeffs) == 1:
        return const(coeffs[0])
    two_t = kb.add(t, t)
    b1, b2 = const(coeffs[-1]), const(0.0)
    for a in reversed(coeffs[1:-1]):
        b1, b2 = kb.add(kb.sub(kb.mul(two_t, b1), b2), const(a)), b1
    return kb.add(kb.sub(kb.mul(t, b1), b2), const(coeffs[0]))


def on_interval(x, lo: float, hi: float):
    """x mapped linearly from [lo, hi] onto [-1, 1]."""
    return kb.sub(kb.mul(x, const(2.0 / (hi - lo))), const((hi + lo) / (hi - lo)))


def lt(a, b):
    return kb.cmp(a, b, predicate="lt")


def le(a, b):
    return kb.cmp(a, b, predicate="le")


def eq(a, b):
    return kb.cmp(a, b, predicate="eq")


def isnan(a):
    return kb.cmp(a, a, predicate="ne")


def both(a, b):
    return kb.select(a, b, a)


def either(a, b):
    return kb.select(a, a, b)


def floor(x):
    t = kb.trunc(x)
    return kb.select(lt(x, t), kb.sub(t, const(1.0)), t)


def log1p(u):
    """log(1 + u) to float32's accuracy for small u too (where a target's log of a value
    near 1 may be off by its absolute error): near 0 the series 2 atanh(s) = 2 (s + s^3 / 3
    + ...), s = u / (2 + u); elsewhere log(1 + u)."""
    s = kb.div(u, kb.add(const(2.0), u))
    near = kb.mul(kb.add(s, s), horner(kb.mul(s, s), [1.0 / (2 * k + 1) for k in range(8)]))
    return kb.select(lt(kb.abs(u), const(0.41)), near, kb.log(kb.add(const(1.0), u)))


_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = hi + lo, hi with 9 bits: k hi exact


def pow2(k):
    """2^k exactly for an integer-valued k with |k| <= 127: a product of 2^(+-2^i) by k's bits."""
    neg = lt(k, const(0.0))
    m = kb.abs(k)
    r = const(1.0)
    for i in range(6, -1, -1):
        step = const(2.0 ** i)
        take = le(step, m)
        r = kb.mul(r, kb.select(take, kb.select(neg, const(2.0 ** -(2 ** i)), const(2.0 ** (2 ** i))), const(1.0)))
        m = kb.select(take, kb.sub(m, step), m)
    return r


def exp_times(x, m=None):
    """e^x (times m, without e^x overflowing or underflowing on the way): e^r 2^k with
    k = round(x / ln 2) and r = x - k ln 2 reduced exactly, so that the result's error is
    e^r's, whatever the size of x (a target's exp may be off by |x| ulp)."""
    x = kb.min(kb.max(x, const(-300.0)), const(300.0))  # e^-300 and e^300 are 0 and inf anyway
    k = kb.round(kb.mul(x, const(1 / 0.6931471805599453)))
    r = kb.sub(kb.sub(x, kb.mul(k, const(_LN2_HI))), kb.mul(k, const(_LN2_LO)))
    k1 = kb.trunc(kb.mul(k, const(0.5)))
    k1 = kb.min(kb.max(k1, const(-127.0)), const(127.0))
    k2 = kb.min(kb.max(kb.sub(k, k1), const(-127.0)), const(127.0))
    e = kb.mul(kb.exp(r), pow2(k1))
    if m is not None:
        e = kb.mul(e, m)
    return kb.mul(e, pow2(k2))


def float32_operand(c: Converter, node, x, op: str):
    """x as float32 (integer and 16-bit inputs converted) and the result's element type;
    float64 refused, as the series are float32's."""
    out = c.out_elem(node)
    if out == "f64":
        raise Unsupported(f"{op} of float64 is not supported by kf (it computes {op} to float32's accuracy)")
    return c.tensor(x, F32), out


def result(y, out: str):
    return y if out == F32 else kb.cast(y, out)
