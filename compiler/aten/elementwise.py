"""Handlers of elementwise ATen ops: arithmetic with torch's type promotion and
alpha, comparisons, where/masked_fill, unary math, activations, casts, and the special
values and roundings (isnan, isinf, isfinite, sign, trunc, frac, round, hypot,
copysign) made of kf ops that every target computes."""

from __future__ import annotations

import math

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of
from kf.dialects.elements import INT_TYPES, LOW_PRECISION

from ..dtypes import torch_dtype
from ..errors import Unsupported
from .core import Converter, HANDLERS, _target_name, fake_value, handles, shape_of


def _opmath(elem: str, *xs) -> str:
    """The type a product or quotient with result type elem is computed in: float32 for
    a 16-bit float result with a Python number that the 16-bit type cannot hold (beyond
    its largest value, or below its smallest normal one), as torch's kernels take the
    number unrounded (their opmath type): in half, 1e5 is inf, so ``a * 1e5`` was inf
    where torch gives 11584, and ``a / 1e5`` lost its value. Else elem: a number in
    range rounds by at most half a unit of the last place, and the op stays what kf's
    recognizers read (an attention's ``/ sqrt(d)`` fuses into its kernel)."""
    if elem not in LOW_PRECISION:
        return elem
    info = torch.finfo(torch_dtype(elem))
    for x in xs:
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x != 0 and \
                not info.tiny <= abs(x) <= info.max:
            return "f32"
    return elem


def _rounded(v: ir.Value, elem: str) -> ir.Value:
    return v if spec_of(v.type).elem == elem else kb.cast(v, elem)


def _binary(kf_name: str):
    def handler(c: Converter, node, args, kwargs):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        elem = c.out_elem(node)
        ce = _opmath(elem, a, b) if kf_name == "mul" else elem
        lhs, rhs = c.tensor(a, ce), c.tensor(b, ce)
        if alpha != 1:  # add and sub: ce is elem
            rhs = kb.mul(rhs, c.tensor(alpha, elem))
        return _rounded(getattr(kb, kf_name)(lhs, rhs), elem)

    return handler


for _n, _k in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("maximum", "max"), ("minimum", "min")]:
    HANDLERS[f"aten.{_n}.Tensor"] = _binary(_k)
    HANDLERS[f"aten.{_n}.Scalar"] = _binary(_k)
    HANDLERS[f"aten.{_n}.default"] = _binary(_k)


@handles("aten.div.Tensor", "aten.div.Scalar", "aten.true_divide.Tensor", "aten.div.Tensor_mode")
def _div(c, node, args, kwargs):
    mode = kwargs.get("rounding_mode")
    if mode is not None:
        elem = c.out_elem(node)
        if mode == "trunc" and elem in ("f32", "f64"):
            # torch's rule: a / b in the result's type, then truncated
            return kb.trunc(kb.div(c.tensor(args[0], elem), c.tensor(args[1], elem)))
        if _is_integer(elem):
            return _integer_division(c, args[0], args[1], elem, "trunc" if mode == "trunc" else "floor")
        if mode == "floor" and elem in ("f32", "f64"):
            return _floor_division(c, args[0], args[1], elem)
        _refuse_rounded_16_bit(f"division with rounding_mode={mode!r}", elem)
        raise Unsupported(f"division with rounding_mode={mode!r} is not supported by kf (torch takes "
                          f"'trunc', 'floor' or None)")
    elem = c.out_elem(node)
    ce = _opmath(elem, args[0], args[1])
    return _rounded(kb.div(c.tensor(args[0], ce), c.tensor(args[1], ce)), elem)


def _refuse_rounded_16_bit(what: str, elem: str) -> None:
    if elem in ("f16", "bf16"):
        raise Unsupported(f"{what} of {elem} is not supported by kf",
                          cause="torch's CPU kernel rounds a / b to the 16-bit type before it rounds to an "
                                "integer (35.75 // 0.1426 in bfloat16 is 251), its CUDA kernel does not (250)")


def _float_compute(elem: str) -> str:
    """The type torch computes a float op of elem in: float32 for 16-bit floats."""
    return "f64" if elem == "f64" else "f32"


def _floor(x: ir.Value) -> ir.Value:
    """floor(x) from trunc: one less where trunc rounded a negative x up."""
    t = kb.trunc(x)
    elem = spec_of(x.type).elem
    return kb.select(kb.cmp(t, x, predicate="gt"), kb.sub(t, kb.scalar(1.0, elem)), t)


def _floor_division(c, a, b, elem: str) -> ir.Value:
    """torch's floor division of floats (c10's div_floor_floating): (a - fmod(a, b)) / b,
    one less where the remainder's sign is not b's, rounded to the nearest integer from
    its floor; a signed zero where that is 0, and a / b where b is 0."""
    ce = _float_compute(elem)
    a, b = c.tensor(a, ce), c.tensor(b, ce)
    zero, one = kb.scalar(0.0, ce), kb.scalar(1.0, ce)
    mod = kb.fmod(a, b)
    div = kb.div(kb.sub(a, mod), b)
    other_sign = kb.cmp(kb.cmp(b, zero, predicate="lt"), kb.cmp(mod, zero, predicate="lt"), predicate="ne")
    div = kb.select(kb.select(kb.cmp(mod, zero, predicate="ne"), other_sign, kb.scalar(0.0, "i1")),
                    kb.sub(div, one), div)
    fl = _floor(div)
    fl = kb.select(kb.cmp(kb.sub(div, fl), kb.scalar(0.5, ce), predicate="gt"), kb.add(fl, one), fl)
    quotient = kb.div(a, b)
    signed_zero = kb.select(kb.signbit(quotient), kb.scalar(-0.0, ce), zero)
    out = kb.select(kb.cmp(div, zero, predicate="ne"), fl, signed_zero)
    return c.tensor(kb.select(kb.cmp(b, zero, predicate="eq"), quotient, out), elem)


def _remainder(c, a, b, elem: str) -> ir.Value:
    """torch's remainder of floats: fmod(a, b), plus b where it is not 0 and its sign is
    not b's (the result takes the divisor's sign, as Python's %)."""
    ce = _float_compute(elem)
    a, b = c.tensor(a, ce), c.tensor(b, ce)
    zero = kb.scalar(0.0, ce)
    mod = kb.fmod(a, b)
    other_sign = kb.cmp(kb.cmp(b, zero, predicate="lt"), kb.cmp(mod, zero, predicate="lt"), predicate="ne")
    fix = kb.select(kb.cmp(mod, zero, predicate="ne"), other_sign, kb.scalar(0.0, "i1"))
    return c.tensor(kb.select(fix, kb.add(mod, b), mod), elem)


def _is_integer(elem: str) -> bool:
    return elem in INT_TYPES and elem != "i1"


def integer_bitwise(c, node, a, b, elem: str, kind: str) -> ir.Value:
    """torch's and, or, xor (``kind``) and shifts ("shl", "shr") of integers (kf.bitwise;
    kf-widen-integers computes int8, uint8 and int16 in int32, a uint8 zero-extended, so
    shifted right it is zero-filled, as torch's); Unsupported for floats, as torch."""
    if not _is_integer(elem):
        raise Unsupported(f"{_target_name(node.target)} of {elem} is not supported by kf (torch takes integers)")
    return kb.bitwise(c.tensor(a, elem), c.tensor(b, elem), kind=kind)


_SHIFTS = {"bitwise_left_shift": "shl", "__lshift__": "shl", "bitwise_right_shift": "shr", "__rshift__": "shr"}


@handles(*(f"aten.{name}.{overload}" for name in _SHIFTS for overload in ("Tensor", "Scalar", "Tensor_Scalar",
                                                                           "Scalar_Tensor")))
def _shift(c, node, args, kwargs):
    return integer_bitwise(c, node, args[0], args[1], c.out_elem(node),
                           _SHIFTS[_target_name(node.target).split(".")[1]])


@handles("aten.bitwise_not.default")
def _bitwise_not(c, node, args, kwargs):
    """~x: logical not of booleans, x xor -1 of integers."""
    elem = c.out_elem(node)
    if elem == "i1":
        return kb.cmp(c.tensor(args[0], "i1"), c.tensor(False, "i1"), predicate="eq")
    return integer_bitwise(c, node, args[0], -1, elem, "xor")


def _integer_division(c, a, b, elem: str, kind: str) -> ir.Value:
    """torch's integer division (``kind`` "trunc" or "floor"), remainder ("remainder":
    the divisor's sign, as Python's %) or fmod ("fmod": the dividend's sign), from C's
    truncating kf.div and kf.fmod (kf-widen-integers computes int8, uint8 and int16 in
    int32 and wraps: -128 // -1 in int8 is -128, as in torch). By 0, kf gives a (a
    quotient) or 0 (a remainder): torch raises ZeroDivisionError on the CPU, and CUDA
    leaves the value undefined."""
    a, b = c.tensor(a, elem), c.tensor(b, elem)
    zero = kb.scalar(0, elem)
    if kind == "trunc":
        return kb.div(a, b)
    mod = kb.fmod(a, b)
    if kind == "fmod":
        return mod
    # a remainder whose sign is not the divisor's: floor is one less, remainder b more
    other_sign = kb.cmp(kb.cmp(b, zero, predicate="lt"), kb.cmp(mod, zero, predicate="lt"), predicate="ne")
    fix = kb.select(kb.cmp(mod, zero, predicate="ne"), other_sign, kb.scalar(0, "i1"))
    if kind == "remainder":
        return kb.select(fix, kb.add(mod, b), mod)
    quotient = kb.div(a, b)
    return kb.select(fix, kb.sub(quotient, kb.scalar(1, elem)), quotient)


@handles("aten.fmod.Tensor", "aten.fmod.Scalar", "aten.remainder.Tensor", "aten.remainder.Scalar",
         "aten.remainder.Scalar_Tensor", "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _modulo(c, node, args, kwargs):
    """fmod, remainder and floor division. Floats follow torch's rule from an exact fmod
    (kf.fmod): 1.0 // 0.1 is 9 and fmod(1.0, 0.1) is 0.1 less an ulp, where
    a - b * trunc(a / b) with a rounded quotient gives 10 and 0. Integers take torch's
    integer rule (_integer_division)."""
    elem = c.out_elem(node)
    op = _target_name(node.target).split(".")[1]
    if _is_integer(elem):
        return _integer_division(c, args[0], args[1], elem, "floor" if op == "floor_divide" else op)
    if elem == "i1":
        raise Unsupported(f"{op} of booleans is not supported by kf (torch has none either)")
    a, b = args[0], args[1]
    if op == "fmod":
        ce = _float_compute(elem)
        return c.tensor(kb.fmod(c.tensor(a, ce), c.tensor(b, ce)), elem)
    if op == "remainder":
        return _remainder(c, a, b, elem)
    _refuse_rounded_16_bit(op, elem)
    return _floor_division(c, a, b, elem)


@handles("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(c, node, args, kwargs):
    elem = c.out_elem(node)
    alpha = kwargs.get("alpha", 1)
    a = c.tensor(args[0], elem)
    if alpha != 1:
        a = kb.mul(a, c.tensor(alpha, elem))
    return kb.sub(c.tensor(args[1], elem), a)


@handles("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(c, node, args, kwargs):
    elem = c.out_elem(node)
    base, exp = args
    if isinstance(exp, (int, float)) and not isinstance(exp, bool) and isinstance(base, ir.Value):
        x = c.tensor(base, elem)
        if exp == 2:
            return kb.mul(x, x)
        if exp == 1:
            return x
        if exp == 0.5:
            return kb.sqrt(x)
        if exp == -0.5:
            return kb.rsqrt(x)
        if exp == -1:
            return kb.reciprocal(x)
    return kb.pow(c.tensor(base, elem), c.tensor(exp, elem))


def _unary(kf_name: str, float_result: bool = True):
    def handler(c: Converter, node, args, kwargs):
        elem = c.out_elem(node)
        return getattr(kb, kf_name)(c.tensor(args[0], elem))

    return handler


for _n, _k in [("neg", "neg"), ("abs", "abs"), ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"),
               ("rsqrt", "rsqrt"), ("reciprocal", "reciprocal"), ("tanh", "tanh"), ("erf", "erf"),
               ("sigmoid", "sigmoid"), ("relu", "relu"), ("erfc", "erfc"),
               ("sin", "sin"), ("cos", "cos")]:
    HANDLERS[f"aten.{_n}.default"] = _unary(_k)


@handles("aten.gelu.default")
def _gelu(c, node, args, kwargs):
    approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    return kb.gelu(c.tensor(args[0], c.out_elem(node)), approximate=approx)


@handles("aten.silu.default")
def _silu(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    return kb.mul(x, kb.sigmoid(x))


@handles("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(c, node, args, kwargs):
    elem = c.out_elem(node)
    x = c.tensor(args[0], elem)
    lo = kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    if lo is not None:
        x = kb.max(x, c.tensor(lo, elem))
    if hi is not None:
        x = kb.min(x, c.tensor(hi, elem))
    return x


@handles("aten.clamp_min.default", "aten.clamp_min.Tensor")
def _clamp_min(c, node, args, kwargs):
    elem = c.out_elem(node)
    return kb.max(c.tensor(args[0], elem), c.tensor(args[1], elem))


@handles("aten.clamp_max.default", "aten.clamp_max.Tensor")
def _clamp_max(c, node, args, kwargs):
    elem = c.out_elem(node)
    return kb.min(c.tensor(args[0], elem), c.tensor(args[1], elem))


def _compare(pred: str):
    def handler(c: Converter, node, args, kwargs):
        elem = c.compute_elem(args[0], args[1])
        return kb.cmp(c.tensor(args[0], elem), c.tensor(args[1], elem), predicate=pred)

    return handler


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    HANDLERS[f"aten.{_n}.Scalar"] = _compare(_n)
    HANDLERS[f"aten.{_n}.Tensor"] = _compare(_n)


@handles("aten.logical_not.default")
def _logical_not(c, node, args, kwargs):
    x = c.tensor(args[0], "i1")
    return kb.cmp(x, c.tensor(False, "i1"), predicate="eq")


@handles("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(c, node, args, kwargs):
    elem = c.out_elem(node)
    cond = c.tensor(args[0], "i1")
    return kb.select(cond, c.tensor(args[1], elem), c.tensor(args[2], elem))


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(c, node, args, kwargs):
    x, mask, value = args
    mask = c.tensor(mask, "i1")
    shape = tuple(fake_value(node).shape)
    if shape_of(x) != shape:  # the out-of-place form broadcasts the input to the mask too
        x = kb.broadcast_to(x, shape)
    if isinstance(value, ir.Value):
        return kb.select(mask, c.tensor(value, spec_of(x.type).elem), x)
    return kb.masked_fill(x, mask, value=float(value))


@handles("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
         "aten.type_as.default", "aten._autocast_to_reduced_precision.default",
         "aten._autocast_to_full_precision.default")
def _to(c, node, args, kwargs):
    return c.tensor(args[0], c.out_elem(node))


@handles("aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
         "aten.lift_fresh_copy.default", "aten.lift_fresh.default",
         "aten.detach_.default")  # torch.tensor([...]) detaches its fresh constant in place
def _identity(c, node, args, kwargs):
    return args[0]


# ------------------------------------------------------------------ special values, roundings


def _is_float(x) -> bool:
    return spec_of(x.type).is_float


def _classify(name: str, on_ints: bool, test):
    """isnan / isinf / isfinite / ...: ``test(x)`` on floats; on integers and booleans
    every element gives ``on_ints``."""

    def handler(c: Converter, node, args, kwargs):
        x = args[0]
        if not _is_float(x):
            return kb.fill(spec_of(x.type).shape, "i1", float(on_ints))
        return test(x)

    HANDLERS[f"aten.{name}.default"] = handler


def _inf(x):
    return kb.scalar(float("inf"), spec_of(x.type).elem)


_classify("isnan", False, lambda x: kb.cmp(x, x, predicate="ne"))
_classify("isinf", False, lambda x: kb.cmp(kb.abs(x), _inf(x), predicate="eq"))
_classify("isfinite", True, lambda x: kb.cmp(kb.abs(x), _inf(x), predicate="lt"))  # NaN: false
_classify("isposinf", False, lambda x: kb.cmp(x, _inf(x), predicate="eq"))
_classify("isneginf", False, lambda x: kb.cmp(kb.neg(x), _inf(x), predicate="eq"))


@handles("aten.signbit.default")
def _signbit(c, node, args, kwargs):
    x = args[0]
    elem = spec_of(x.type).elem
    if _is_float(x):
        return kb.signbit(x)
    if elem == "i1":
        return kb.fill(spec_of(x.type).shape, "i1", 0.0)
    return kb.cmp(x, c.tensor(0, elem), predicate="lt")


@handles("aten.sign.default", "aten.sgn.default")
def _sign(c, node, args, kwargs):
    """1, -1 or 0 by the sign of x; NaN gives 0, as torch on the CPU."""
    elem = c.out_elem(node)
    x = c.tensor(args[0], elem)
    if elem == "i1":
        return x
    one, zero = c.tensor(1, elem), c.tensor(0, elem)
    return kb.select(kb.cmp(x, zero, predicate="gt"), one,
                     kb.select(kb.cmp(x, zero, predicate="lt"), c.tensor(-1, elem), zero))


def _rounding(kf_name: str):
    def handler(c: Converter, node, args, kwargs):
        elem = c.out_elem(node)
        x = c.tensor(args[0], elem)
        return getattr(kb, kf_name)(x) if _is_float(x) else x

    return handler


HANDLERS["aten.trunc.default"] = HANDLERS["aten.fix.default"] = _rounding("trunc")
HANDLERS["aten.round.default"] = _rounding("round")


@handles("aten.round.decimals")
def _round_decimals(c, node, args, kwargs):
    """torch's rule: round(x * 10^d) / 10^d for d > 0, round(x / 10^-d) * 10^-d for d < 0."""
    elem = c.out_elem(node)
    x = c.tensor(args[0], elem)
    d = int(kwargs.get("decimals", args[1] if len(args) > 1 else 0))
    if not _is_float(x):
        raise Unsupported(f"round with decimals of a tensor of {elem}: torch rounds floating-point tensors only")
    if d == 0:
        return kb.round(x)
    scale = c.tensor(10.0 ** abs(d), elem)
    if d > 0:
        return kb.div(kb.round(kb.mul(x, scale)), scale)
    return kb.mul(kb.round(kb.div(x, scale)), scale)


@handles("aten.frac.default")
def _frac(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    return kb.sub(x, kb.trunc(x))


@handles("aten.hypot.default")
def _hypot(c, node, args, kwargs):
    """sqrt(x^2 + y^2) without overflow or underflow on the way: m sqrt(1 + (s/m)^2) with
    m = max(|x|, |y|), s the other; 0 where both are 0, inf where either is inf (even
    beside NaN, as C's hypot), NaN where either is NaN otherwise."""
    elem = c.out_elem(node)
    ax, ay = kb.abs(c.tensor(args[0], elem)), kb.abs(c.tensor(args[1], elem))
    m, s = kb.max(ax, ay), kb.min(ax, ay)
    one, zero = c.tensor(1.0, elem), c.tensor(0.0, elem)
    r = kb.div(s, kb.select(kb.cmp(m, zero, predicate="eq"), one, m))
    h = kb.mul(m, kb.sqrt(kb.add(one, kb.mul(r, r))))
    inf = _inf(ax)
    either_inf = kb.cmp(kb.max(kb.select(kb.cmp(ax, ax, predicate="ne"), zero, ax),
                               kb.select(kb.cmp(ay, ay, predicate="ne"), zero, ay)), inf, predicate="eq")
    return kb.select(either_inf, inf, h)


@handles("aten.copysign.Tensor", "aten.copysign.Scalar")
def _copysign(c, node, args, kwargs):
    """|x| with the sign bit of y (-0.0 and negative NaNs count as negative)."""
    elem = c.out_elem(node)
    x, y = c.tensor(args[0], elem), c.tensor(args[1], elem)
    ax = kb.abs(x)
    return kb.select(kb.signbit(y), kb.neg(ax), ax)


def _nan_ignoring(kf_name: str):
    """fmax / fmin: the larger / smaller of x and y, the other where one is NaN (NaN only
    where both are)."""

    def handler(c: Converter, node, args, kwargs):
        elem = c.out_elem(node)
        x, y = c.tensor(args[0], elem), c.tensor(args[1], elem)
        r = getattr(kb, kf_name)(x, y)
        if not _is_float(r):
            return r
        r = kb.select(kb.cmp(y, y, predicate="ne"), x, r)
        return kb.select(kb.cmp(x, x, predicate="ne"), y, r)

    return handler


HANDLERS["aten.fmax.default"] = _nan_ignoring("max")
HANDLERS["aten.fmin.default"] = _nan_ignoring("min")


@handles("aten.angle.default")
def _angle(c, node, args, kwargs):
    """The argument of a real number: pi below 0, 0 from 0 on (-0 too), NaN at NaN."""
    elem = c.out_elem(node)
    x = c.tensor(args[0], elem)
    zero = c.tensor(0.0, elem)
    pi = c.tensor(3.141592653589793, elem)
    r = kb.select(kb.cmp(x, zero, predicate="lt"), pi, kb.broadcast_to(zero, spec_of(x.type).shape))
    return kb.select(kb.cmp(x, x, predicate="ne"), x, r)


@handles("aten.prelu.default")
def _prelu(c, node, args, kwargs):
    """x where it is positive, weight * x elsewhere: weight is one number or one per
    channel (dim 1)."""
    elem = c.out_elem(node)
    x, w = c.tensor(args[0], elem), c.tensor(args[1], elem)
    rank, count = len(shape_of(x)), math.prod(shape_of(w))
    if count == 1:
        w = kb.reshape(w, ())
    elif rank >= 2:
        w = kb.reshape(w, (count,) + (1,) * (rank - 2))
    return kb.select(kb.cmp(x, kb.scalar(0.0, elem), predicate="gt"), x, kb.mul(w, x))
