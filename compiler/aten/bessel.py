"""Handlers of the Bessel functions of order 0 and 1: i0, i1 and their exponentially scaled
forms, modified_bessel_k0/k1 (and scaled), bessel_j0/j1/y0/y1 and spherical_bessel_j0,
made of elementwise kf ops in float32 so that every target computes them.

Where the coefficients come from: the power series and asymptotic expansions of I0 and I1
have mathematical constants as coefficients (computed below); the Chebyshev series are
interpolants of mpmath's values made by scripts/fit_special.py (named there as here)."""

from __future__ import annotations

import math

from kf.dialects import builders as kb

from .core import Converter, handles
from .series import (INF, chebyshev, const, either, eq, exp_times, float32_operand, horner, isnan, le, log1p, lt,
                     on_interval, result)

# ----------------------------------------------------------------- I0 and I1
_I_SWITCH = 15.0  # power series up to here, then the asymptotic expansion
_I_SERIES_TERMS = 24  # the next term of the series at 15 is below 1e-9 of the sum
_I_ASYMPTOTIC_TERMS = 10  # the next term of the expansion at 15 is below 1e-9


def _asymptotic(nu: int, sign: int):
    """Coefficients of sum_k sign^k a_k(nu) x^-k, a_k(nu) = prod_{j <= k} (4 nu^2 - (2j - 1)^2)
    / (k! 8^k): I_nu(x) ~ e^x / sqrt(2 pi x) times it with sign -1, K_nu(x) ~ sqrt(pi / 2x)
    e^-x with sign +1."""
    out, a = [1.0], 1.0
    for k in range(1, _I_ASYMPTOTIC_TERMS + 1):
        a *= (4 * nu * nu - (2 * k - 1) ** 2) / (k * 8)
        out.append(a * sign ** k)
    return out


def _i_series(u, nu: int):
    """sum_k u^k / (k! (k + nu)!) times nu!, nested as 1 + u / (1 (1 + nu)) (1 + u / (2 (2 + nu))
    (...)) so that no term's coefficient leaves float32's range."""
    r = const(1.0)
    for k in range(_I_SERIES_TERMS, 0, -1):
        r = kb.add(const(1.0), kb.mul(kb.mul(r, u), const(1.0 / (k * (k + nu)))))
    return r


def _modified_i(x, nu: int, scaled: bool):
    """I_nu(x) (e^-|x| I_nu(x) if scaled) for nu in 0, 1."""
    a = kb.abs(x)
    half = kb.mul(a, const(0.5))
    small = _i_series(kb.mul(half, half), nu)
    if nu == 1:
        small = kb.mul(small, half)
    if scaled:
        small = exp_times(kb.neg(a), small)
    big = kb.mul(horner(kb.reciprocal(a), _asymptotic(nu, -1)), kb.rsqrt(kb.mul(a, const(2 * math.pi))))
    if not scaled:
        big = kb.select(eq(a, const(INF)), a, exp_times(a, big))
    r = kb.select(le(a, const(_I_SWITCH)), small, big)
    r = kb.select(isnan(a), a, r)
    if nu == 1:
        r = kb.select(kb.signbit(x), kb.neg(r), r)
    return r


# ----------------------------------------------------------------- K0 and K1
# u = x^2 on [0, 4]: K0(x) + log(x / 2) I0(x) and x K1(x) - x log(x / 2) I1(x), entire in u
_K0_SMALL = (-0.2676636874675751, 0.3442898988723755, 0.03597993776202202, 0.0012646154500544071,
             2.2862121113575995e-05, 2.5347910082018643e-07, 1.904516322426275e-09)
_K1_SMALL = (0.7626501321792603, -0.3531559705734253, -0.12261117994785309, -0.006975723896175623,
             -0.00017302889318671077, -2.4334060526598478e-06, -2.2133876953489562e-08)
# t = 4 / x - 1 for x >= 2: sqrt(x) e^x K0(x) and sqrt(x) e^x K1(x)
_K0_LARGE = (1.2201515436172485, -0.03144809976220131, 0.0015698838979005814, -0.00012849549239035696,
             1.3949813364888541e-05, -1.8317555259272922e-06, 2.7668136226566276e-07, -4.6604899495150676e-08,
             8.574033927288838e-09)
_K1_LARGE = (1.360313057899475, 0.1039237380027771, -0.002857816871255636, 0.00019521551439538598,
             -1.9361979866516776e-05, 2.406485009487369e-06, -3.50196046383644e-07, 5.741084052601764e-08,
             -1.0345762468944031e-08)


def _modified_k(x, nu: int, scaled: bool):
    """K_nu(x) (e^x K_nu(x) if scaled) for nu in 0, 1: inf at 0, NaN below 0, 0 at inf."""
    two = const(2.0)
    xs = kb.select(le(x, two), x, two)  # the small-x form only where it is used
    t = on_interval(kb.mul(xs, xs), 0.0, 4.0)
    half = kb.mul(xs, const(0.5))
    # log(x / 2) near 2 from log1p: a target's log near 1 may be off by its absolute error
    log_half = kb.select(le(const(1.0), xs), log1p(kb.sub(half, const(1.0))), kb.log(half))
    if nu == 0:
        small = kb.sub(chebyshev(t, _K0_SMALL), kb.mul(log_half, _modified_i(xs, 0, False)))
    else:
        small = kb.add(kb.div(chebyshev(t, _K1_SMALL), xs), kb.mul(log_half, _modified_i(xs, 1, False)))
    if scaled:
        small = exp_times(xs, small)
    xl = kb.select(le(x, two), two, x)
    big = kb.mul(chebyshev(kb.sub(kb.div(const(4.0), xl), const(1.0)), _K0_LARGE if nu == 0 else _K1_LARGE),
                 kb.rsqrt(xl))
    if not scaled:
        big = exp_times(kb.neg(xl), big)
    r = kb.select(le(x, two), small, big)
    r = kb.select(eq(x, const(0.0)), const(INF), r)
    return kb.select(either(lt(x, const(0.0)), isnan(x)), const(float("nan")), r)


# ----------------------------------------------------------------- J0, J1, Y0, Y1
_J_SWITCH = 8.0
# u = x^2 on [0, 64]: J0(x), J1(x) / x, Y0(x) - 2/pi log(x) J0(x), (Y1(x) - 2/pi (log(x) J1(x) - 1/x)) / x
_J0_SMALL = (0.15772797167301178, -0.008723442442715168, 0.2651786208152771, -0.37009498476982117,
             0.15806710720062256, -0.03489376977086067, 0.004819179885089397, -0.00046062617911957204,
             3.246032792958431e-05, -1.761946919032198e-06, 7.608163343775232e-08, -2.6792534857378314e-09)
_J1_SMALL = (0.08104484528303146, -0.14897514879703522, 0.16099926829338074, -0.08268049359321594,
             0.022213639691472054, -0.003646940691396594, 0.00040503375930711627, -3.255554838688113e-05,
             1.9858773612213554e-06, -9.521984623006574e-08, 3.687133709462387e-09)
_Y0_SMALL = (-0.03314611315727234, -0.27447429299354553, 0.1790343075990677, 0.2615673542022705,
             -0.1773020178079605, 0.04719668999314308, -0.007287962362170219, 0.0007531135925091803,
             -5.6320790463360026e-05, 3.206532483090996e-06, -1.440723309542591e-07, 5.248794732182205e-09)
_Y1_SMALL = (0.002538013271987438, -0.01608717255294323, -0.09591204673051834, 0.08445197343826294,
             -0.028328124433755875, 0.005289897322654724, -0.0006414551171474159, 5.505982699105516e-05,
             -3.5380799090489745e-06, 1.7707805000100052e-07, -7.110549926636622e-09, 2.3443377794585274e-10)
# Hankel's P and x Q of J_nu = sqrt(2 / (pi x)) (P cos(chi) - Q sin(chi)), chi = x - (2 nu + 1) pi / 4,
# Y_nu = sqrt(2 / (pi x)) (P sin(chi) + Q cos(chi)), in t = 128 / x^2 - 1 for x >= 8
_P0 = (0.9994603395462036, -0.0005365220713429153, 3.0751848498766776e-06, -5.1705946191304974e-08)
_Q0 = (-0.12444683909416199, 0.0005470815813168883, -5.931598934694193e-06, 1.437796584013995e-07,
       -5.8175326778098224e-09, 3.376097457152838e-10)
_P1 = (1.0009030103683472, 0.000898989848792553, -3.9872843444754835e-06, 6.177634048754044e-08)
_Q1 = (0.3742223083972931, -0.0007702178554609418, 7.310892215173226e-06, -1.6767825172792072e-07,
       6.583354750233639e-09)


def _hankel(a, nu: int):
    """(J_nu(a), Y_nu(a)) for a >= 8 (clamped to 8 below): the phase's pi/4 taken apart,
    cos(a - pi/4) = (cos a + sin a) / sqrt 2, so that cos and sin see a itself."""
    a = kb.max(a, const(_J_SWITCH))
    t = kb.sub(kb.div(const(128.0), kb.mul(a, a)), const(1.0))
    p = chebyshev(t, _P0 if nu == 0 else _P1)
    q = kb.div(chebyshev(t, _Q0 if nu == 0 else _Q1), a)
    c, s = kb.cos(a), kb.sin(a)
    plus, minus = kb.add(c, s), kb.sub(s, c)
    if nu == 0:
        j = kb.sub(kb.mul(p, plus), kb.mul(q, minus))
        y = kb.add(kb.mul(p, minus), kb.mul(q, plus))
    else:  # chi = a - 3 pi / 4: cos(chi) = (s - c) / sqrt 2, sin(chi) = -(s + c) / sqrt 2
        j = kb.add(kb.mul(p, minus), kb.mul(q, plus))
        y = kb.sub(kb.mul(q, minus), kb.mul(p, plus))
    scale = kb.rsqrt(kb.mul(a, const(math.pi)))
    return kb.mul(scale, j), kb.mul(scale, y)


def _small_j(a, nu: int):
    """(J_nu(a), t) for 0 <= a <= 8 (clamped), t the series' variable."""
    a = kb.min(a, const(_J_SWITCH))
    t = on_interval(kb.mul(a, a), 0.0, 64.0)
    return (chebyshev(t, _J0_SMALL) if nu == 0 else kb.mul(a, chebyshev(t, _J1_SMALL))), t


def bessel_j(x, nu: int):
    a = kb.abs(x)
    small, _ = _small_j(a, nu)
    big, _ = _hankel(a, nu)
    r = kb.select(le(a, const(_J_SWITCH)), small, big)
    r = kb.select(eq(a, const(INF)), const(0.0), r)
    if nu == 1:
        r = kb.select(kb.signbit(x), kb.neg(r), r)
    return kb.select(isnan(x), x, r)


def bessel_y(x, nu: int):
    """Y_nu(x): -inf at 0, NaN below 0, 0 at inf."""
    a = kb.min(kb.max(x, const(0.0)), const(_J_SWITCH))
    j, t = _small_j(a, nu)
    two_over_pi = const(2 / math.pi)
    if nu == 0:
        small = kb.add(chebyshev(t, _Y0_SMALL), kb.mul(two_over_pi, kb.mul(kb.log(a), j)))
    else:
        small = kb.add(kb.mul(a, chebyshev(t, _Y1_SMALL)),
                       kb.mul(two_over_pi, kb.sub(kb.mul(kb.log(a), j), kb.reciprocal(a))))
    _, big = _hankel(x, nu)
    r = kb.select(le(x, const(_J_SWITCH)), small, big)
    r = kb.select(eq(x, const(INF)), const(0.0), r)
    r = kb.select(eq(x, const(0.0)), const(-INF), r)
    return kb.select(either(lt(x, const(0.0)), isnan(x)), const(float("nan")), r)


def spherical_j0(x):
    """sin(x) / x: 1 at 0, 0 at +-inf."""
    zero = eq(x, const(0.0))
    r = kb.div(kb.sin(x), kb.select(zero, const(1.0), x))
    r = kb.select(zero, const(1.0), r)
    return kb.select(eq(kb.abs(x), const(INF)), const(0.0), r)


def _unary(name: str, fn, *aten: str):
    def handler(c: Converter, node, args, kwargs):
        x, out = float32_operand(c, node, args[0], name)
        return result(fn(x), out)

    handles(*aten)(handler)


_unary("i0", lambda x: _modified_i(x, 0, False), "aten.i0.default", "aten.special_i0.default",
       "aten.special_modified_bessel_i0.default")
_unary("i0e", lambda x: _modified_i(x, 0, True), "aten.special_i0e.default")
_unary("i1", lambda x: _modified_i(x, 1, False), "aten.special_i1.default", "aten.special_modified_bessel_i1.default")
_unary("i1e", lambda x: _modified_i(x, 1, True), "aten.special_i1e.default")
_unary("modified_bessel_k0", lambda x: _modified_k(x, 0, False), "aten.special_modified_bessel_k0.default")
_unary("modified_bessel_k1", lambda x: _modified_k(x, 1, False), "aten.special_modified_bessel_k1.default")
_unary("scaled_modified_bessel_k0", lambda x: _modified_k(x, 0, True),
       "aten.special_scaled_modified_bessel_k0.default")
_unary("scaled_modified_bessel_k1", lambda x: _modified_k(x, 1, True),
       "aten.special_scaled_modified_bessel_k1.default")
_unary("bessel_j0", lambda x: bessel_j(x, 0), "aten.special_bessel_j0.default")
_unary("bessel_j1", lambda x: bessel_j(x, 1), "aten.special_bessel_j1.default")
_unary("bessel_y0", lambda x: bessel_y(x, 0), "aten.special_bessel_y0.default")
_unary("bessel_y1", lambda x: bessel_y(x, 1), "aten.special_bessel_y1.default")
_unary("spherical_bessel_j0", spherical_j0, "aten.special_spherical_bessel_j0.default")
