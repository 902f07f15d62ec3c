"""Handlers of the orthogonal polynomials of torch.special (Chebyshev T, U, V, W and their
shifted forms, Hermite H and He, Laguerre L, Legendre P) of a tensor x and a Python number
n: the three-term recurrence unrolled n times, in x's float type. A tensor n is refused:
the recurrence would need a loop bounded by its largest element, which kf's elementwise
kernels do not have."""

from __future__ import annotations

from kf.dialects import builders as kb

from ..errors import Unsupported
from .core import Converter, _target_name, handles

_MAX_N = 256  # the recurrence is unrolled: past this the kernel grows too large


def _scalar(x, v: float):
    from kf.dialects import spec_of

    return kb.scalar(float(v), spec_of(x.type).elem)


# each rule: (p_1(x), step(x, k) -> (a, b, d)) with p_(k+1) = (a p_k - b p_(k-1)) / d
def _chebyshev(first):
    """T, U, V, W: p_(k+1) = 2x p_k - p_(k-1), p_0 = 1, p_1 = first(x)."""
    return first, lambda x, k: (kb.add(x, x), 1, 1)


def _shifted(rule):
    first, step = rule

    def at(x):
        return kb.sub(kb.add(x, x), _scalar(x, 1.0))

    return (lambda x: first(at(x))), (lambda x, k: step(at(x), k))


_RULES = {
    "chebyshev_polynomial_t": _chebyshev(lambda x: x),
    "chebyshev_polynomial_u": _chebyshev(lambda x: kb.add(x, x)),
    "chebyshev_polynomial_v": _chebyshev(lambda x: kb.sub(kb.add(x, x), _scalar(x, 1.0))),
    "chebyshev_polynomial_w": _chebyshev(lambda x: kb.add(kb.add(x, x), _scalar(x, 1.0))),
    # H_(k+1) = 2x H_k - 2k H_(k-1)
    "hermite_polynomial_h": (lambda x: kb.add(x, x), lambda x, k: (kb.add(x, x), 2 * k, 1)),
    # He_(k+1) = x He_k - k He_(k-1)
    "hermite_polynomial_he": (lambda x: x, lambda x, k: (x, k, 1)),
    # (k + 1) L_(k+1) = (2k + 1 - x) L_k - k L_(k-1)
    "laguerre_polynomial_l": (lambda x: kb.sub(_scalar(x, 1.0), x),
                              lambda x, k: (kb.sub(_scalar(x, 2 * k + 1), x), k, k + 1)),
    # (k + 1) P_(k+1) = (2k + 1) x P_k - k P_(k-1)
    "legendre_polynomial_p": (lambda x: x, lambda x, k: (kb.mul(_scalar(x, 2 * k + 1), x), k, k + 1)),
}
for _kind in "tuvw":
    _RULES[f"shifted_chebyshev_polynomial_{_kind}"] = _shifted(_RULES[f"chebyshev_polynomial_{_kind}"])


def polynomial(name: str, x, n: int):
    """The polynomial of degree n at x: 0 for n < 0, 1 for n = 0 (NaN x too, as torch)."""
    zero = kb.mul(_scalar(x, 0.0), kb.select(kb.cmp(x, x, predicate="ne"), _scalar(x, 0.0), x))
    if n < 0:
        return zero
    first, step = _RULES[name]
    p = kb.add(zero, _scalar(x, 1.0))
    if n == 0:
        return p
    q = first(x)
    for k in range(1, n):
        a, b, d = step(x, k)
        r = kb.sub(kb.mul(a, q), p if b == 1 else kb.mul(_scalar(x, b), p))
        p, q = q, (r if d == 1 else kb.div(r, _scalar(x, d)))
    return q


def _handler(name: str):
    def handler(c: Converter, node, args, kwargs):
        x, n = args[0], args[1]
        op = _target_name(node.target)
        if not isinstance(n, (int, float)) or isinstance(n, bool):
            raise Unsupported(f"{op} with n a tensor is not supported by kf: it unrolls the recurrence for a "
                              f"Python number n (pass n as an int)")
        elem = c.out_elem(node)
        if elem == "f64":
            raise Unsupported(f"{op} of float64 is not supported by kf")
        n = int(n)
        if n > _MAX_N:
            raise Unsupported(f"{op} of degree {n} is not supported by kf (at most {_MAX_N})")
        return polynomial(name, c.tensor(x, elem), n)

    return handler


for _name in _RULES:
    handles(f"aten.special_{_name}.default", f"aten.special_{_name}.n_scalar",
            f"aten.special_{_name}.x_scalar")(_handler(_name))
