"""Handlers of elementwise ATen ops: arithmetic with torch's type promotion and
alpha, comparisons, where/masked_fill, unary math, activations, casts."""

from __future__ import annotations

from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import Converter, HANDLERS, handles


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
        raise Unsupported(f"division with rounding_mode={mode!r} is not supported by kf")
    elem = c.out_elem(node)
    return kb.div(c.tensor(args[0], elem), c.tensor(args[1], elem))


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
               ("sigmoid", "sigmoid"), ("relu", "relu")]:
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
