"""kf-widen-integers: arithmetic on int8, uint8 and int16 tensors computed in i32, each
result wrapped to its type where the op makes it.

torch computes on these types as C does: the operands are promoted to int, the result
is truncated when it is stored, so ``127 + 1`` is ``-128`` in int8 and ``255 + 1`` is
``0`` in uint8, and uint8 values are zero-extended (unsigned in comparisons, division,
shifts and casts to float). This pass writes exactly that in kf ops, so that no
lowering computes on a narrow integer:

- every operand of a narrow integer type (``i8``, ``ui8``, ``i16``: ``NARROW_INTS``)
  of a kf op becomes ``cast(x -> i32)`` (one cast per value: sign-extension, or
  zero-extension for ``ui8``);
- every such result is retyped to i32 and followed by ``cast(r -> narrow)`` (the
  wrap: truncation to the low bits), which its users read;
- a ``kf.cast`` between a narrow integer and a type other than i32 goes through i32
  (``f32 -> i32 -> ui8``: torch's conversion of a float to uint8 truncates toward zero
  and wraps, -1.5 is 255), so the only casts left on narrow integers are the
  extensions from and the truncations to i32;
- a ``kf.constant`` of a narrow type becomes an i32 constant and its cast.

What is left of the narrow types is where they are stored: the function's arguments
and results and the kf.casts between them and i32, which the lowerings load
(extending) and store (truncating). Element-moving ops (transpose, slice, gather) move
i32 values between the casts; fusion keeps such chains in one kernel on GPU targets.
Runs first among the kf-level passes on every target, before kf-canonicalize.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects.attrs import from_attr
from kf.dialects.elements import NARROW_INTS
from kf.dialects.types import KfTypeError, elem_or_none, spec_of

from .base import KfPass, PassError, user_functions

#: the type narrow integers are computed in
WIDE = "i32"


def _narrow(v: ir.Value) -> bool:
    return elem_or_none(v) in NARROW_INTS


def _widen_function(f: ir.Operation) -> None:
    block = f.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    wide: dict = {}  # a narrow value -> its cast to i32

    def widened(v: ir.Value, loc: ir.Location) -> ir.Value:
        if v not in wide:
            owner = v.owner
            ip = ir.InsertionPoint.at_block_begin(block) if isinstance(owner, ir.Block) else \
                ir.InsertionPoint.after(owner)
            with ip, loc:
                wide[v] = kb.cast(v, WIDE)
        return wide[v]

    for op in body:
        name = op.name
        if not name.startswith("kf."):
            continue
        if name == "kf.cast":
            src, out = elem_or_none(op.operands[0]), elem_or_none(op.result)
            if (src in NARROW_INTS or out in NARROW_INTS) and WIDE not in (src, out):
                with ir.InsertionPoint(op), op.location:
                    op.operands[0] = kb.cast(op.operands[0], WIDE)
            continue
        if name == "kf.constant" and _narrow(op.result):
            with ir.InsertionPoint(op), op.location:
                values = np.asarray(from_attr(op.attributes["value"])).astype(np.int32)
                shape = list(ir.RankedTensorType(op.result.type).shape)
                attr = ir.DenseElementsAttr.get(np.ascontiguousarray(values.reshape(shape)),
                                                type=ir.IntegerType.get_signless(32))
                new = kb.cast(kb.constant(attr), elem_or_none(op.result))
            op.result.replace_all_uses_with(new)
            op.erase()
            continue
        for i, v in enumerate(op.operands):
            if _narrow(v):
                op.operands[i] = widened(v, op.location)
        for r in op.results:
            if _narrow(r):
                elem = elem_or_none(r)
                r.set_type(ir.RankedTensorType.get(list(ir.RankedTensorType(r.type).shape),
                                                   ir.IntegerType.get_signless(32)))
                with ir.InsertionPoint.after(op), op.location:
                    c = kb.cast(r, elem)
                r.replace_all_uses_except(c, c.owner.operation)


@dataclasses.dataclass(frozen=True)
class WidenIntegersPass(KfPass):
    NAME = "kf-widen-integers"
    DESCRIPTION = "compute int8, uint8 and int16 values in i32, wrapping each result to its type"

    def run(self, module: ir.Operation) -> None:
        for f in user_functions(module):
            try:
                _widen_function(f)
            except KfTypeError as e:
                raise PassError(f"kf-widen-integers: {e}", f.location) from None
