"""kf-to-cpu: from linalg-on-tensors to the LLVM dialect, in kf's calling convention.

Every public ``func.func`` comes out as ``(inputs..., outputs...) -> ()`` on identity-
layout (dense row-major) memrefs, with ``llvm.emit_c_interface`` so that LLVM emits a
``_mlir_ciface_<name>`` entry that takes one pointer to a memref descriptor per argument
(see runtime/cpu.py, which calls it, and runtime/abi.py for the convention).

Destination passing is done on tensors, before bufferization: each input becomes a
memref argument read through ``bufferization.to_tensor restrict``, and each returned
tensor is written into a new output memref argument with
``bufferization.materialize_in_destination``. One-shot bufferization then writes the
producers of the results directly into the caller's buffers where it can
(``eliminate-empty-tensors``) and copies where it cannot (a result that is an input,
or one tensor returned twice); inputs, not being writable, are never clobbered.
The rest is the upstream pipeline: deallocation, linalg to loops (sequential), scf to
cf, math through libm (erf, tanh, ...) and LLVM intrinsics, and bf16 conversions
expanded in integer arithmetic (``arith-expand{include-bf16}``) because the LLVM
backend would otherwise call compiler-rt helpers that a plain ``cc -shared`` may lack.
"""

from __future__ import annotations

import dataclasses

from mlir import ir
from mlir.dialects import arith, bufferization, func, linalg
from mlir.passmanager import PassManager

from .base import KfPass, PassError

BUFFERIZE = (
    "eliminate-empty-tensors, "
    "one-shot-bufferize{bufferize-function-boundaries=1 function-boundary-type-conversion=identity-layout-map}, "
    "buffer-deallocation-pipeline, convert-bufferization-to-memref"
)
TO_LOOPS = (
    "convert-linalg-to-loops, fold-memref-alias-ops, expand-strided-metadata, "
    "lower-affine, convert-scf-to-cf, convert-math-to-funcs, arith-expand{include-bf16=true}, "
    # LLVM intrinsics first (rsqrt has no libm function), libm for the rest (erf, tanh).
    "convert-math-to-llvm, convert-math-to-libm"
)
TO_LLVM = (
    "finalize-memref-to-llvm, convert-func-to-llvm, convert-arith-to-llvm, "
    "convert-cf-to-llvm, convert-index-to-llvm, canonicalize, reconcile-unrealized-casts"
)


def _byte_memref(t: ir.Type) -> ir.Type | None:
    """The i8 twin of a memref of i1 (same shape, layout and memory space), else None."""
    if not isinstance(t, ir.MemRefType) or str(t.element_type) != "i1":
        return None
    return ir.MemRefType.get(list(t.shape), ir.IntegerType.get_signless(8), t.layout, t.memory_space)


def bools_as_bytes(module: ir.Operation) -> None:
    """Store booleans as bytes: every memref of i1 becomes a memref of i8, loads are
    truncated to i1 and stores extended from it.

    torch keeps one bool per byte, and LLVM 22's memref-to-LLVM lowering rejects i1
    stores (it asserts that stored integers are at least 8 bits wide), so this is both
    the ABI of bool tensors and what makes them compile.
    """
    i1, i8 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(8)
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    if (t := _byte_memref(arg.type)) is not None:
                        arg.set_type(t)
        if op.name == "memref.global" and _byte_memref(ir.TypeAttr(op.attributes["type"]).value) is not None:
            raise PassError("kf-to-cpu cannot yet place a bool constant in memory", op.location)
        if op.name == "func.func":
            ft = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            fix = lambda ts: [_byte_memref(t) or t for t in ts]
            op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(fix(ft.inputs), fix(ft.results)))
        for result in op.results:
            if (t := _byte_memref(result.type)) is not None:
                result.set_type(t)
    for op in ops:
        if op.name == "memref.load" and str(op.operands[0].type.element_type) == "i8" \
                and str(op.result.type) == "i1":
            op.result.set_type(i8)
            with ir.InsertionPoint.after(op), op.location:
                narrow = arith.trunci(i1, op.result)
            op.result.replace_all_uses_except(narrow, narrow.owner.operation)
        elif op.name == "memref.store" and str(op.operands[0].type) == "i1":
            with ir.InsertionPoint(op), op.location:
                op.operands[0] = arith.extui(i8, op.operands[0])


def _is_dense(t: ir.Type) -> bool:
    """A memref with the identity layout (dense row-major, no offset)."""
    layout = ir.MemRefType(t).layout
    return isinstance(layout, ir.AffineMapAttr) and ir.AffineMapAttr(layout).value.is_permutation and \
        ir.AffineMapAttr(layout).value == ir.AffineMap.get_identity(ir.MemRefType(t).rank)


def strided_copies_as_loops(module: ir.Operation) -> None:
    """Rewrite each memref.copy between strided (non-dense) memrefs into linalg.copy.

    Upstream lowers a strided memref.copy to a call to ``memrefCopy`` from MLIR's C
    runner utilities, which a standalone shared object does not have; linalg.copy
    becomes plain loops. Dense copies stay memref.copy (they become memcpy).
    """
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "memref.copy":
            continue
        src, dst = op.operands
        if _is_dense(src.type) and _is_dense(dst.type):
            continue
        with ir.InsertionPoint(op), op.location:
            linalg.copy(src, outs=[dst])
        op.erase()


def reject_fp8(module: ir.Operation) -> None:
    """Fail, at the first place one appears, on fp8 tensors.

    LLVM has no fp8 types and LLVM 22's arith-expand expands only bf16, f8E8M0 and
    f4E2M1 conversions, so an extf/truncf of f8E4M3FN or f8E5M2 would reach the LLVM
    translation unconverted. Say so here rather than fail inside the engine.
    """
    def visit(op):
        for v in list(op.operands) + list(op.results):
            if isinstance(v.type, ir.ShapedType) and str(ir.ShapedType(v.type).element_type).startswith("f8"):
                raise PassError(f"the CPU target does not support fp8 tensors yet ({v.type}): LLVM has no "
                                "fp8 type and upstream arith-expand has no expansion for it", op.location)
        return ir.WalkResult.ADVANCE

    module.walk(visit)


def _memref(t: ir.Type) -> ir.Type:
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
        raise PassError(f"kf-to-cpu needs statically shaped tensor arguments and results, got {t}")
    return ir.MemRefType.get(list(t.shape), t.element_type)


def is_public(f: func.FuncOp) -> bool:
    vis = f.attributes["sym_visibility"] if "sym_visibility" in f.attributes else None
    return vis is None or ir.StringAttr(vis).value == "public"


def to_destination_passing(f: ir.Operation) -> None:
    """Rewrite ``(tensors) -> (tensors)`` into ``(input memrefs, output memrefs) -> ()``."""
    blocks = list(f.regions[0].blocks)
    if not blocks:
        return
    if len(blocks) != 1:
        raise PassError("kf-to-cpu expects single-block functions", f.location)
    block = blocks[0]
    ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
    n_in = len(ftype.inputs)
    with f.location:
        in_types = [_memref(t) for t in ftype.inputs]
        out_types = [_memref(t) for t in ftype.results]
        # New memref arguments go after the old tensor ones, which are erased once the
        # to_tensor values have replaced them.
        new_args = [block.add_argument(t, f.location) for t in in_types + out_types]
        with ir.InsertionPoint.at_block_begin(block):
            for old, new, t in zip(list(block.arguments)[:n_in], new_args, ftype.inputs):
                old.replace_all_uses_with(bufferization.to_tensor(t, new, restrict=True))
        for _ in range(n_in):
            block.erase_argument(0)
        ret = block.operations[len(block.operations) - 1]
        outs = list(block.arguments)[n_in:]
        with ir.InsertionPoint(ret):
            for value, dest in zip(list(ret.operands), outs):
                bufferization.materialize_in_destination(None, value, dest, restrict=True, writable=True)
            func.ReturnOp([])
        ret.erase()
        f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(in_types + out_types, []))
        f.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()


@dataclasses.dataclass(frozen=True)
class ToCpuPass(KfPass):
    NAME = "kf-to-cpu"
    DESCRIPTION = "destination-passing style, bufferize, lower linalg on tensors to LLVM"
    #: fuse producer/consumer elementwise generics on tensors before bufferizing
    #: (fewer temporaries and loops); off shows one loop nest per kf op.
    fuse: bool = True

    def pipelines(self) -> tuple[str, str, str]:
        """The upstream passes around the two Python rewrites (copies, then bools)."""
        pre = "canonicalize, linalg-fuse-elementwise-ops, cse, " if self.fuse else "canonicalize, cse, "
        return (f"builtin.module({pre}{BUFFERIZE})", f"builtin.module({TO_LOOPS})", f"builtin.module({TO_LLVM})")

    def run(self, module: ir.Operation) -> None:
        reject_fp8(module)
        for op in module.regions[0].blocks[0].operations:
            op = op.operation  # an OpView's .name is its symbol, an Operation's its kind
            if op.name == "func.func" and is_public(op) and len(op.regions[0].blocks):
                to_destination_passing(op)
        bufferize, to_loops, to_llvm = self.pipelines()
        self._upstream(bufferize, module)
        with module.context, module.location:
            strided_copies_as_loops(module)
        self._upstream(to_loops, module)
        with module.context, module.location:
            bools_as_bytes(module)
        self._upstream(to_llvm, module)

    @staticmethod
    def _upstream(text: str, module: ir.Operation) -> None:
        pm = PassManager.parse(text, context=module.context)
        try:
            pm.run(module)
        except ir.MLIRError as e:
            raise PassError(f"upstream pipeline failed: {e}") from None
