"""Fits passes/scalar_math.py's NARROW_GELU_COEFFS: GELU(x) ~= x / (1 + 2^(x Q(x^2))),
i.e. Phi(x) = sigmoid(L(x)) with the logit L(x) = ln(Phi(x) / (1 - Phi(x))) (odd)
approximated by -ln(2) x Q(x^2); Q of degree 4 for bf16 (and fp8) results, 6 for f16.

The fit is a weighted minimax (Lawson's iteratively reweighted least squares) of the
linearized GELU error, x Phi (1 - Phi) |dL|, divided by |GELU(-|x|)| + TAU: absolute
error where |GELU| is large, relative error towards the negative tail (where a bf16
ulp is small), on [0, R] (the error of +x and -x is the same; the weight takes the
smaller |GELU|). Coefficients are rounded to f32 one at a time from the highest degree,
the others refitted after each. Q must be decreasing for s >= 0 (so x Q(x^2) has the
sign of -x everywhere and the tail beyond R goes to 0 and x): checked, and the script
prints the float32 emulation's errors (abs, and in bf16/f16 ulps of the result).

    python scripts/fit_narrow_gelu.py            # both fits
    python scripts/fit_narrow_gelu.py DEG R TAU  # another one
"""

import math
import sys

import numpy as np

#: stored type -> (degree of Q, fitted range [0, R], TAU)
FITS = {"bf16": (4, 4.5, 1e-2), "f16": (6, 5.0, 3e-3)}
LOG2E = math.log2(math.e)


def phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def fit(deg, r, tau, fixed=(), iters=300, n=8000):
    x = np.unique(np.concatenate([np.linspace(1e-3, r, n), r * (1 - np.cos(np.linspace(0, np.pi / 2, n)))]))
    x = x[x > 0]
    target = np.array([math.log(phi(v)) - math.log(phi(-v)) for v in x]) * -LOG2E  # the logit in log2 units, negated
    p = np.array([phi(v) for v in x])
    w0 = x * p * (1 - p) / (tau + x * (1 - p))
    fixed = dict(fixed)
    free = [k for k in range(deg + 1) if k not in fixed]
    rhs = target - sum(v * x ** (2 * k + 1) for k, v in fixed.items())
    a = np.stack([x ** (2 * k + 1) for k in free], 1)
    scale = a.max(0)
    a = a / scale
    w = np.ones_like(x)
    for _ in range(iters):
        sw = np.sqrt(w / w.sum()) * w0
        c, *_ = np.linalg.lstsq(a * sw[:, None], rhs * sw, rcond=None)
        w = w * np.abs((a @ c - rhs) * w0) + 1e-300
    q = dict(fixed)
    q.update({k: v / s for k, v, s in zip(free, c, scale)})
    return [q[k] for k in range(deg + 1)]


def rounded(deg, r, tau):
    fixed = {}
    for k in range(deg, -1, -1):
        fixed[k] = float(np.float32(fit(deg, r, tau, fixed)[k]))
    return tuple(fixed[k] for k in range(deg + 1))


def gelu32(x, q):
    """float32 emulation of the emitted code (fma rounds once; ex2 and the reciprocal exact)."""
    f32, f64 = np.float32, np.float64
    x = np.asarray(x, f32)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (x * x).astype(f32)
        p = np.full_like(s, f32(q[-1]))
        for v in reversed(q[:-1]):
            p = (p.astype(f64) * s + f64(f32(v))).astype(f32)
        e = np.exp2((x * p).astype(f32).astype(f64)).astype(f32)
        return (x * (1.0 / (e + f32(1)).astype(f32).astype(f64)).astype(f32)).astype(f32)


def decreasing(q) -> bool:
    """Q' < 0 on s >= 0: no real root of Q' at s >= 0 and Q'(0) < 0."""
    d = np.polynomial.Polynomial(q).deriv()
    roots = d.roots()
    return d(0.0) < 0 and not any(abs(r.imag) < 1e-9 and r.real >= 0 for r in roots)


def report(deg, r, tau):
    q = rounded(deg, r, tau)
    assert decreasing(q), "Q is not decreasing"
    x = np.linspace(-14, 14, 2_800_001).astype(np.float32)
    ref = x.astype(np.float64) * np.array([phi(float(v)) for v in x])
    got = gelu32(x, q).astype(np.float64)
    err = np.abs(got - ref)
    ulp = 2.0 ** np.floor(np.log2(np.maximum(np.abs(ref), 1e-38)))
    print(f"degree {deg}, R {r}, TAU {tau}: max abs error {err.max():.3g} at {x[err.argmax()]:.4f}")
    for name, bits in (("bf16", 7), ("f16", 10)):
        u = err / (ulp * 2.0 ** -bits)
        print(f"  {name} ulps of the result for x >= -2, -3, -4, -5:",
              ", ".join(f"{u[x >= lo].max():.3f}" for lo in (-2, -3, -4, -5)))
    print(" ", q)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        report(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
    else:
        for name, fit_args in FITS.items():
            print(name)
            report(*fit_args)
