"""Elementwise math functions made of kf's elementwise ops (trunc, exp, log, pow, sin,
cos, select), so that every target compiles them as it compiles those: floor, ceil,
square, log2, log10, exp2, log1p, expm1, sinh, cosh, tan, atan, asin, acos, atan2,
asinh, acosh, atanh, log_sigmoid, and the logical ops (bitwise ones of booleans).
log1p and expm1 stay accurate near 0 by the classic correction of the rounding of
1 + x (log(u) * x / (u - 1), u = 1 + x) and of e^x - 1; sinh and asinh build on them.
Results are within float32's tolerance of torch's."""

from __future__ import annotations

import math

from kf.dialects import builders as kb

from ..dtypes import kf_elem
from .core import HANDLERS, _target_name, handles, shape_of


def _const(v: float, elem: str):
    return kb.scalar(v, elem)


def _is(x, v: float, elem: str):
    return kb.cmp(x, _const(v, elem), predicate="eq")


def floor(x, elem):
    t = kb.trunc(x)
    return kb.select(kb.cmp(t, x, predicate="gt"), kb.sub(t, _const(1.0, elem)), t)


def ceil(x, elem):
    t = kb.trunc(x)
    return kb.select(kb.cmp(t, x, predicate="lt"), kb.add(t, _const(1.0, elem)), t)


def _near_zero(x, elem):
    return kb.cmp(kb.abs(x), _const(0.5, elem), predicate="lt")


def log1p(x, elem):
    """log(1 + x): for |x| < 1/2, log(u) * x / (u - 1) with u = 1 + x rounded (x where u
    is 1); further out log(u), whose rounding of u costs little."""
    u = kb.add(x, _const(1.0, elem))
    log_u = kb.log(u)
    corrected = kb.div(kb.mul(log_u, x), kb.sub(u, _const(1.0, elem)))
    r = kb.select(_is(u, 1.0, elem), x, corrected)
    return kb.select(_near_zero(x, elem), r, log_u)


def expm1(x, elem):
    """e^x - 1: for |x| < 1/2, (u - 1) * x / log(u) with u = e^x rounded (x where u is
    1); further out u - 1, whose rounding of u costs little."""
    u = kb.exp(x)
    um1 = kb.sub(u, _const(1.0, elem))
    corrected = kb.div(kb.mul(um1, x), kb.log(u))
    r = kb.select(_is(u, 1.0, elem), x, corrected)
    return kb.select(_near_zero(x, elem), r, um1)


def _false():
    return kb.scalar(0.0, "i1")


def _with_sign_of(r, x):
    return kb.select(kb.signbit(x), kb.neg(r), r)


def sinh(x, elem):
    """(m + m / (m + 1)) / 2 with m = expm1(|x|) below 10 (accurate near 0), else
    (h / 2) * h with h = e^(|x|/2) (no overflow before sinh's own), the sign of x."""
    a = kb.abs(x)
    m = expm1(a, elem)
    half = _const(0.5, elem)
    small = kb.mul(kb.add(m, kb.div(m, kb.add(m, _const(1.0, elem)))), half)
    h = kb.exp(kb.mul(a, half))
    big = kb.mul(kb.mul(h, half), h)
    return _with_sign_of(kb.select(kb.cmp(a, _const(10.0, elem), predicate="lt"), small, big), x)


def cosh(x, elem):
    a = kb.abs(x)
    half = _const(0.5, elem)
    e = kb.exp(a)
    small = kb.mul(kb.add(e, kb.reciprocal(e)), half)
    h = kb.exp(kb.mul(a, half))
    big = kb.mul(kb.mul(h, half), h)
    return kb.select(kb.cmp(a, _const(10.0, elem), predicate="lt"), small, big)


def asinh(x, elem):
    """log1p(a + a^2 / (1 + sqrt(1 + a^2))) for |x| = a below 2^12, log(a) + log 2 above
    (a^2 would overflow), the sign of x."""
    a = kb.abs(x)
    one = _const(1.0, elem)
    a2 = kb.mul(a, a)
    small = log1p(kb.add(a, kb.div(a2, kb.add(one, kb.sqrt(kb.add(one, a2))))), elem)
    big = kb.add(kb.log(a), _const(math.log(2.0), elem))
    return _with_sign_of(kb.select(kb.cmp(a, _const(4096.0, elem), predicate="lt"), small, big), x)


def acosh(x, elem):
    """log1p(t + sqrt(2t + t^2)) with t = x - 1 below 2^12, log(x) + log 2 above."""
    t = kb.sub(x, _const(1.0, elem))
    small = log1p(kb.add(t, kb.sqrt(kb.add(kb.mul(t, _const(2.0, elem)), kb.mul(t, t)))), elem)
    big = kb.add(kb.log(x), _const(math.log(2.0), elem))
    return kb.select(kb.cmp(x, _const(4096.0, elem), predicate="lt"), small, big)


def atanh(x, elem):
    """log1p(2x / (1 - x)) / 2."""
    one = _const(1.0, elem)
    return kb.mul(log1p(kb.div(kb.mul(x, _const(2.0, elem)), kb.sub(one, x)), elem), _const(0.5, elem))


def atan(x, elem):
    """atan by reduction to |r| <= tan(pi/12), where its Taylor series to r^13 is within
    float32's rounding: a = |x| above 1 becomes 1/a (from pi/2), then above tan(pi/12)
    (a sqrt3 - 1) / (a + sqrt3) (from pi/6); the sign of x."""
    one = _const(1.0, elem)
    a = kb.abs(x)
    inverted = kb.cmp(a, one, predicate="gt")
    a = kb.select(inverted, kb.reciprocal(a), a)
    shifted = kb.cmp(a, _const(2 - math.sqrt(3), elem), predicate="gt")
    s3 = _const(math.sqrt(3), elem)
    a = kb.select(shifted, kb.div(kb.sub(kb.mul(a, s3), one), kb.add(a, s3)), a)
    a2 = kb.mul(a, a)
    p = _const(1 / 13, elem)
    for k in (11, 9, 7, 5, 3):
        p = kb.sub(_const(1 / k, elem), kb.mul(a2, p))
    r = kb.sub(a, kb.mul(kb.mul(a, a2), p))
    r = kb.select(shifted, kb.add(r, _const(math.pi / 6, elem)), r)
    r = kb.select(inverted, kb.sub(_const(math.pi / 2, elem), r), r)
    return _with_sign_of(r, x)


def asin(x, elem):
    """atan(x / sqrt((1 - x)(1 + x))): 1 - x is exact near 1."""
    one = _const(1.0, elem)
    return atan(kb.div(x, kb.sqrt(kb.mul(kb.sub(one, x), kb.add(one, x)))), elem)


def acos(x, elem):
    """2 atan(sqrt((1 - x) / (1 + x)))."""
    one = _const(1.0, elem)
    return kb.mul(atan(kb.sqrt(kb.div(kb.sub(one, x), kb.add(one, x))), elem), _const(2.0, elem))


def atan2(y, x, elem):
    """atan(y / x), moved by pi (toward y's sign) where x is negative, pi/2 with y's sign
    where x is 0; where both are 0
    or both infinite, torch's signed angles (0 or pi, pi/4 or 3pi/4)."""
    zero = _const(0.0, elem)
    r = atan(kb.div(y, x), elem)
    pi = _with_sign_of(_const(math.pi, elem), y)
    x_negative = kb.signbit(x)
    r = kb.select(kb.cmp(x, zero, predicate="lt"), kb.add(r, pi), r)
    x_zero = kb.select(kb.cmp(x, zero, predicate="eq"), kb.cmp(y, y, predicate="eq"), _false())  # y not NaN
    r = kb.select(x_zero, _with_sign_of(_const(math.pi / 2, elem), y), r)
    both_zero = kb.select(kb.cmp(x, zero, predicate="eq"), kb.cmp(y, zero, predicate="eq"), _false())
    r = kb.select(both_zero, kb.select(x_negative, pi, _with_sign_of(zero, y)), r)
    inf = _const(math.inf, elem)
    both_inf = kb.select(kb.cmp(kb.abs(x), inf, predicate="eq"), kb.cmp(kb.abs(y), inf, predicate="eq"), _false())
    corner = kb.select(x_negative, _const(3 * math.pi / 4, elem), _const(math.pi / 4, elem))
    return kb.select(both_inf, _with_sign_of(corner, y), r)


_FUNCTIONS = {
    "atan": atan, "asin": asin, "acos": acos,
    "floor": floor, "ceil": ceil, "log1p": log1p, "expm1": expm1, "sinh": sinh, "cosh": cosh,
    "asinh": asinh, "acosh": acosh, "atanh": atanh,
    "square": lambda x, elem: kb.mul(x, x),
    "log2": lambda x, elem: kb.mul(kb.log(x), _const(1 / math.log(2.0), elem)),
    "log10": lambda x, elem: kb.mul(kb.log(x), _const(1 / math.log(10.0), elem)),
    "exp2": lambda x, elem: kb.pow(_const(2.0, elem), x),
    "tan": lambda x, elem: kb.div(kb.sin(x), kb.cos(x)),
}

#: the functions that keep integer inputs as they are (torch's floor of an int is the int)
_INTEGER_IDENTITY = ("floor", "ceil")


def _handler(fn_name: str):
    fn = _FUNCTIONS[fn_name]

    def handler(c, node, args, kwargs):
        elem = c.out_elem(node)
        x = args[0]
        if fn_name in _INTEGER_IDENTITY and not elem.startswith(("f", "bf")):
            return c.tensor(x, elem)
        if fn_name == "square" and elem.startswith(("i", "u")):
            return fn(c.tensor(x, elem), elem)
        compute = "f32" if elem in ("f16", "bf16") else elem
        r = fn(c.tensor(x, compute), compute)
        return r if compute == elem else kb.cast(r, elem)

    return handler


for _name in _FUNCTIONS:
    HANDLERS[f"aten.{_name}.default"] = _handler(_name)


def _nonzero(c, x):
    if not hasattr(x, "type"):
        return kb.scalar(1.0 if x else 0.0, "i1")
    from .core import elem_of

    if elem_of(x) == "i1":
        return x
    return kb.cmp(x, kb.scalar(0.0, elem_of(x)), predicate="ne")


@handles("aten.atan2.default")
def _atan2(c, node, args, kwargs):
    elem = c.out_elem(node)
    compute = "f32" if elem in ("f16", "bf16") else elem
    y, x = c.tensor(args[0], compute), c.tensor(args[1], compute)
    shape = tuple(node.meta["val"].shape)
    y = kb.broadcast_to(y, shape) if shape_of(y) != shape else y
    x = kb.broadcast_to(x, shape) if shape_of(x) != shape else x
    r = atan2(y, x, compute)
    return r if compute == elem else kb.cast(r, elem)


@handles("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor", "aten.bitwise_and.Scalar",
         "aten.bitwise_or.Scalar", "aten.bitwise_xor.Scalar")
def _bitwise(c, node, args, kwargs):
    """Bitwise ops of booleans are the logical ones; of integers, kf.bitwise."""
    elem = c.out_elem(node)
    if elem != "i1":
        from .elementwise import integer_bitwise

        return integer_bitwise(c, node, args[0], args[1], elem, node.target._opname.removeprefix("bitwise_"))
    return _logical(c, node, args, kwargs)


@handles("aten.log_sigmoid_forward.default")
def _log_sigmoid_forward(c, node, args, kwargs):
    """(log sigmoid(x), eager's buffer for the backward, here zeros): min(x, 0) -
    log1p(e^-|x|), which neither overflows nor loses the tail."""
    out_val, buffer_val = node.meta["val"]
    elem = kf_elem(out_val.dtype)
    compute = "f32" if elem in ("f16", "bf16") else elem
    x = c.tensor(args[0], compute)
    r = kb.sub(kb.min(x, _const(0.0, compute)), log1p(kb.exp(kb.neg(kb.abs(x))), compute))
    r = r if compute == elem else kb.cast(r, elem)
    return r, kb.fill(tuple(buffer_val.shape), kf_elem(buffer_val.dtype), 0.0)


@handles("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default")
def _logical(c, node, args, kwargs):
    """torch's logical ops: each operand true where nonzero, a bool result."""
    a, b = _nonzero(c, args[0]), _nonzero(c, args[1])
    shape = tuple(node.meta["val"].shape)
    a = kb.broadcast_to(a, shape) if shape_of(a) != shape else a
    b = kb.broadcast_to(b, shape) if shape_of(b) != shape else b
    op = node.target._opname.replace("bitwise", "logical")
    if op == "logical_and":
        r = kb.select(a, b, a)
    elif op == "logical_or":
        r = kb.select(a, a, b)
    else:
        r = kb.cmp(kb.cast(a, "i32"), kb.cast(b, "i32"), predicate="ne")
    return r if c.out_elem(node) == "i1" else kb.cast(r, c.out_elem(node))
