"""kf-to-spirv's rewrites of memory before upstream's conversion: address spaces as
SPIR-V storage classes, attributions and workgroup allocas as allocs, bf16 buffers as
i16 storage, 1-D vector loads and stores as scalar ones (Vulkan's logical addressing);
and what a kernel's workgroup memory takes."""

from __future__ import annotations

import math

from mlir import ir

from ..base import PassError
from .walk import walk_blocks, walk_ops


ELEM_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1}


def elem_name(t: ir.Type) -> str:
    return str(t)


def memory_space(t: ir.MemRefType) -> str:
    ms = t.memory_space
    return "" if ms is None else str(ms)


_SPACE_MAP = {"#gpu.address_space<workgroup>": "#spirv.storage_class<Workgroup>",
              "#gpu.address_space<private>": "#spirv.storage_class<Function>",
              "#gpu.address_space<global>": "", "3": "#spirv.storage_class<Workgroup>"}


def _retype(t: ir.Type) -> ir.Type:
    """The memref type convert-gpu-to-spirv can take: storage class spaces, bf16 as i16."""
    if not isinstance(t, ir.MemRefType):
        return t
    space = memory_space(t)
    new_space = _SPACE_MAP.get(space, space)
    elem = t.element_type
    new_elem = ir.IntegerType.get_signless(16) if isinstance(elem, ir.BF16Type) else elem
    if new_space == space and new_elem == elem:
        return t
    ms = ir.Attribute.parse(new_space) if new_space else None
    return ir.MemRefType.get(t.shape, new_elem, t.layout, ms)


def is_workgroup(t: ir.Type) -> bool:
    return isinstance(t, ir.MemRefType) and memory_space(t) in (
        "#gpu.address_space<workgroup>", "#spirv.storage_class<Workgroup>", "3")


def workgroup_bytes(func: ir.Operation) -> int:
    total = 0
    seen = set()
    entry = func.regions[0].blocks[0]
    for a in list(entry.arguments):
        if is_workgroup(a.type):
            total += math.prod(a.type.shape) * ELEM_BYTES.get(str(a.type.element_type), 4)
    for op in walk_ops(entry):
        if op.name in ("memref.alloc", "memref.alloca") and is_workgroup(op.results[0].type):
            t = op.results[0].type
            if id(op) not in seen:
                seen.add(id(op))
                total += math.prod(t.shape) * ELEM_BYTES.get(str(t.element_type), 4)
    return total


def mentions_bf16(gm: ir.Operation) -> bool:
    for b in walk_blocks(gm):
        for a in b.arguments:
            if "bf16" in str(a.type):
                return True
        for op in b.operations:
            if any("bf16" in str(r.type) for r in op.operation.results):
                return True
    return False


def rewrite_memory(gm: ir.Operation) -> None:
    """Step 2 of the module docstring: attributions, workgroup allocas, address spaces, bf16."""
    from mlir.dialects import arith, memref

    with gm.location:
        _rewrite_memory_at(gm, arith, memref)


def _rewrite_memory_at(gm: ir.Operation, arith, memref) -> None:
    i16, bf16 = ir.IntegerType.get_signless(16), ir.BF16Type.get()
    for func in [o.operation for o in gm.regions[0].blocks[0].operations if o.operation.name == "gpu.func"]:
        entry = func.regions[0].blocks[0]
        n_inputs = len(ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs)
        n_wg = ir.IntegerAttr(func.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in func.attributes else 0
        n_attr = len(entry.arguments) - n_inputs
        with func.location:
            for k in range(n_attr):
                arg = entry.arguments[n_inputs + k]
                t = _retype(arg.type)
                ip = ir.InsertionPoint.at_block_begin(entry)
                # private attributions live in Function storage: alloca; workgroup ones need alloc
                new = memref.AllocOp(t, [], [], ip=ip) if k < n_wg else memref.AllocaOp(t, [], [], ip=ip)
                arg.replace_all_uses_with(new.result)
            for k in reversed(range(n_attr)):
                entry.erase_argument(n_inputs + k)
            if n_attr:
                func.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
        for op in walk_ops(entry):
            if op.name == "memref.alloca" and is_workgroup(op.results[0].type):
                with op.location:
                    new = memref.AllocOp(op.results[0].type, [], [], ip=ir.InsertionPoint(op))
                op.results[0].replace_all_uses_with(new.result)
                op.erase()
        # Retype every memref value; remember bf16 loads and stores to patch afterwards.
        for b in walk_blocks(func):
            for a in b.arguments:
                nt = _retype(a.type)
                if nt != a.type:
                    a.set_type(nt)
        patch = []
        for op in walk_ops(entry):
            for r in op.results:
                nt = _retype(r.type)
                if nt != r.type:
                    r.set_type(nt)
            if op.name in ("memref.load", "memref.store"):
                patch.append(op)
            elif op.name.startswith("vector.") and any("bf16" in str(v.type) for v in op.operands):
                raise PassError(f"{op.name} on bf16 is not supported by kf-to-spirv: load scalars", op.location)
        ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        func.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([_retype(t) for t in ftype.inputs], list(ftype.results)))
        for op in patch:
            with op.location:
                if op.name == "memref.load" and isinstance(op.results[0].type, ir.BF16Type):
                    res = op.results[0]
                    res.set_type(i16)
                    bc = arith.BitcastOp(bf16, res, ip=ir.InsertionPoint(op))
                    bc.operation.move_after(op)
                    res.replace_all_uses_except(bc.result, bc.operation)
                elif op.name == "memref.store" and isinstance(op.operands[0].type, ir.BF16Type):
                    bc = arith.BitcastOp(i16, op.operands[0], ip=ir.InsertionPoint(op))
                    op.operands[0] = bc.result


def scalarize_vector_memory(gm: ir.Operation) -> None:
    """``vector.load/store`` of ``vector<N x T>`` on a memref of T -> N scalar accesses.

    Upstream lowers them to a bitcast of a ``T`` pointer to a ``vector<N x T>`` pointer,
    which Vulkan's logical addressing forbids (spirv-val: "is not a logical pointer").
    The arithmetic stays vectorized; the driver's compiler may merge the adjacent scalar
    accesses. (128-bit accesses need memrefs of vectors: later work.)"""
    from mlir.dialects import arith, memref, vector

    for op in walk_ops(gm.regions[0].blocks[0]):
        if op.name not in ("vector.load", "vector.store"):
            continue
        is_load = op.name == "vector.load"
        vtype = ir.VectorType(op.results[0].type if is_load else op.operands[0].type)
        mem = op.operands[0] if is_load else op.operands[1]
        indices = list(op.operands)[1:] if is_load else list(op.operands)[2:]
        if vtype.rank != 1 or vtype.scalable or not indices:
            raise PassError(f"{op.name} of {vtype} is not supported by kf-to-spirv (1-D fixed vectors only)",
                            op.location)
        with op.location:
            ip = ir.InsertionPoint(op)
            index = ir.IndexType.get()
            idx = []
            for k in range(vtype.shape[0]):
                if k == 0:
                    idx.append(indices[-1])
                else:
                    c = arith.ConstantOp(index, ir.IntegerAttr.get(index, k), ip=ip)
                    idx.append(arith.AddIOp(indices[-1], c.result, ip=ip).result)
            if is_load:
                elems = [memref.LoadOp(mem, indices[:-1] + [i], ip=ip).result for i in idx]
                new = vector.FromElementsOp(vtype, elems, ip=ip)
                op.results[0].replace_all_uses_with(new.result)
            else:
                for k, i in enumerate(idx):
                    e = vector.ExtractOp(op.operands[0], [], [k], ip=ip)
                    memref.StoreOp(e.result, mem, indices[:-1] + [i], ip=ip)
        op.erase()
