"""IEEE results on Vulkan drivers: float arithmetic with a literal +0.0 operand as compares
and selects of the same value (lavapipe folds x * 0 to 0), float max / min reductions of
vectors as NaN-propagating arith ops (GLSL's FMax drops NaN), and the float-controls
execution modes (SignedZeroInfNanPreserve, DenormPreserve, RoundingModeRTE) on every
entry point for the float widths it has values of."""

from __future__ import annotations

import math
import re

from mlir import ir

from .walk import walk_ops


def _zero_constant(v: ir.Value) -> float | None:
    """+0.0 or -0.0 where v is that constant (a scalar, or a splat or broadcast vector of it)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    if owner.name == "vector.broadcast":
        return _zero_constant(owner.operands[0])
    if owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            return None
        attr = attr.get_splat_value()
    if not isinstance(attr, ir.FloatAttr) or attr.value != 0.0:
        return None
    return attr.value


def shield_zero_operands(gm: ir.Operation) -> None:
    """Rewrite float arithmetic on a literal zero into compares and selects of the same IEEE value.

    Mesa's llvmpipe code generator (gallivm, under lavapipe) returns 0 for ``x * 0``, x for
    ``x + 0`` and ``x / 0`` and 0 for ``0 / x`` when the zero is the constant +0.0 (and
    the driver turns ``x - (-0.0)`` into ``x + 0.0``), whatever the execution modes say:
    inf * 0 became 0 instead of NaN, -0 + 0 stayed -0. The forms below give IEEE's results
    with no arithmetic on a zero, on every driver: ``x * 0`` = NaN where x is not finite,
    else 0 with x's sign; ``x + 0`` and ``x - (-0)`` = 0 where x == 0, else x; ``0 - x`` = 0
    where x == 0, else -x; ``x / 0`` = x * inf; ``0 / x`` = NaN where x is 0 or NaN, else 0
    with x's sign. Arithmetic on -0.0 otherwise is left alone (no driver folds it wrongly)."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    def const(t, value):
        if isinstance(t, ir.VectorType):
            return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, value)))
        return arith.constant(t, value)

    def signed_zero(x):
        return m.copysign(const(x.type, 0.0), x)

    def positive(z):
        return z is not None and math.copysign(1.0, z) > 0

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in ("arith.mulf", "arith.addf", "arith.subf", "arith.divf"):
            continue
        lhs, rhs = op.operands
        zl, zr = _zero_constant(lhs), _zero_constant(rhs)
        if (zl is None) == (zr is None):
            continue
        x = rhs if zl is not None else lhs
        P = arith.CmpFPredicate
        with op.location, ir.InsertionPoint(op):
            if op.name == "arith.mulf" and positive(zl if zl is not None else zr):
                finite = arith.cmpf(P.ONE, m.absf(x), const(x.type, math.inf))
                r = arith.select(finite, signed_zero(x), const(x.type, math.nan))
            elif (op.name == "arith.addf" and positive(zl if zl is not None else zr)) or \
                    (op.name == "arith.subf" and zr is not None and not positive(zr)):
                r = arith.select(arith.cmpf(P.OEQ, x, const(x.type, 0.0)), const(x.type, 0.0), x)
            elif op.name == "arith.subf" and positive(zl):
                r = arith.select(arith.cmpf(P.OEQ, x, const(x.type, 0.0)), const(x.type, 0.0), arith.negf(x))
            elif op.name == "arith.divf" and positive(zr):
                r = arith.mulf(x, const(x.type, math.inf))
            elif op.name == "arith.divf" and positive(zl):
                r = arith.select(arith.cmpf(P.UEQ, x, const(x.type, 0.0)), const(x.type, math.nan), signed_zero(x))
            else:
                continue
        op.results[0].replace_all_uses_with(r)
        op.erase()


#: SPIR-V float-controls execution mode -> the FLOAT_CONTROLS name (runtime/abi.py) of the
#: device property that allows it, less its width
FLOAT_MODES = {"SignedZeroInfNanPreserve": "preserve", "DenormPreserve": "denorm", "RoundingModeRTE": "rte"}

_FLOAT_WIDTH = re.compile(r"(?<![A-Za-z_])(?:\d+x)?f(16|32|64)\b")


#: vector.reduction kinds upstream lowers to GLSL's FMax / FMin, whose result for a NaN
#: operand is undefined (lavapipe returns the other operand), and the arith op of each
_NAN_REDUCTIONS = {"maximumf": "arith.maximumf", "minimumf": "arith.minimumf"}


def nan_propagating_reductions(gm: ir.Operation) -> None:
    """Each float max / min ``vector.reduction`` becomes a chain of ``arith.maximumf`` /
    ``arith.minimumf`` over its lanes (and its accumulator), which upstream lowers with
    the NaN checks torch's max and min need: a row-wise kernel's reduction of the vectors
    it loads otherwise drops a NaN."""
    from mlir.dialects import arith, vector

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name != "vector.reduction":
            continue
        kind = re.search(r"<(\w+)>", str(op.attributes["kind"])).group(1)
        if kind not in _NAN_REDUCTIONS:
            continue
        combine = arith.maximumf if kind == "maximumf" else arith.minimumf
        source = op.operands[0]
        with op.location, ir.InsertionPoint(op):
            lanes = [vector.extract(source, [], [i]) for i in range(ir.VectorType(source.type).shape[0])]
            if len(op.operands) > 1:
                lanes.append(op.operands[1])
            r = lanes[0]
            for lane in lanes[1:]:
                r = combine(r, lane)
        op.results[0].replace_all_uses_with(r)
        op.erase()


def float_widths(spv: ir.Operation) -> set[int]:
    """The float widths that values of the module have (scalars, vector elements, loads of
    float buffers), whatever op makes them: a kernel of selects and compares on floats
    (``where``, kf's rewrite of ``x + 0``) computes in floats as much as one of FAdds."""
    types = set()
    for op in walk_ops(spv.regions[0].blocks[0]):
        types.update(r.type for r in op.results)
        types.update(v.type for v in op.operands)
    return {int(m) for t in types for m in _FLOAT_WIDTH.findall(str(t))}


def declare_float_controls(spv: ir.Operation, controls: tuple[str, ...]) -> None:
    """Give every entry point the float-controls execution modes that make its results
    torch's, for each float width the module has values of (``float_widths``):

    - ``SignedZeroInfNanPreserve`` always: without it a Vulkan driver may assume no inf,
      NaN or -0.0 (Mesa folds ``x - x`` to 0; NVIDIA may turn ``x == 0 ? 0 : x`` into x
      and ``x > 0 ? x : 0`` into a max that drops NaN). A device without it
      (``preserveN`` not in ``controls``) gets the kernel anyway and the Vulkan launcher
      refuses it, naming the property: kf never runs a kernel whose inf and NaN may differ
      from torch's;
    - ``DenormPreserve`` where the device has it for every such width (``denormN``):
      otherwise a device may flush subnormal inputs and results to zero (NVIDIA's default
      for f32; lavapipe always does), where torch's CPU kernels keep them;
    - ``RoundingModeRTE`` where the device has it for every such width (``rteN``): the
      rounding of conversions (f32 -> f16 at a store) is otherwise the driver's choice,
      where torch rounds to nearest even.

    The modes need SPV_KHR_float_controls (core in Vulkan 1.2)."""
    from mlir.dialects import spirv as spirv_d

    body = spv.regions[0].blocks[0]
    widths = sorted(float_widths(spv))
    modes = ["SignedZeroInfNanPreserve"]
    for mode in ("DenormPreserve", "RoundingModeRTE"):
        if widths and all(f"{FLOAT_MODES[mode]}{w}" in controls for w in widths):
            modes.append(mode)
    i32 = ir.IntegerType.get_signless(32)
    for op in list(body.operations):
        op = op.operation
        if op.name != "spirv.EntryPoint":
            continue
        with op.location:
            for mode in modes:
                attr = ir.Attribute.parse(f"#spirv.execution_mode<{mode}>")
                for w in widths:
                    spirv_d.ExecutionModeOp(op.attributes["fn"], attr, ir.ArrayAttr.get([ir.IntegerAttr.get(i32, w)]),
                                            ip=ir.InsertionPoint(body))


#: SPIR-V arithmetic a driver may contract with another instruction (a * b + c into an fma)
_CONTRACTIBLE = ("spirv.FMul", "spirv.FAdd", "spirv.FSub", "spirv.VectorTimesScalar")


def forbid_contraction(spv: ir.Operation) -> None:
    """Decorate every float multiply, add and subtract ``NoContraction``.

    SPIR-V lets a driver fuse ``a * b + c`` into one fma (one rounding instead of two)
    unless the operations are decorated; NVIDIA's compiler does, lavapipe does not. kf's
    exact expansions (the Payne-Hanek reduction and two-float products of sin/cos,
    Cephes asin/acos in ``expand_math.py``) are only right with each product rounded on
    its own, and torch's CPU kernels round each elementwise op, so every such op is
    decorated: the results are the same on every driver."""
    unit = ir.UnitAttr.get()
    for op in walk_ops(spv.regions[0].blocks[0]):
        if op.name in _CONTRACTIBLE:
            op.attributes["no_contraction"] = unit
