"""Handlers of the error function's relatives: erfinv, special.ndtri (the normal quantile),
special.log_ndtr and special.erfcx, made of elementwise kf ops in float32 so that every
target computes them.

The Chebyshev series are interpolants of mpmath's values made by scripts/fit_special.py
(named there as here). erfinv takes the variable w = -log(1 - y^2) (Giles, "Approximating
the erfinv function", GPU Computing Gems, 2010): erfinv(y) / y is smooth in w near 0, and
erfinv(y) / sqrt(w) in sqrt(w) in the tail."""

from __future__ import annotations

import math

from kf.dialects import builders as kb

from .core import Converter, handles
from .series import (INF, chebyshev, const, either, eq, exp_times, float32_operand, isnan, log1p, lt,
                     on_interval, result)

# w = -log(1 - y^2) on [0, 5]: erfinv(y) / y
_ERFINV_CENTRAL = (1.4912989139556885, 0.6017562747001648, -0.009170559234917164, -0.004962635226547718,
                   0.0009153796709142625, -3.8895627767487895e-06, -2.4202599888667464e-05,
                   3.2665716389601585e-06, 2.77588895869485e-07, -1.302336301023388e-07, 8.104643178796778e-09)
# s = sqrt(w) on [sqrt(5), 10.5]: erfinv(y) / s (10.5: the normal quantile of the least float32)
_ERFINV_TAIL = (0.9691962599754333, 0.02834821306169033, -0.010095641016960144, 0.0030331809539347887,
                -0.0007326710037887096, 9.999519534176216e-05, 2.934817166533321e-05, -3.391672726138495e-05,
                1.9436958609730937e-05, -8.657073522044811e-06, 3.145178880004096e-06, -8.472604804410366e-07,
                6.917316852650401e-08, 1.097673703043256e-07, -1.0063702404750074e-07, 5.756463750117291e-08,
                -2.4877079951579617e-08, 7.62822605082647e-09)
_W_SWITCH, _S_HI = 5.0, 10.5
# x = 4 (1 + t) / (1 - t), t = (x - 4) / (x + 4) for x >= 0: (1 + x) erfcx(x)
_ERFCX = (0.7377924919128418, -0.21817362308502197, 0.04950372129678726, -0.002572698285803199,
          -0.004193339496850967, 0.002573288045823574, -0.0009545378852635622, 0.0002604757610242814,
          -5.314211011864245e-05, 7.433019163727295e-06, -4.310600161261391e-07, -8.666784623301282e-08,
          2.444129876266743e-08)
_SQRT2 = math.sqrt(2.0)


def _erfinv_magnitude(a, z):
    """erfinv(a) for 0 <= a <= 1, given z = 1 - a exactly (so that the tail keeps its
    accuracy where a rounds to 1)."""
    w = kb.neg(kb.log(kb.mul(z, kb.add(const(1.0), a))))
    central = kb.mul(a, chebyshev(on_interval(kb.min(w, const(_W_SWITCH)), 0.0, _W_SWITCH), _ERFINV_CENTRAL))
    s = kb.sqrt(kb.min(kb.max(w, const(_W_SWITCH)), const(_S_HI * _S_HI)))
    tail = kb.mul(s, chebyshev(on_interval(s, math.sqrt(_W_SWITCH), _S_HI), _ERFINV_TAIL))
    r = kb.select(lt(w, const(_W_SWITCH)), central, tail)
    return kb.select(eq(z, const(0.0)), const(INF), r)


def erfinv(y):
    """erfinv(y): +-inf at +-1, NaN past them."""
    a = kb.abs(y)
    r = _erfinv_magnitude(a, kb.sub(const(1.0), a))
    r = kb.select(kb.signbit(y), kb.neg(r), r)
    return kb.select(either(lt(const(1.0), a), isnan(y)), const(float("nan")), r)


def ndtri(p):
    """The normal quantile sqrt 2 erfinv(2p - 1): below 1/2 from z = 2p (exact, so that tiny
    p keep their accuracy), above from z = 2 (1 - p); -inf at 0, inf at 1, NaN outside."""
    low = lt(p, const(0.5))
    z = kb.select(low, kb.add(p, p), kb.mul(kb.sub(const(1.0), p), const(2.0)))
    r = kb.mul(const(_SQRT2), _erfinv_magnitude(kb.sub(const(1.0), z), z))
    r = kb.select(low, kb.neg(r), r)
    outside = either(either(lt(p, const(0.0)), lt(const(1.0), p)), isnan(p))
    return kb.select(outside, const(float("nan")), r)


def _square(x):
    """x^2 = hi + lo exactly (Dekker's product)."""
    hi = kb.mul(x, x)
    c = kb.mul(x, const(4097.0))
    xh = kb.sub(c, kb.sub(c, x))
    xl = kb.sub(x, xh)
    lo = kb.add(kb.add(kb.sub(kb.mul(xh, xh), hi), kb.mul(kb.add(xh, xh), xl)), kb.mul(xl, xl))
    return hi, lo


def _erfcx_positive(a):
    """erfcx(a) for a >= 0: a series in (a - 4) / (a + 4), 1 / (a sqrt pi) past 1e6."""
    am = kb.min(a, const(1e6))
    fit = kb.div(chebyshev(kb.div(kb.sub(am, const(4.0)), kb.add(am, const(4.0))), _ERFCX), kb.add(const(1.0), am))
    return kb.select(lt(const(1e6), a), kb.div(const(1 / math.sqrt(math.pi)), a), fit)


def erfcx(x):
    """e^(x^2) erfc(x): 2 e^(x^2) - erfcx(-x) below 0 (inf from -9.4 on), with x^2 taken
    exactly: e^(x^2) = e^hi (1 + lo)."""
    pos = _erfcx_positive(kb.abs(x))
    hi, lo = _square(x)
    neg = kb.sub(exp_times(kb.min(hi, const(100.0)), kb.add(const(2.0), kb.add(lo, lo))), pos)
    r = kb.select(lt(x, const(0.0)), neg, pos)
    r = kb.select(eq(x, const(-INF)), const(INF), r)
    return kb.select(isnan(x), x, r)


def log_ndtr(x):
    """log of the normal distribution function: below 0, log(erfcx(-x / sqrt 2) / 2) - x^2 / 2
    (where the distribution underflows too); from 0 on log1p(-q), q = e^(-x^2 / 2) erfcx(x /
    sqrt 2) / 2 its upper tail, with x^2 taken exactly (a target's erfc may lose the tail)."""
    a = kb.min(kb.abs(x), const(1e30))  # q is 0 from 14 on; x^2 overflows where the result does
    half_erfcx = kb.mul(_erfcx_positive(kb.mul(a, const(1 / _SQRT2))), const(0.5))
    hi, lo = _square(a)
    lower = kb.sub(kb.log(half_erfcx), kb.mul(hi, const(0.5)))
    au = kb.min(a, const(20.0))
    hi, lo = _square(au)
    q = exp_times(kb.mul(hi, const(-0.5)), kb.mul(half_erfcx, kb.sub(const(1.0), kb.mul(lo, const(0.5)))))
    upper = log1p(kb.neg(q))
    r = kb.select(lt(x, const(0.0)), lower, upper)
    return kb.select(isnan(x), x, r)


def _unary(name: str, fn, *aten: str):
    def handler(c: Converter, node, args, kwargs):
        x, out = float32_operand(c, node, args[0], name)
        return result(fn(x), out)

    handles(*aten)(handler)


_unary("erfinv", erfinv, "aten.erfinv.default", "aten.special_erfinv.default")
_unary("ndtri", ndtri, "aten.special_ndtri.default")
_unary("erfcx", erfcx, "aten.special_erfcx.default")
_unary("log_ndtr", log_ndtr, "aten.special_log_ndtr.default")
