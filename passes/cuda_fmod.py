"""arith.remf on the CUDA target as calls of libdevice's exact fmod.

LLVM's NVPTX back end lowers ``frem`` as x - y * trunc(x / y) with an approximate
division (``div.approx.f32``): fmod(1.0, 0.1) comes out 0, and 1.0 // 0.1 as 10 in the
floor division kf builds on it, where torch gives 0.1 less an ulp and 9. Upstream's
convert-gpu-to-nvvm has no pattern for arith.remf. libdevice's ``__nv_fmodf`` and
``__nv_fmod`` are exact (CUDA's fmodf: 0 ulp), and ``gpu-module-to-binary`` links
libdevice where a kernel calls one of its functions. 16-bit floats are computed in f32
(the remainder of two f16 values is an f16 value); vectors per element.
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, func, vector

#: libdevice's fmod by operand width
_LIBDEVICE = {32: "__nv_fmodf", 64: "__nv_fmod"}


def _declare(gpu_module: ir.Operation, name: str, t: ir.Type) -> None:
    body = gpu_module.regions[0].blocks[0]
    for op in body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            return
    with ir.InsertionPoint.at_block_begin(body), ir.Location.unknown():
        f = func.FuncOp(name, ir.FunctionType.get([t, t], [t]))
        f.sym_visibility = ir.StringAttr.get("private")


def _scalar_fmod(gpu_module: ir.Operation, x: ir.Value, y: ir.Value) -> ir.Value:
    t = x.type
    width = ir.FloatType(t).width
    if width < 32:
        f32 = ir.F32Type.get()
        wide = _scalar_fmod(gpu_module, arith.extf(f32, x), arith.extf(f32, y))
        return arith.truncf(t, wide)
    name = _LIBDEVICE[width]
    _declare(gpu_module, name, t)
    return func.call([t], ir.FlatSymbolRefAttr.get(name), [x, y])


def lower_fmod(gpu_module: ir.Operation) -> None:
    """Replace every arith.remf in the gpu.module's kernels by libdevice's fmod."""
    found: list[ir.Operation] = []

    def visit(op):
        if op.name == "arith.remf":
            found.append(op)
        return ir.WalkResult.ADVANCE

    gpu_module.walk(visit)
    for op in found:
        x, y = op.operands[0], op.operands[1]
        with op.location, ir.InsertionPoint(op):
            if isinstance(x.type, ir.VectorType):
                vt = ir.VectorType(x.type)
                n = math.prod(vt.shape)
                flat_t = ir.VectorType.get([n], vt.element_type)
                if vt.rank != 1:
                    x, y = vector.shape_cast(flat_t, x), vector.shape_cast(flat_t, y)
                parts = [_scalar_fmod(gpu_module, vector.extract(x, [], [i]), vector.extract(y, [], [i]))
                         for i in range(n)]
                flat = vector.from_elements(flat_t, parts)
                r = flat if vt.rank == 1 else vector.shape_cast(vt, flat)
            else:
                r = _scalar_fmod(gpu_module, x, y)
        op.results[0].replace_all_uses_with(r)
        op.erase()
