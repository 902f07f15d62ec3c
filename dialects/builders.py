"""Python builders for kf ops: ``add(a, b)`` returns the result value, with its type
inferred by the op's rule, so no one writes generic op syntax by hand.

Builders insert at the current ``ir.InsertionPoint`` with the current (or given)
location, like the upstream generated builders. A rule violation raises
``KfTypeError`` before any op is created.
"""

from __future__ import annotations

from typing import Any, Sequence

from mlir import ir

from .attrs import to_attr
from .ops import ATTR_DEFAULTS, BY_NAME
from .types import TensorSpec, mlir_type, spec_of


def build(
    name: str,
    operands: Sequence[ir.Value],
    attrs: dict[str, Any] | None = None,
    result_types: Sequence[TensorSpec] | None = None,
    loc: ir.Location | None = None,
) -> ir.Operation:
    """Create the kf op ``name`` (with or without the ``kf.`` prefix)."""
    spec = BY_NAME["kf." + name.removeprefix("kf.")]
    # what the op defines: discardable attributes (``kf.sizes_from``: dotted names) are
    # not part of it, and a rebuilt op goes without them
    attrs = {k: v for k, v in (attrs or {}).items() if v is not None and "." not in k}
    unknown = set(attrs) - set(spec.attrs)
    if unknown:
        raise TypeError(f"{spec.full_name} has no attribute {', '.join(sorted(unknown))}")
    for name in spec.attrs:
        if name not in attrs and name in ATTR_DEFAULTS:
            attrs[name] = ATTR_DEFAULTS[name]
    results = spec.infer([spec_of(v.type) for v in operands], attrs, list(result_types or []))
    return ir.Operation.create(
        spec.full_name,
        results=[mlir_type(r) for r in results],
        operands=list(operands),
        attributes={k: to_attr(spec.attrs[k], v) for k, v in attrs.items()},
        loc=loc,
    )


def _one(name: str):
    def builder(*operands: ir.Value, loc: ir.Location | None = None, **attrs: Any) -> ir.Value:
        return build(name, operands, attrs, loc=loc).result

    spec = BY_NAME["kf." + name]
    builder.__name__ = name
    builder.__doc__ = f"kf.{name}: {spec.summary}."
    return builder


_GENERIC = [
    "add", "sub", "mul", "div", "pow", "fmod", "max", "min", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "reciprocal", "tanh", "erf", "erfc", "sin", "cos", "trunc", "round", "signbit", "sigmoid", "relu", "gelu", "cmp", "bitwise", "select",
    "masked_fill", "mean", "reduce_max", "reduce_min", "var", "logsumexp", "argmax", "softmax", "log_softmax", "matmul",
    "transpose", "slice", "gather", "index_select", "index_add", "scatter_add",
]
globals().update({name: _one(name) for name in _GENERIC})


def sum(x: ir.Value, *, dims: Sequence[int], keepdim: bool = False, elem: str | None = None,
        loc: ir.Location | None = None) -> ir.Value:
    """kf.sum over dims; ``elem`` gives the result element type when it differs (bool sums)."""
    result = [spec_of(x.type).with_elem(elem)] if elem else None
    return build("sum", [x], {"dims": dims, "keepdim": keepdim}, result, loc).result


def concat(xs: Sequence[ir.Value], *, dim: int, loc: ir.Location | None = None) -> ir.Value:
    """xs joined along dim: one kf.concat for two tensors, a left-leaning chain for more;
    tensors with nothing along dim are left out (they add nothing, and a slice of size 0
    at the end of the result is out of bounds for tensor.insert_slice)."""
    if not xs:
        raise ValueError("concat needs at least one tensor")
    rank = spec_of(xs[0].type).rank
    if rank:
        xs = [x for x in xs if spec_of(x.type).shape[dim % rank]] or list(xs[:1])
    out = xs[0]
    for x in xs[1:]:
        out = build("concat", [out, x], {"dim": dim}, loc=loc).result
    return out


def topk(x: ir.Value, *, k: int, dim: int = -1, largest: bool = True,
         loc: ir.Location | None = None) -> tuple[ir.Value, ir.Value]:
    """kf.topk: (values, indices) of the k largest elements along dim."""
    op = build("topk", [x], {"k": k, "dim": dim, "largest": largest}, loc=loc)
    return op.results[0], op.results[1]


def reshape(x: ir.Value, shape: Sequence[int], *, loc: ir.Location | None = None) -> ir.Value:
    """kf.reshape of x to shape."""
    return build("reshape", [x], None, [spec_of(x.type).with_shape(shape)], loc).result


def broadcast_to(x: ir.Value, shape: Sequence[int], *, loc: ir.Location | None = None) -> ir.Value:
    """kf.broadcast_to: x expanded to shape."""
    return build("broadcast_to", [x], None, [spec_of(x.type).with_shape(shape)], loc).result


def cast(x: ir.Value, elem: str, *, loc: ir.Location | None = None) -> ir.Value:
    """kf.cast of x to element type elem."""
    return build("cast", [x], None, [spec_of(x.type).with_elem(elem)], loc).result


def fill(shape: Sequence[int], elem: str, value: float, *, loc: ir.Location | None = None) -> ir.Value:
    """kf.fill: a tensor of shape and elem with every element equal to value."""
    return build("fill", [], {"value": value}, [TensorSpec(tuple(shape), elem)], loc).result


def iota(shape: Sequence[int], dim: int, elem: str = "i64", *, loc: ir.Location | None = None) -> ir.Value:
    """kf.iota: a tensor of shape whose element at index (.., i_dim, ..) is i_dim."""
    return build("iota", [], {"dim": dim}, [TensorSpec(tuple(shape), elem)], loc).result


def constant(value: ir.Attribute, *, loc: ir.Location | None = None) -> ir.Value:
    """kf.constant holding a dense elements attribute."""
    spec = spec_of(value.type)
    return build("constant", [], {"value": value}, [spec], loc).result


def scalar(value: float, elem: str, *, loc: ir.Location | None = None) -> ir.Value:
    """A rank-0 kf.fill: how Python numbers in torch code enter kf IR."""
    return fill((), elem, value, loc=loc)


def rand(state: ir.Value, shape: Sequence[int], *, offset: int, distribution: str = "uniform",
         loc: ir.Location | None = None) -> ir.Value:
    """kf.rand: f32 samples of shape from the random state (tensor<2xi64>), Philox blocks from offset."""
    return build("rand", [state], {"offset": offset, "distribution": distribution},
                 [TensorSpec(tuple(shape), "f32")], loc).result
