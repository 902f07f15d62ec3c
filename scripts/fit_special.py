"""Fits the Chebyshev series of compiler/aten/bessel.py and compiler/aten/error_function.py:
each function below is interpolated at Chebyshev nodes of its variable t in [-1, 1] from
mpmath's values (40 digits), and the series is cut where a float32 evaluation gains
nothing (the tail's coefficients below 2e-9 of the largest). Prints, per series, its
name, degree, the largest float64 error of the cut series on a dense grid, and the
coefficients (of T_0 .. T_n, in the form compiler/aten/series.py's chebyshev takes).
python scripts/fit_special.py [name ...]"""

import sys

import mpmath as mp
import numpy as np

mp.mp.dps = 40
LOG = mp.log
TWO_OVER_PI = 2 / mp.pi


def _x_of_u(lo, hi):
    """x = sqrt(u), u mapped linearly from t."""
    return lambda t: mp.sqrt(lo + (hi - lo) * (t + 1) / 2)


def k0_small(t):  # u = x^2 in [0, 4]: K0(x) + log(x / 2) I0(x), entire in u
    x = _x_of_u(0, 4)(t)
    return mp.mpf(-mp.euler) if x == 0 else mp.besselk(0, x) + LOG(x / 2) * mp.besseli(0, x)


def k1_small(t):  # u = x^2 in [0, 4]: x K1(x) - x log(x / 2) I1(x), entire in u
    x = _x_of_u(0, 4)(t)
    return mp.mpf(1) if x == 0 else x * mp.besselk(1, x) - x * LOG(x / 2) * mp.besseli(1, x)


def _x_of_inv(c):
    """x = c / (t + 1): t = c / x - 1 maps [c / 2, inf) onto (-1, 1]."""
    return lambda t: c / (t + 1)


def k0_large(t):  # x = 4 / (t + 1) in [2, inf): sqrt(x) e^x K0(x)
    if t == -1:
        return mp.sqrt(mp.pi / 2)
    x = _x_of_inv(4)(t)
    return mp.sqrt(x) * mp.exp(x) * mp.besselk(0, x)


def k1_large(t):
    if t == -1:
        return mp.sqrt(mp.pi / 2)
    x = _x_of_inv(4)(t)
    return mp.sqrt(x) * mp.exp(x) * mp.besselk(1, x)


def j0_small(t):  # u = x^2 in [0, 64]
    return mp.besselj(0, _x_of_u(0, 64)(t))


def j1_small(t):  # J1(x) / x
    x = _x_of_u(0, 64)(t)
    return mp.mpf(0.5) if x == 0 else mp.besselj(1, x) / x


def y0_small(t):  # Y0(x) - 2/pi log(x) J0(x), entire in u
    x = _x_of_u(0, 64)(t)
    if x == 0:
        return TWO_OVER_PI * (mp.euler - LOG(2))
    return mp.bessely(0, x) - TWO_OVER_PI * LOG(x) * mp.besselj(0, x)


def y1_small(t):  # (Y1(x) - 2/pi (log(x) J1(x) - 1/x)) / x, entire in u
    x = _x_of_u(0, 64)(t)
    if x == 0:
        x = mp.mpf(10) ** -12
    return (mp.bessely(1, x) - TWO_OVER_PI * (LOG(x) * mp.besselj(1, x) - 1 / x)) / x


def _hankel(nu, t, part):
    """P and x Q of J_nu = sqrt(2 / (pi x)) (P cos(chi) - Q sin(chi)), chi = x - (2 nu + 1) pi / 4,
    at x = 8 / sqrt(s), s = 64 / x^2 = (t + 1) / 2 in (0, 1]."""
    s = (t + 1) / 2
    if s == 0:
        return mp.mpf(1) if part == "p" else (4 * nu * nu - 1) / mp.mpf(8)
    x = 8 / mp.sqrt(s)
    chi = x - (2 * nu + 1) * mp.pi / 4
    j, y = mp.besselj(nu, x), mp.bessely(nu, x)
    a = mp.sqrt(mp.pi * x / 2)
    if part == "p":
        return a * (j * mp.cos(chi) + y * mp.sin(chi))
    return x * a * (y * mp.cos(chi) - j * mp.sin(chi))


def p0(t):
    return _hankel(0, t, "p")


def q0(t):
    return _hankel(0, t, "q")


def p1(t):
    return _hankel(1, t, "p")


def q1(t):
    return _hankel(1, t, "q")


def _y_of_w(w):
    """y with -log(1 - y^2) = w."""
    return mp.sqrt(-mp.expm1(-w))


def erfinv_central(t):  # w = -log(1 - y^2) in [0, 5]: erfinv(y) / y
    w = (t + 1) * mp.mpf(5) / 2
    if w == 0:
        return mp.sqrt(mp.pi) / 2
    y = _y_of_w(w)
    return mp.erfinv(y) / y


_S_LO, _S_HI = mp.sqrt(5), mp.mpf(10.5)


def erfinv_tail(t):  # s = sqrt(w) in [sqrt(5), 10.5]: erfinv(y) / s
    s = _S_LO + (_S_HI - _S_LO) * (t + 1) / 2
    w = s * s
    # erfinv(y) from its inverse: erfc(x) = 1 - y = z, z (2 - z) = e^-w
    z = mp.exp(-w) / (1 + mp.sqrt(1 - mp.exp(-w)))
    x = mp.findroot(lambda v: mp.log(mp.erfc(v)) - mp.log(z), mp.sqrt(w))
    return x / s


def erfcx_fit(t):  # x = 4 (1 + t) / (1 - t) in [0, inf): (1 + x) erfcx(x)
    if t == 1:
        return 1 / mp.sqrt(mp.pi)
    x = 4 * (1 + t) / (1 - t)
    return (1 + x) * mp.exp(x * x) * mp.erfc(x)


FITS = [k0_small, k1_small, k0_large, k1_large, j0_small, j1_small, y0_small, y1_small, p0, q0, p1, q1,
        erfinv_central, erfinv_tail, erfcx_fit]


def fit(f, n=80, rel=2e-9):
    nodes = [mp.cos(mp.pi * (k + mp.mpf(0.5)) / n) for k in range(n)]
    vals = [f(t) for t in nodes]
    coeffs = []
    for j in range(n):
        s = sum(v * mp.cos(mp.pi * j * (k + mp.mpf(0.5)) / n) for k, v in enumerate(vals))
        coeffs.append(float(s * 2 / n))
    coeffs[0] /= 2
    big = max(abs(c) for c in coeffs)
    last = max(j for j, c in enumerate(coeffs) if abs(c) > rel * big)
    cs = coeffs[: last + 1]
    grid = np.linspace(-1, 1, 2001)
    err = max(abs(np.polynomial.chebyshev.chebval(t, cs) - float(f(mp.mpf(t)))) for t in grid)
    return cs, err


def main(names):
    for f in FITS:
        if names and f.__name__ not in names:
            continue
        cs, err = fit(f)
        print(f"{f.__name__}: degree {len(cs) - 1}, max error {err:.2e}")
        print("(" + ", ".join(repr(float(np.float32(c))) for c in cs) + ")")


if __name__ == "__main__":
    main(sys.argv[1:])
