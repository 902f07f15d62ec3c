"""Fits passes/scalar_math.py's NARROW_ERF_COEFFS: erf(z) ~= z * R(z^2) on [0, c], a
minimax fit (Lawson's iteratively reweighted least squares) for absolute error under the
constraint c * R(c^2) = 1 (so the clamped polynomial meets +-1 at the clamp), coefficients
rounded to f32 one at a time from the highest degree, the others refitted after each.
Prints c, the float64 error and the coefficients.  python scripts/fit_narrow_erf.py [n]"""

import math
import sys

import numpy as np


def fit(c, n, fixed=(), iters=150):
    z = np.concatenate([np.cos(np.linspace(0, np.pi, 3000)) * c / 2 + c / 2, np.linspace(0, c, 3000)])
    f = np.array([math.erf(v) for v in z])
    fixed = dict(fixed)
    free = [k for k in range(1, n) if k not in fixed]
    # c0 = (1 - sum_{k>=1} ck c^(2k+1)) / c: basis z^(2k+1) - z c^(2k), target erf(z) - z / c.
    rhs = f - z / c - sum(v * (z ** (2 * k + 1) - z * c ** (2 * k)) for k, v in fixed.items())
    scale = np.array([c ** (2 * k + 1) for k in free])
    x = []
    if free:
        A = np.stack([z ** (2 * k + 1) - z * c ** (2 * k) for k in free], 1) / scale
        w = np.ones_like(z)
        for _ in range(iters):
            sw = np.sqrt(w / w.sum())
            x, *_ = np.linalg.lstsq(A * sw[:, None], rhs * sw, rcond=None)
            w = w * np.abs(A @ x - rhs) + 1e-300
    coef = dict(fixed)
    coef.update({k: v / s for k, v, s in zip(free, x, scale)})
    coef[0] = (1 - sum(coef[k] * c ** (2 * k + 1) for k in range(1, n))) / c
    cs = [coef[k] for k in range(n)]
    err = np.max(np.abs(z * np.polyval(cs[::-1], z * z) - f))
    return cs, err


def horner32(cs, z):
    """f32 z * R(z^2) with fma (an f32 product is exact in f64)."""
    f32, f64 = np.float32, np.float64
    z = f32(z)
    s = f32(z * z)
    p = f32(cs[-1])
    for v in reversed(cs[:-1]):
        p = f32(f64(p) * f64(s) + f64(f32(v)))
    return f32(f64(z) * f64(p))


def rounded(c, n, iters=150):
    fixed = {}
    for k in range(n - 1, 0, -1):
        cs, _ = fit(c, n, fixed, iters)
        fixed[k] = float(np.float32(cs[k]))
    cs, err = fit(c, n, fixed, iters)
    cs[0] = float(np.float32(cs[0]))
    while horner32(cs, c) < 1:  # the clamp must give exactly +-1 after min/max
        cs[0] = float(np.nextafter(np.float32(cs[0]), np.float32(2)))
    return cs, err


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 11
    best = min((max(rounded(c, n, 40)[1], math.erfc(c)), c) for c in np.arange(3.1, 3.6, 0.05))
    c = float(np.float32(best[1]))
    cs, err = rounded(c, n)
    print("clamp", c, "fit error", err, "erfc(clamp)", math.erfc(c))
    print(tuple(cs))
