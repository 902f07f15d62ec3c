"""Semantic verification of kf ops: the shape and element-type rules of ``ops.py``
applied to IR that was parsed or built."""

from __future__ import annotations

from typing import Iterator

from mlir import ir

from .attrs import op_attrs
from .ops import BY_NAME
from .types import KfTypeError, spec_of


def verify_op(op: ir.Operation) -> str | None:
    """The reason a kf op is ill-typed, or None when it is fine (or not a kf op)."""
    spec = BY_NAME.get(op.name)
    if spec is None:
        return None
    try:
        attrs = op_attrs(op)
        for name in spec.attrs:
            if name not in attrs:
                return f"needs the attribute '{name}'"
        operands = [spec_of(v.type) for v in op.operands]
        results = [spec_of(r.type) for r in op.results]
        expected = spec.infer(operands, attrs, results)
    except KfTypeError as e:
        return str(e)
    for i, (want, got) in enumerate(zip(expected, results)):
        if want != got:
            return f"result #{i} has type {got}, but the operands give {want}"
    return None


def kf_ops(root: ir.Operation) -> Iterator[ir.Operation]:
    """Every kf op nested in root, in pre-order."""
    found: list[ir.Operation] = []

    def visit(op):
        if op.name.startswith("kf."):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    return iter(found)


def verify(root: ir.Operation) -> list[tuple[ir.Location, str]]:
    """All semantic errors under root, as (location, message) pairs, in IR order."""
    errors = []
    for op in kf_ops(root):
        reason = verify_op(op)
        if reason is not None:
            errors.append((op.location, f"'{op.name}' op {reason}"))
    return errors
