"""Handlers of elementwise ATen ops: arithmetic with torch's type promotion and
alpha, comparisons, where/masked_fill, unary math, activations, casts, and the special
values and roundings (isnan, isinf, isfinite, sign, trunc, frac, round, hypot,
copysign) made of kf ops that every target computes."""

from __future__ import annotations

from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import Converter, HANDLERS, _target_name, fake_value, handles, shape_of


def _binary(kf_name: str):
    def handler(c: Converter, node, args, kwargs):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        elem = c.out_elem(node)
        lhs, rhs = c.tensor(a, elem), c.tensor(b, elem)
        if alpha != 1:
            rhs = kb.mul(rhs, c.tensor(alpha, elem))
        return getattr(kb, kf_name)(lhs, rhs)

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
        if (mode == "trunc" and elem in ("f32", "f64")) or (elem.startswith("i") and elem != "i1"):
            # torch-mlir's lowering is torch's rule here: trunc(a / b) in the result's
            # type, integer division toward zero or toward -inf
            from .. import torch_mlir_import

            return torch_mlir_import.import_op(c, node, _target_name(node.target), args, kwargs)
        why = ("torch rounds a / b computed in float32, kf would round it in the 16-bit type" if mode == "trunc"
               else "torch's floor rounds (a - fmod(a, b)) / b, not floor(a / b): 1.0 // 0.1 is 9")
        raise Unsupported(f"division with rounding_mode={mode!r} of {elem} is not supported by kf ({why})")
    elem = c.out_elem(node)
    return kb.div(c.tensor(args[0], elem), c.tensor(args[1], elem))


@handles("aten.fmod.Tensor", "aten.fmod.Scalar", "aten.remainder.Tensor", "aten.remainder.Scalar",
         "aten.remainder.Scalar_Tensor", "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _modulo(c, node, args, kwargs):
    """Integer fmod, remainder and floor division through torch-mlir's lowering (torch's
    rule for integers). Floating-point ones are refused: torch computes them from an exact
    fmod (1.0 // 0.1 is 9, fmod(1.0, 0.1) is 0.09999999), and the lowering kf would use
    computes a - b * trunc(a / b) with a rounded quotient, which differs from torch's
    result wherever a / b rounds up to an integer."""
    elem = c.out_elem(node)
    if elem.startswith("i") and elem != "i1":
        from .. import torch_mlir_import

        return torch_mlir_import.import_op(c, node, _target_name(node.target), args, kwargs)
    op = _target_name(node.target).split(".")[1]
    raise Unsupported(f"{op} of {elem} is not supported by kf: torch computes it from an exact fmod "
                      f"(1.0 // 0.1 is 9 and fmod(1.0, 0.1) is 0.1 less an ulp), which kf has no kernel for; "
                      f"compute it outside the kf function, or on integer tensors")


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
