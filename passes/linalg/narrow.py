"""torch-mlir's functions (the ATen ops kf has no op for) on bf16/f16: computed in f32 and
rounded where they return (``compute_in_f32``), as torch's CPU kernels do."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from .. import scalar_math as sm
from .build import map_elements, shape_of


#: ops whose bf16/f16 results and region arguments may simply become f32: arithmetic, math,
#: structure and data movement, none of whose meaning depends on the float width
_RETYPED_OPS = frozenset({
    "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "arith.negf", "arith.maximumf",
    "arith.minimumf", "arith.maxnumf", "arith.minnumf", "arith.select", "arith.cmpf", "arith.fptosi",
    "arith.fptoui", "linalg.generic", "linalg.yield", "linalg.index", "tensor.empty", "tensor.extract",
    "tensor.insert", "tensor.extract_slice", "tensor.insert_slice", "tensor.collapse_shape",
    "tensor.expand_shape", "tensor.cast", "tensor.pad", "tensor.concat", "tensor.from_elements",
    "tensor.splat", "tensor.reshape", "tensor.yield", "scf.for", "scf.if", "scf.yield", "scf.while",
    "scf.condition"})


NARROW_FLOATS = ("bf16", "f16")


def _narrow(t: ir.Type) -> bool:
    elem = ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t
    return str(elem) in NARROW_FLOATS


def _widened_type(t: ir.Type) -> ir.Type:
    f32 = ir.F32Type.get()
    if isinstance(t, ir.RankedTensorType):
        return ir.RankedTensorType.get(t.shape, f32, t.encoding)
    return f32


def _convert_value(v: ir.Value, to: ir.Type) -> ir.Value:
    """v (a scalar or a ranked tensor) with its elements converted to to's element type."""
    if isinstance(to, ir.RankedTensorType):
        return map_elements([v], shape_of(v), to.element_type, lambda a: sm.convert(a[0], to.element_type))
    return sm.convert(v, to)


def compute_in_f32(func_op: ir.Operation) -> None:
    """Make a torch-mlir function of one ATen op compute bf16/f16 in f32 and round once,
    where it returns, as torch's CPU kernels do (bf16/f16 math and accumulation in float).

    torch-mlir lowers an op on bf16 tensors to linalg on bf16: every add of a sum rounds to
    bf16 (avg_pool2d, sum_to_size, bilinear's contractions), expm1 is computed in bf16.
    Here named linalg ops become generics, and every value of bf16/f16 type (scalars and
    tensors: results, region arguments, constants) becomes f32 where its op's meaning does
    not depend on the width (``_RETYPED_OPS``); the function's arguments are extended at
    its entry and its results rounded at its return; an op outside that list (a bitcast,
    an int-to-float conversion, an explicit truncf) keeps its narrow type and is converted
    at its edges, so the roundings torch-mlir asks for stay."""
    _run_on(func_op, "func.func(linalg-generalize-named-ops)")
    entry = func_op.regions[0].blocks[0]
    original: dict = {}  # widened value -> its narrow type

    def widen_in_place(v: ir.Value) -> None:
        if _narrow(v.type):
            original[v] = v.type
            v.set_type(_widened_type(v.type))

    def extend_after(v: ir.Value, ip: ir.InsertionPoint) -> None:
        with ip:
            wide = _convert_value(v, _widened_type(v.type))
        v.replace_all_uses_except(wide, _generic_of(wide))
        original[wide] = v.type

    with func_op.context, func_op.location:
        ops = _ops_of(entry)  # before any conversion is inserted: those are not revisited
        for a in list(entry.arguments):
            if _narrow(a.type):
                extend_after(a, ir.InsertionPoint.at_block_begin(entry))
        for op in ops:
            name = op.name
            with op.location:
                if name == "arith.constant" and _narrow(op.results[0].type):
                    _widen_constant(op, original)
                    continue
                if name == "arith.extf" and op.operands[0] in original:
                    if str(op.results[0].type) == "f32":
                        op.results[0].replace_all_uses_with(op.operands[0])
                        op.erase()
                    continue
                if name in _RETYPED_OPS or name.startswith("math."):
                    for r in op.results:
                        widen_in_place(r)
                    for region in op.regions:
                        for block in region.blocks:
                            for a in block.arguments:
                                widen_in_place(a)
                    continue
                # kept as it is: narrow operands rounded back before it, narrow results extended after it
                for i, v in enumerate(list(op.operands)):
                    if v in original:
                        with ir.InsertionPoint(op):
                            op.operands[i] = _convert_value(v, original[v])
                for r in op.results:
                    if _narrow(r.type) and list(r.uses):
                        extend_after(r, ir.InsertionPoint.after(op))


def _generic_of(v: ir.Value) -> ir.Operation:
    """The op that made v (the conversion whose own use of the converted value stays)."""
    owner = v.owner
    return getattr(owner, "operation", owner)


def _widen_constant(op: ir.Operation, original: dict) -> None:
    """A bf16/f16 constant as the f32 constant of the same values (each is exactly an f32)."""
    result = op.results[0]
    narrow_t = result.type
    attr = op.attributes["value"]
    wide_t = _widened_type(narrow_t)
    with ir.InsertionPoint(op):
        if isinstance(attr, ir.FloatAttr):
            new = arith.constant(wide_t, ir.FloatAttr.get(wide_t, attr.value))
        elif isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
            value = ir.FloatAttr(attr.get_splat_value()).value
            new = arith.constant(wide_t, ir.DenseElementsAttr.get_splat(wide_t, ir.FloatAttr.get(ir.F32Type.get(),
                                                                                              value)))
        else:  # a dense constant of many values: converted where it stands
            new = None
    if new is None:
        with ir.InsertionPoint.after(op):
            new = _convert_value(result, wide_t)
        result.replace_all_uses_except(new, _generic_of(new))
    else:
        result.replace_all_uses_with(new)
        op.erase()
    original[new] = narrow_t


def _ops_of(block: ir.Block) -> list[ir.Operation]:
    """Every op in block and the regions under it, parents before children (a snapshot)."""
    out = []
    for op in block.operations:
        out.append(op.operation)
        for region in op.operation.regions:
            for b in region.blocks:
                out.extend(_ops_of(b))
    return out


def _run_on(op: ir.Operation, pipeline: str) -> None:
    from mlir.passmanager import PassManager

    PassManager.parse(pipeline, context=op.context).run(op)
