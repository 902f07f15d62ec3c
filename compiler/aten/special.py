"""Handlers of the gamma family: lgamma, digamma (polygamma of order 0) and mvlgamma, made
of elementwise kf ops so that every target computes them.

They are computed in float32 (float16 and bfloat16 inputs too, rounded once at the end):
the polynomials below are fitted for float32, so a float64 input is refused rather than
computed to float32's accuracy."""

from __future__ import annotations

import math

from kf.dialects import builders as kb

from ..errors import Unsupported
from . import series
from .core import Converter, handles

# lgamma(1 + u) / u on |u| <= 1/4 and lgamma(2 + u) / u on -3/4 <= u <= 1, least-squares fits
# at Chebyshev nodes (lowest power first). Near lgamma's zeros at 1 and 2 the result is u times
# a value far from 0, so it keeps its relative accuracy there (a Stirling or Lanczos form
# cancels to an absolute error of about 1e-7 and loses every digit).
_LGAMMA_AT_1 = (-0.5772156715393066, 0.822467029094696, -0.40068548917770386, 0.2705805003643036,
                -0.20740538835525513, 0.16958551108837128, -0.14317412674427032, 0.12448988854885101,
                -0.12688486278057098, 0.11590314656496048)
_LGAMMA_AT_2 = (0.42278432846069336, 0.32246702909469604, -0.0673523023724556, 0.020580807700753212,
                -0.007385553326457739, 0.002890530973672867, -0.0011927358573302627, 0.0005095120286568999,
                -0.00022319222625810653, 0.00010007301170844585, -4.504953176365234e-05,
                1.9254168364568613e-05, -8.760212949709967e-06, 5.542388862522785e-06,
                -3.077100473092287e-06, 7.614786454723799e-07)
# Stirling's series from 10 on: B_2k / (2k (2k - 1) x^(2k - 1)), its next term below 1e-10.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260)
# digamma's asymptotic series log x - 1/(2x) - sum B_2k / (2k x^2k) (torch's, from 10 on).
_PSI_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 5 / 660, -691 / 32760, 1 / 12)
_PSI_10 = 2.25175258906672110764  # digamma(10) = H_9 - Euler's constant
# digamma(x) / (x - x0) on 1 <= x <= 2, x0 = 1.46163214496836... its zero (as hi + lo, so
# x - x0 is exact to float32), fitted as above: within 3 ulp where the recurrence and
# series cancel to an absolute error of about 1e-7.
_PSI_ROOT = (1.4616321325302124, 1.243815006546356e-08)
_PSI_AT_ROOT = (0.9676722288131714, -0.44276317954063416, 0.25849980115890503, -0.16394293308258057,
                0.10782270133495331, -0.0721917375922203, 0.04882872477173805, -0.0332782082259655,
                0.022412970662117004, -0.014570158906280994, 0.01103409193456173, -0.0101365577429533,
                0.005284586921334267)
_F32 = "f32"


_c = series.const
_poly = series.horner  # sum coeffs[i] u^i by Horner's rule


_lt, _le, _eq = series.lt, series.le, series.eq


def _sin_pi_dist(x):
    """x - round(x), exact, in [-1/2, 1/2]: sin(pi x) and tan(pi x) from it keep their
    accuracy however large x is."""
    return kb.sub(x, kb.round(x))


def _lgamma_positive(a):
    """lgamma(a) for a >= 1/4 (and for a of any sign with |a| <= 1/4): a polynomial near 1
    and 2, the recurrence lgamma(y + 1) = lgamma(y) + log(y) down into [2, 3) below 10,
    Stirling's series from 10 on."""
    one, two, three = _c(1.0), _c(2.0), _c(3.0)
    small = _le(kb.abs(a), _c(0.25))
    near_1 = kb.select(small, small, kb.select(_le(_c(0.75), a), _le(a, _c(1.25)), small))
    # y: a brought into [2, 3) by at most 7 steps (a < 10), z the product of the steps
    y, z = a, one
    for _ in range(7):
        step = kb.cmp(y, three, predicate="ge")
        y1 = kb.sub(y, one)
        z = kb.select(step, kb.mul(z, y1), z)
        y = kb.select(step, y1, y)
    below_3_4 = _lt(a, _c(0.75))
    u1 = kb.select(small, a, kb.sub(a, one))
    u2 = kb.select(below_3_4, kb.sub(a, one), kb.sub(y, two))
    poly = kb.select(near_1, kb.mul(u1, _poly(u1, _LGAMMA_AT_1)), kb.mul(u2, _poly(u2, _LGAMMA_AT_2)))
    # lgamma(a) = lgamma(a + 1) - log(a) below 3/4; + log(z) above 3
    log_term = kb.select(below_3_4, kb.neg(kb.log(kb.abs(a))), kb.log(z))
    mid = kb.add(poly, log_term)
    # x (log x - 1) - log(x) / 2 overflows where lgamma does, not before
    log_a = kb.log(a)
    inv = kb.reciprocal(a)
    inv2 = kb.mul(inv, inv)
    series = kb.mul(inv, _poly(inv2, _STIRLING))
    stirling = kb.add(kb.sub(kb.mul(a, kb.sub(log_a, one)), kb.mul(_c(0.5), log_a)),
                      kb.add(_c(0.5 * math.log(2 * math.pi)), series))
    return kb.select(_lt(a, _c(10.0)), mid, stirling)


def lgamma(x):
    """log |gamma(x)| of a float32 tensor: inf at 0, the negative integers and +-inf; for
    x < -1/4 by the reflection gamma(x) gamma(-x) = -pi / (x sin(pi x))."""
    a = kb.abs(x)
    pos = _lgamma_positive(kb.select(_le(a, _c(0.25)), x, a))
    # log(pi / |x sin(pi x)|) - lgamma(|x|); 0 (a pole) gives inf
    s = kb.abs(kb.sin(kb.mul(_c(math.pi), _sin_pi_dist(x))))
    neg = kb.sub(kb.log(kb.div(_c(math.pi), kb.mul(a, s))), pos)
    r = kb.select(_lt(x, _c(-0.25)), neg, pos)
    inf = _c(float("inf"))
    return kb.select(_eq(a, inf), inf, r)


def digamma(x):
    """digamma(x) of a float32 tensor: a polynomial in x - x0 on [1, 2] around its zero x0,
    elsewhere as torch computes it: the recurrence up to 10, then the asymptotic series;
    -+inf at +-0, NaN at the negative integers and -inf, and digamma(1 - x) - pi / tan(pi x)
    below 0."""
    zero, one, ten = _c(0.0), _c(1.0), _c(10.0)
    negative = _lt(x, zero)
    y = kb.select(negative, kb.sub(one, x), x)
    acc = zero
    for _ in range(10):  # y > 0: ten steps reach 10
        step = _lt(y, ten)
        acc = kb.select(step, kb.sub(acc, kb.reciprocal(y)), acc)
        y = kb.select(step, kb.add(y, one), y)
    inv2 = kb.reciprocal(kb.mul(y, y))
    tail = kb.mul(inv2, _poly(inv2, _PSI_SERIES))
    asym = kb.sub(kb.sub(kb.log(y), kb.div(_c(0.5), y)), tail)
    pos = kb.add(acc, kb.select(_eq(y, ten), _c(_PSI_10), asym))
    r = kb.mul(_c(math.pi), _sin_pi_dist(x))
    pi_over_tan = kb.div(kb.mul(_c(math.pi), kb.cos(r)), kb.sin(r))
    out = kb.select(negative, kb.sub(pos, pi_over_tan), pos)
    u = kb.sub(kb.sub(x, _c(_PSI_ROOT[0])), _c(_PSI_ROOT[1]))
    near_root = kb.select(_le(one, x), _le(x, _c(2.0)), _le(one, x))
    out = kb.select(near_root, kb.mul(u, _poly(u, _PSI_AT_ROOT)), out)
    nan = _c(float("nan"))
    out = kb.select(kb.select(negative, _eq(x, kb.trunc(x)), negative), nan, out)  # -inf too
    # +0 -> -inf, -0 -> +inf
    signed_inf = kb.select(kb.signbit(x), _c(float("inf")), _c(-float("inf")))
    return kb.select(_eq(x, zero), signed_inf, out)


def _as_f32(c: Converter, node, x, op: str):
    out = c.out_elem(node)
    if out == "f64":
        raise Unsupported(f"{op} of float64 is not supported by kf (it computes {op} to float32's accuracy)")
    return c.tensor(x, _F32), out


def _back(y, out: str):
    return y if out == _F32 else kb.cast(y, out)


@handles("aten.lgamma.default", "aten.special_gammaln.default")
def _lgamma(c: Converter, node, args, kwargs):
    x, out = _as_f32(c, node, args[0], "lgamma")
    return _back(lgamma(x), out)


@handles("aten.digamma.default", "aten.special_digamma.default", "aten.special_psi.default")
def _digamma(c: Converter, node, args, kwargs):
    x, out = _as_f32(c, node, args[0], "digamma")
    return _back(digamma(x), out)


# Hurwitz zeta's Euler-Maclaurin divisors: (2k)! / B_2k (Cephes' and torch's zeta)
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
_ZETA_SHIFT = 20  # below -20, polygamma reflects (the direct sum steps up by one to past 9)


def _inv_power(x, s: int):
    """x^-s for an integer s >= 1 by squaring (a float32 pow's exp2(s log2 x) loses digits)."""
    r = kb.reciprocal(x)
    out, p = None, r
    while s:
        if s & 1:
            out = p if out is None else kb.mul(out, p)
        s >>= 1
        if s:
            p = kb.mul(p, p)
    return out


def hurwitz_zeta(s: int, q):
    """zeta(s, q) = sum_k (q + k)^-s for an integer s >= 2 and q > -_ZETA_SHIFT (not a pole)
    as torch's zeta computes it: the terms q, q + 1, ... directly (at least ten, and up to
    past 9), then the Euler-Maclaurin tail at the last one, w, with twelve Bernoulli terms."""
    one, nine = _c(1.0), _c(9.0)
    total, a = _inv_power(q, s), q
    for i in range(9 + _ZETA_SHIFT):
        nxt = kb.add(a, one)
        if i < 9:
            total, a = kb.add(total, _inv_power(nxt, s)), nxt
        else:
            more = _le(a, nine)
            total = kb.select(more, kb.add(total, _inv_power(nxt, s)), total)
            a = kb.select(more, nxt, a)
    w = a
    b = _inv_power(w, s)
    # b w / (s - 1) - b / 2 + b sum_i c_i w^-(2i + 1), c_i = s (s + 1) ... (s + 2i) / A_i
    coeffs, prod = [], 1.0
    for i, div in enumerate(_ZETA_A):
        prod *= s + 2 * i
        coeffs.append(prod / div)
        prod *= s + 2 * i + 1
    v = kb.reciprocal(w)
    series = kb.mul(v, _poly(kb.mul(v, v), coeffs))
    tail = kb.add(kb.sub(kb.mul(w, _c(1.0 / (s - 1))), _c(0.5)), series)
    return kb.add(total, kb.mul(b, tail))


def _cot_derivative(n: int) -> list[int]:
    """Q_n with d^n/dx^n cot(pi x) = pi^n Q_n(cot(pi x)): Q_0 = c, Q_k+1 = -(1 + c^2) Q_k'
    (coefficients, lowest power first)."""
    q = [0, 1]
    for _ in range(n):
        d = [i * q[i] for i in range(1, len(q))] or [0]
        out = [0] * (len(d) + 2)
        for i, a in enumerate(d):
            out[i] -= a
            out[i + 2] -= a
        q = out
    return q


def trigamma(x):
    """polygamma(1, x) as torch computes it: below 1/2 the reflection
    psi_1(x) = pi^2 / sin^2(pi x) - psi_1(1 - x), then six terms and the asymptotic series;
    +inf at 0 and the negative integers, 0 at inf, NaN at -inf."""
    one = _c(1.0)
    low = _lt(x, _c(0.5))
    s = kb.sin(kb.mul(_c(math.pi), _sin_pi_dist(x)))
    acc = kb.select(low, kb.neg(kb.div(_c(math.pi ** 2), kb.mul(s, s))), _c(0.0))
    y = kb.select(low, kb.sub(one, x), x)
    for _ in range(6):
        acc = kb.add(acc, kb.reciprocal(kb.mul(y, y)))
        y = kb.add(y, one)
    ixx = kb.reciprocal(kb.mul(y, y))
    series = kb.add(kb.add(one, kb.div(one, kb.mul(_c(2.0), y))), kb.mul(ixx, _poly(ixx, (1 / 6, -1 / 30, 1 / 42))))
    out = kb.add(acc, kb.div(series, y))
    out = kb.select(low, kb.neg(out), out)
    inf = _c(float("inf"))
    nonpositive = _le(x, _c(0.0))
    pole = kb.select(nonpositive, _eq(x, kb.trunc(x)), nonpositive)
    out = kb.select(pole, inf, out)
    out = kb.select(_eq(x, inf), _c(0.0), out)
    return kb.select(_eq(x, kb.neg(inf)), _c(float("nan")), out)


def polygamma(n: int, x):
    """The n-th derivative of digamma (n >= 1) of a float32 tensor: (-1)^(n+1) n! zeta(n + 1, x)
    from -20 on, and below the reflection psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) Q_n(cot(pi x)).
    At 0 and the negative integers (-1)^(n+1) inf (torch's for n >= 2; its trigamma gives a
    large finite value from sin(pi x)'s rounding); 0 at inf and NaN at -inf, the limits (torch
    gives NaN at inf for n >= 2, and +-inf at -inf)."""
    low = _lt(x, _c(-float(_ZETA_SHIFT)))
    q = kb.select(low, kb.sub(_c(1.0), x), x)
    scale = (1.0 if n % 2 else -1.0) * math.factorial(n)
    direct = kb.mul(_c(scale), hurwitz_zeta(n + 1, q))
    r = kb.mul(_c(math.pi), _sin_pi_dist(x))
    cot = kb.div(kb.cos(r), kb.sin(r))
    coeffs = [float(a) * math.pi ** (n + 1) for a in _cot_derivative(n)]
    reflected = kb.sub(kb.mul(_c((-1.0) ** n), direct), _poly(cot, coeffs))
    out = kb.select(low, reflected, direct)
    inf = _c(float("inf"))
    nonpositive = _le(x, _c(0.0))
    pole = kb.select(nonpositive, _eq(x, kb.trunc(x)), nonpositive)
    out = kb.select(pole, _c(math.copysign(float("inf"), scale)), out)
    out = kb.select(_eq(x, inf), _c(0.0), out)
    return kb.select(_eq(x, kb.neg(inf)), _c(float("nan")), out)


@handles("aten.polygamma.default", "aten.special_polygamma.default")
def _polygamma(c: Converter, node, args, kwargs):
    n = kwargs["n"] if "n" in kwargs else args[0]
    x, out = _as_f32(c, node, kwargs["self"] if "self" in kwargs else args[1], "polygamma")
    if n < 0:
        raise Unsupported(f"polygamma of order {n}: the order must be at least 0")
    if n > 20:  # (n + 1) ... (n + 23) / A_11 leaves float32 past that
        raise Unsupported(f"polygamma of order {n} is not supported by kf (at most 20)")
    return _back(digamma(x) if n == 0 else trigamma(x) if n == 1 else polygamma(n, x), out)


@handles("aten.mvlgamma.default", "aten.special_multigammaln.default")
def _mvlgamma(c: Converter, node, args, kwargs):
    """sum over i < p of lgamma(x - i/2), plus p (p - 1) / 4 log(pi)."""
    p = int(kwargs.get("p", args[1]))
    x, out = _as_f32(c, node, args[0], "mvlgamma")
    if p < 1:
        raise Unsupported(f"mvlgamma with p={p}: p must be at least 1")
    acc = None
    for i in reversed(range(p)):
        t = lgamma(kb.sub(x, _c(i / 2)) if i else x)
        acc = t if acc is None else kb.add(acc, t)
    acc = kb.add(acc, _c(p * (p - 1) / 4 * math.log(math.pi)))
    return _back(acc, out)
