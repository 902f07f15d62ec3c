"""Conversions between Python values and the MLIR attributes kf ops carry."""

from __future__ import annotations

from typing import Any

from mlir import ir


def to_attr(kind: str, value: Any) -> ir.Attribute:
    """The MLIR attribute for a Python value of the given kind (see ops.ATTR_BASES)."""
    if isinstance(value, ir.Attribute):
        return value
    if kind == "i64_array":
        return ir.DenseI64ArrayAttr.get([int(v) for v in value])
    if kind == "bool":
        return ir.BoolAttr.get(bool(value))
    if kind == "int":
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))
    if kind == "float":
        return ir.FloatAttr.get_f64(float(value))
    if kind == "str":
        return ir.StringAttr.get(str(value))
    raise TypeError(f"cannot make a {kind} attribute from {value!r}")


def from_attr(attr: ir.Attribute) -> Any:
    """The Python value of an attribute: lists, ints, bools, floats, strings; other
    attributes (dense elements) are returned as they are."""
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(attr)
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, ir.StringAttr):
        return attr.value
    return attr


def op_attrs(op: ir.Operation) -> dict[str, Any]:
    """All attributes of an op as Python values."""
    attributes = op.attributes
    return {name: from_attr(attributes[name]) for name in attributes}


#: On an op without operands (kf.iota, kf.fill) whose result has run-time sizes: for each
#: dim of the result, the enclosing function's argument and dim whose size it has, or
#: -1, -1 where static. Set where run-time sizes are captured (compiler/dynamic.py), kept
#: by kf-canonicalize's rewrites of such ops, read by kf-lower-to-linalg.
SIZES_FROM = "kf.sizes_from"


def sizes_from(op: ir.Operation) -> list[tuple[int, int]] | None:
    """An op's SIZES_FROM as (argument, dim) pairs, one per result dim; None if unset."""
    if SIZES_FROM not in op.attributes:
        return None
    flat = list(ir.DenseI64ArrayAttr(op.attributes[SIZES_FROM]))
    return list(zip(flat[0::2], flat[1::2]))


def set_sizes_from(op: ir.Operation, pairs: list[tuple[int, int]]) -> None:
    op.attributes[SIZES_FROM] = ir.DenseI64ArrayAttr.get([k for p in pairs for k in p])
