"""Negative padding in torch-mlir's functions, as a crop then a pad.

torch-mlir lowers ``F.pad`` / ``constant_pad_nd`` with negative amounts (which crop the
input) to a ``tensor.pad`` with negative ``low``/``high``, which bufferization refuses
on every target (negative offsets). ``crop_negative_padding``, run on each function as it
is imported, makes
each such pad an ``extract_slice`` of what is kept followed by a pad of the non-negative
amounts only: the same tensor."""

from __future__ import annotations

from mlir import ir

from .build import extract_slice


def crop_negative_padding(op: ir.Operation) -> None:
    """Rewrite every statically sized ``tensor.pad`` under op that has a negative low or
    high amount."""
    pads: list[ir.Operation] = []
    op.walk(lambda o: (pads.append(o.operation) if o.name == "tensor.pad" else None) or ir.WalkResult.ADVANCE)
    dyn = ir.ShapedType.get_dynamic_size()
    for pad in pads:
        low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
        high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
        src = pad.operands[0]
        shape = list(ir.RankedTensorType(src.type).shape)
        if min(low + high) >= 0 or dyn in low + high + shape:
            continue
        kept = [n - max(0, -lo) - max(0, -hi) for n, lo, hi in zip(shape, low, high)]
        if min(kept) < 0:
            continue  # cropping more than the tensor has: left to the pad's own checks
        with ir.InsertionPoint(pad), pad.location:
            sliced = extract_slice(src, [max(0, -lo) for lo in low], kept)
        pad.operands[0] = sliced
        pad.attributes["static_low"] = ir.DenseI64ArrayAttr.get([max(0, lo) for lo in low])
        pad.attributes["static_high"] = ir.DenseI64ArrayAttr.get([max(0, hi) for hi in high])
