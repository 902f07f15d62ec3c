"""kf-linalg-to-gpu: GPU kernels for the functions torch-mlir wrote (the ATen ops kf has
no op for), launched in order with the kf kernels.

A ``func.call`` of a function with ``kf.aten`` (linalg on tensors, from
compiler/torch_mlir_import.py) becomes a run of kernel launches in the launch schedule:

1. A copy of the function (bf16/f16 computed in f32, as on the CPU) has its elementwise
   generics fused and its float sums over more than 4096 elements split into stages
   (``to_cpu.blocked_reductions``: a chain's error grows with its length); it is
   bufferized (one-shot, its arguments read-only), its named linalg ops generalized,
   each generic's loops reordered so the parallel ones come first, and lowered to
   ``scf.parallel`` over the parallel loops with ``scf.for`` inside for the reduction
   loops (``convert-linalg-to-parallel-loops``).
2. Each top-level ``scf.parallel`` becomes one ``gpu.func``: its iteration space is
   linearized, one point per thread (grid-stride beyond the target's grid limit), and a
   thread runs the reduction loops of its point sequentially, so no two threads write one
   element. Runs of other top-level ops that write memory (0-d ops, reductions with no
   parallel loop) become one kernel of one thread. Views (subviews, reshapes), constants
   and scalar ops a kernel reads are rebuilt inside it; ``fold-memref-alias-ops`` turns
   the views into index arithmetic on the buffers.
3. Every buffer is a tensor of the schedule: the call's operands, ``kf.constant`` for
   torch-mlir's constants, and for each allocation a ``kf.empty`` declaration's result
   (allocated by the launcher, nothing launched). A kernel's declaration takes the
   buffers it reads or writes and returns a new value for each buffer it writes,
   tied (``kf.tied``: the operand it is) to that operand: the same buffer, written in
   place. The call's results are the last values of the buffers the function returns.

Back-end repairs in the kernels: math.absi, math.fpowi and math.ipowi as arith; on CUDA
boolean buffers as bytes (kf's storage for them there); on SPIR-V f64 scalars in f32
where the kernel has no f64 tensor, and integer floor division (torch-mlir's floor(double(x) / double(y))) as arith.floordivsi.

Not handled (a PassError at the call's location, which the driver reports as a
TargetError at the user's line): dynamic shapes, a value handed from one kernel to the
next as a scalar, a scalar read of a buffer that a later kernel overwrites before its use, and anything the upstream passes refuse. Speed: one
thread a point, reductions sequential in it (a full reduction is one thread); no tiling
or shared memory.
"""

from __future__ import annotations

import dataclasses
import re

from mlir import ir
from mlir.dialects import arith, func, gpu, scf
from mlir.passmanager import PassManager

from .base import KfPass, PassError
from .map_to_gpu import GPU_MODULE
from .strategies import emit as E

#: threads of a workgroup in every kernel this pass writes
BLOCK = 256

#: ops that only name (part of) a buffer: rebuilt inside each kernel that reads through them
_VIEWS = frozenset({"memref.subview", "memref.expand_shape", "memref.collapse_shape", "memref.cast",
                    "memref.reinterpret_cast", "memref.transpose"})

#: ops that make a buffer
_ROOTS = frozenset({"memref.alloc", "memref.alloca", "memref.get_global"})

#: producer/consumer elementwise generics fused on tensors first: one kernel, not one a generic
_FUSE = "builtin.module(canonicalize, linalg-fuse-elementwise-ops, canonicalize)"
_BUFFERIZE = ("builtin.module(eliminate-empty-tensors, cse, one-shot-bufferize{bufferize-function-boundaries=1 "
              "function-boundary-type-conversion=identity-layout-map}, "
              "func.func(linalg-generalize-named-ops))")
_TO_LOOPS = "builtin.module(func.func(convert-linalg-to-parallel-loops))"
_KERNEL_CLEANUP = ("builtin.module(gpu.module(fold-memref-alias-ops, lower-affine, canonicalize, cse, "
                   "fold-memref-alias-ops, lower-affine, canonicalize))")


def _run(text: str, op: ir.Operation, what: str, loc: ir.Location) -> None:
    pm = PassManager.parse(text, context=op.context)
    try:
        pm.run(op)
    except ir.MLIRError as e:
        diag = e.error_diagnostics[0].message if e.error_diagnostics else str(e).splitlines()[0]
        raise PassError(f"{what}: {diag.strip().splitlines()[0][:200]}", loc) from None


def _int_of(v: ir.Value) -> int | None:
    owner = v.owner
    if isinstance(owner, ir.Operation) or hasattr(owner, "name"):
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name == "arith.constant":
            return ir.IntegerAttr(op.attributes["value"]).value
    return None


def _iterators(op: ir.Operation) -> list[str]:
    return [str(a).removeprefix("#linalg.iterator_type<").removesuffix(">")
            for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def _copies_as_linalg(module: ir.Operation) -> None:
    """memref.copy (bufferization's copies) as linalg.copy, which lowers to a parallel loop."""
    from mlir.dialects import linalg

    copies: list[ir.Operation] = []
    module.walk(lambda op: (copies.append(op.operation) if op.name == "memref.copy" else None)
                or ir.WalkResult.ADVANCE)
    for op in copies:
        with ir.InsertionPoint(op), op.location:
            linalg.copy(op.operands[0], outs=[op.operands[1]])
        op.erase()


def _parallel_loops_first(module: ir.Operation) -> None:
    """Reorder each linalg.generic's loops, parallel ones first (stable), so that
    convert-linalg-to-parallel-loops gives one scf.parallel with the reductions inside
    it (a reduction loop outside would launch a kernel per iteration)."""
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "linalg.generic":
            continue
        its = _iterators(op)
        order = [d for d, t in enumerate(its) if t == "parallel"] + [d for d, t in enumerate(its) if t != "parallel"]
        if order == list(range(len(its))):
            continue
        new_pos = [order.index(d) for d in range(len(its))]
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        dims = [ir.AffineDimExpr.get(new_pos[d]) for d in range(len(its))]
        new_maps = []
        for m in maps:
            exprs = [e.compose(ir.AffineMap.get(len(its), 0, dims)) for e in m.results]
            new_maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(len(its), m.n_symbols, exprs)))
        op.attributes["indexing_maps"] = ir.ArrayAttr.get(new_maps)
        op.attributes["iterator_types"] = ir.ArrayAttr.get(
            [ir.Attribute.parse(f"#linalg.iterator_type<{its[d]}>") for d in order])
        for inner in op.regions[0].blocks[0].operations:
            if inner.operation.name == "linalg.index":
                d = ir.IntegerAttr(inner.attributes["dim"]).value
                inner.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), new_pos[d])


def _is_arg(v: ir.Value) -> bool:
    return isinstance(v.owner, ir.Block)


def _root(v: ir.Value) -> ir.Value:
    """The buffer a memref value names: a block argument or an allocation's result."""
    while not _is_arg(v) and v.owner.operation.name in _VIEWS:
        v = v.owner.operands[0]
    return v


def _is_whole_reshape(v: ir.Value) -> bool:
    """Whether v is its buffer, or a reshape of all of it (same elements, same order)."""
    while not _is_arg(v) and v.owner.operation.name in ("memref.expand_shape", "memref.collapse_shape"):
        v = v.owner.operands[0]
    return _is_arg(v) or v.owner.operation.name not in _VIEWS


def _returns_fresh_buffers(f: ir.Operation) -> None:
    """Make each value the function returns a whole allocation of its own (or a reshape
    of one), copying where it is a view, an argument, a constant or returned twice: the
    call's result becomes that buffer."""
    from mlir.dialects import linalg, memref

    entry = f.regions[0].blocks[0]
    ret = entry.operations[len(entry.operations) - 1].operation
    seen = set()
    for i, v in enumerate(list(ret.operands)):
        root = _root(v)
        if (not _is_arg(root) and root.owner.operation.name in ("memref.alloc", "memref.alloca")
                and _is_whole_reshape(v) and root not in seen):
            seen.add(root)
            continue
        with ir.InsertionPoint(ret), ret.location:
            t = ir.MemRefType(v.type)
            fresh = memref.alloc(ir.MemRefType.get(t.shape, t.element_type), [], [])
            linalg.copy(v, outs=[fresh])
        ret.operands[i] = fresh
        seen.add(fresh)


@dataclasses.dataclass
class _Kernel:
    """One launch: the top-level ops it runs (one scf.parallel, or a run of serial ops)."""
    ops: list
    parallel: bool
    position: int  # of its first op among the function's top-level ops


@dataclasses.dataclass(frozen=True)
class LinalgToGpuPass(KfPass):
    NAME = "kf-linalg-to-gpu"
    DESCRIPTION = "GPU kernels for torch-mlir's linalg functions (kf.aten), launched in the schedule"

    target: str = "cuda"

    def run(self, module: ir.Operation) -> None:
        body = module.regions[0].blocks[0]
        callees = {}
        for op in body.operations:
            op = op.operation
            if op.name == "func.func" and "kf.aten" in op.attributes:
                callees[ir.StringAttr(op.attributes["sym_name"]).value] = op
        if not callees:
            return
        calls: list[ir.Operation] = []

        def visit(op):
            if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value in callees:
                calls.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        with module.context, module.location:
            gmod = E.gpu_module(module, GPU_MODULE)
        for n, call in enumerate(calls):
            name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            with module.context, call.location:
                _Translation(self.target, module, gmod, call, callees[name], f"{name}_c{n}").run()
        for f in callees.values():
            f.erase()


class _Translation:
    """One call of a torch-mlir function, written as kernels and launches."""

    def __init__(self, target: str, module: ir.Operation, gmod: ir.Operation, call: ir.Operation,
                 callee: ir.Operation, prefix: str):
        self.target, self.module, self.gmod, self.call, self.callee = target, module, gmod, call, callee
        self.prefix = prefix
        self.loc = call.location
        self.aten = ir.StringAttr(callee.attributes["kf.aten"]).value
        self._returned: dict = {}  # buffer -> the memref type the function returns it as
        self._buffers = 0  # kf.empty declarations made

    def fail(self, message: str):
        raise PassError(f"{self.aten}: {message}", self.loc)

    # ------------------------------------------------------------------ the function as loops

    def lowered(self) -> ir.Module:
        """A copy of the callee in a module of its own, bufferized and lowered to loops."""
        from .linalg.narrow import compute_in_f32
        from .to_cpu import blocked_reductions

        text = self.callee.get_asm(enable_debug_info=True)
        scratch = ir.Module.parse(text)
        f = scratch.body.operations[0].operation
        for key in ("sym_visibility", "kf.aten"):
            if key in f.attributes:
                del f.attributes[key]
        ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        if any(not ir.ShapedType(t).has_static_shape for t in [*ftype.inputs, *ftype.results]
               if isinstance(t, ir.ShapedType)):
            self.fail("its torch-mlir lowering has dynamic shapes")
        f.attributes["arg_attrs"] = ir.ArrayAttr.get(
            [ir.DictAttr.get({"bufferization.writable": ir.BoolAttr.get(False)}) for _ in ftype.inputs])
        compute_in_f32(f)
        _run(_FUSE, scratch.operation, "fusion", self.loc)
        blocked_reductions(scratch.operation)
        _run(_BUFFERIZE, scratch.operation, "bufferization", self.loc)
        f = next(op.operation for op in scratch.body.operations if op.operation.name == "func.func")
        _returns_fresh_buffers(f)
        _copies_as_linalg(scratch.operation)
        _parallel_loops_first(scratch.operation)
        _run(_TO_LOOPS, scratch.operation, "lowering to loops", self.loc)
        return scratch

    # ------------------------------------------------------------------ the kernels

    def run(self) -> None:
        scratch = self.lowered()
        f = next(op.operation for op in scratch.body.operations if op.operation.name == "func.func")
        last = f.regions[0].blocks[0].operations
        for v in last[len(last) - 1].operation.operands:
            t = ir.MemRefType(v.type)
            self._returned[_root(v)] = ir.MemRefType.get(t.shape, t.element_type)
        globals_ = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
                    for op in scratch.body.operations if op.operation.name == "memref.global"}
        entry = f.regions[0].blocks[0]
        top = [op.operation for op in entry.operations]
        ret = top[-1]
        kernels: list[_Kernel] = []
        for i, op in enumerate(top[:-1]):
            if op.name in _ROOTS or op.name in _VIEWS or op.name == "memref.dealloc":
                continue
            if op.name == "scf.parallel":
                kernels.append(_Kernel([op], True, i))
            elif _writes(op):
                if any(list(r.uses) for r in op.results):
                    self.fail(f"its torch-mlir lowering hands a value from one kernel to the next ({op.name})")
                if kernels and not kernels[-1].parallel and kernels[-1].ops[-1] == top[i - 1]:
                    kernels[-1].ops.append(op)
                else:
                    kernels.append(_Kernel([op], False, i))
            elif op.name == "cf.assert":
                cond = op.operands[0]
                if _int_of(cond) not in (1, -1):
                    self.fail("its torch-mlir lowering checks a condition at run time (cf.assert), which the "
                              "GPU targets cannot report")
            elif not len(op.results):
                self.fail(f"its torch-mlir lowering has an op kf-linalg-to-gpu cannot place ({op.name})")
            # else: a scalar op (a constant, a load, arithmetic): rebuilt in the kernels that use it
        scratch_gmod = self._scratch_gpu_module(scratch)
        position = {op: i for i, op in enumerate(top)}
        launches = []
        for k, kern in enumerate(kernels):
            roots, closure = self._closure(kern, position)
            written = set()
            for op in kern.ops:
                _collect_writes(op, written)
            for w in written:
                if _is_arg(w):
                    self.fail("its bufferized form writes into an input")
            self._check_scalar_reads(closure, kern, kernels, position)
            name = f"{self.prefix}_k{k}"
            geometry = self._write_kernel(scratch_gmod, name, kern, roots, closure)
            if geometry is not None:
                launches.append((name, roots, written, geometry))
        for g in scratch_gmod.regions[0].blocks[0].operations:
            _expand_math(g.operation)
        _run(_KERNEL_CLEANUP, scratch.operation, "kernel cleanup", self.loc)
        for g in scratch_gmod.regions[0].blocks[0].operations:
            if self.target == "cuda":
                self._bools_as_bytes(g.operation)
            else:
                self._f64_as_f32(g.operation)
        gbody = self.gmod.regions[0].blocks[0]
        for op in list(scratch_gmod.regions[0].blocks[0].operations):
            op = op.operation
            op.detach_from_parent()
            gbody.append(op)
        self._schedule(launches, ret, globals_)

    def _scratch_gpu_module(self, scratch: ir.Module) -> ir.Operation:
        with ir.InsertionPoint(scratch.body), self.loc:
            gm = gpu.GPUModuleOp(ir.StringAttr.get("scratch"))
            gm.regions[0].blocks.append()
        scratch.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
        return gm.operation

    def _closure(self, kern: _Kernel, position: dict) -> tuple[list[ir.Value], list[ir.Operation]]:
        """The buffers the kernel touches (in first-use order) and the top-level ops
        (views, constants, scalar ops) it reads, in program order."""
        inside: dict = {}
        for op in kern.ops:
            _ops_in(op, inside)
        needed: dict[int, ir.Operation] = {}
        roots: list[ir.Value] = []

        def need(v: ir.Value):
            if _is_arg(v):
                owner = v.owner.owner
                if owner is not None and owner.operation.name == "func.func":
                    if v not in roots:
                        roots.append(v)
                return
            op = v.owner.operation
            if op in inside or op in needed:
                return
            if op.name in _ROOTS:
                if v not in roots:
                    roots.append(v)
                return
            if op not in position:
                return
            needed[op] = op
            for o in op.operands:
                need(o)

        for op in kern.ops:
            for o in _operands_in(op):
                need(o)
        closure = sorted(needed.values(), key=lambda op: position[op])
        return roots, closure

    def _check_scalar_reads(self, closure, kern, kernels, position) -> None:
        """A load rebuilt inside a kernel reads the buffer when the kernel runs: refuse it
        where a kernel between the load and this one writes that buffer."""
        for op in closure:
            if op.name != "memref.load":
                continue
            root = _root(op.operands[0])
            at = position[op]
            for other in kernels:
                if at < other.position < kern.position:
                    w = set()
                    for o in other.ops:
                        _collect_writes(o, w)
                    if root in w:
                        self.fail("its torch-mlir lowering reads a value of a buffer that is overwritten "
                                  "before the value is used")

    def _write_kernel(self, gm: ir.Operation, name: str, kern: _Kernel, roots: list[ir.Value],
                      closure: list[ir.Operation]):
        """The gpu.func of one launch in gm; (grid, block), or None when it has nothing to do."""
        if kern.parallel:
            par = kern.ops[0]
            n = len(par.regions[0].blocks[0].arguments)
            lbs, ubs, steps = (list(par.operands)[j * n:(j + 1) * n] for j in range(3))
            if len(list(par.operands)) != 3 * n or len(par.results):
                self.fail("its loops carry values (scf.parallel with reductions)")
            lb, ub, st = [_int_of(v) for v in lbs], [_int_of(v) for v in ubs], [_int_of(v) for v in steps]
            if None in lb + ub + st:
                self.fail("its loops have bounds known only at run time")
            extents = [max(0, -(-(u - l) // s)) for l, u, s in zip(lb, ub, st)]
            total = 1
            for e in extents:
                total *= e
            if total == 0:
                return None
            grid, stride = E.launch_geometry(total, BLOCK, E.max_grid_x("cuda" if self.target == "cuda" else "spirv"))
            block = BLOCK
        else:
            total, grid, stride, block = 1, 1, False, 1
        types = [self._arg_type(r) for r in roots]
        ftype = ir.FunctionType.get(types, [])
        with ir.InsertionPoint(gm.regions[0].blocks[0]), self.loc:
            g = gpu.GPUFuncOp(ftype, sym_name=name, kernel=True, known_block_size=[block, 1, 1])
            entry = g.add_entry_block()
        mapping: dict = {}
        with ir.InsertionPoint(entry), self.loc:
            for r, a in zip(roots, entry.arguments):
                mapping[r] = self._natural_view(a, r)
            for op in closure:
                c = op.clone()
                _remap(c, mapping)
                for old, new in zip(op.results, c.results):
                    mapping[old] = new
            kb = E.IndexBuilder(entry)

            def body(i: ir.Value):
                if kern.parallel:
                    ivs = []
                    rest = i
                    for d in reversed(range(len(extents))):
                        e = kb.value(extents[d])
                        q = arith.remui(rest, e) if d else rest
                        rest = arith.divui(rest, e) if d else rest
                        iv = q
                        if st[d] != 1:
                            iv = arith.muli(iv, kb.value(st[d]))
                        if lb[d] != 0:
                            iv = arith.addi(iv, kb.value(lb[d]))
                        ivs.append(iv)
                    ivs.reverse()
                    pbody = par.regions[0].blocks[0]
                    for old, new in zip(pbody.arguments, ivs):
                        mapping[old] = new
                    for op in list(pbody.operations)[:-1]:
                        c = op.operation.clone()
                        _remap(c, mapping)
                        for old, new in zip(op.operation.results, c.results):
                            mapping[old] = new
                else:
                    for op in kern.ops:
                        c = op.clone()
                        _remap(c, mapping)
                        for old, new in zip(op.results, c.results):
                            mapping[old] = new

            if kern.parallel:
                E.for_each_thread_item(kb, total, block, grid, stride, body)
            else:
                first = E.linear_thread_id(kb, 1)
                guard = scf.IfOp(kb.lt(first, 1))
                with ir.InsertionPoint(guard.then_block):
                    body(first)
                    scf.YieldOp([])
            gpu.ReturnOp([])
        g.attributes["kf.grid"] = ir.DenseI64ArrayAttr.get([grid, 1, 1])
        g.attributes["kf.block"] = ir.DenseI64ArrayAttr.get([block, 1, 1])
        g.attributes["kf.shared_bytes"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
        g.attributes["kf.fused_lines"] = ir.ArrayAttr.get([ir.StringAttr.get(x) for x in self._lines()])
        g.attributes["kf.strategy"] = ir.StringAttr.get("linalg")
        return grid, block

    def _bools_as_bytes(self, g: ir.Operation) -> None:
        """Boolean buffers as bytes on CUDA (kf's storage for them there: emit.storage_type;
        the LLVM lowering loads no i1): a load compares its byte with 0, a store writes 0 or 1."""
        i1, i8 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(8)
        entry = g.regions[0].blocks[0]
        changed = False
        for a in entry.arguments:
            t = ir.MemRefType(a.type)
            if t.element_type != i1:
                continue
            changed = True
            a.set_type(ir.MemRefType.get(t.shape, i8))
            for use in list(a.uses):
                op = use.owner.operation if hasattr(use.owner, "operation") else use.owner
                if op.name == "memref.load":
                    r = op.results[0]
                    r.set_type(i8)
                    with ir.InsertionPoint.after(op), op.location:
                        b = arith.cmpi(arith.CmpIPredicate.ne, r, arith.constant(i8, 0))
                    r.replace_all_uses_except(b, b.owner.operation)
                elif op.name == "memref.store" and use.operand_number == 1:
                    with ir.InsertionPoint(op), op.location:
                        op.operands[0] = arith.extui(i8, op.operands[0])
                else:
                    self.fail(f"a boolean buffer is used by {op.name}, which kf-linalg-to-gpu does not "
                              "rewrite for CUDA's byte booleans")
        if changed:
            g.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in entry.arguments], []))

    def _f64_as_f32(self, g: ir.Operation) -> None:
        """f64 scalars (torch-mlir computes some constants' arithmetic in double: linspace's
        step) computed in f32 on SPIR-V in a kernel of no f64 tensor, so that it needs no
        Float64 (Metal has none); torch computes these in the tensor's float type. A kernel
        of f64 tensors stays f64 (kf-to-spirv records the Float64 capability it needs)."""
        f32, f64 = ir.F32Type.get(), ir.F64Type.get()
        if any(ir.MemRefType(a.type).element_type == f64 for a in g.regions[0].blocks[0].arguments):
            return
        ops: list[ir.Operation] = []
        g.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
        dead = []
        for op in ops:
            if op.name == "arith.bitcast" and any(v.type == f64 for v in [*op.operands, *op.results]):
                self.fail("its torch-mlir lowering reinterprets float64 bits, which the SPIR-V targets cannot")
            for region in op.regions:
                for block in region.blocks:
                    for a in block.arguments:
                        if a.type == f64:
                            a.set_type(f32)
            for r in op.results:
                if r.type == f64:
                    r.set_type(f32)
            if op.name == "arith.constant" and op.results[0].type == f32 and \
                    ir.FloatAttr(op.attributes["value"]).type == f64:
                op.attributes["value"] = ir.FloatAttr.get(f32, ir.FloatAttr(op.attributes["value"]).value)
            if op.name in ("arith.truncf", "arith.extf") and op.operands[0].type == op.results[0].type:
                op.results[0].replace_all_uses_with(op.operands[0])
                dead.append(op)
        for op in dead:
            op.erase()

    def _lines(self) -> list[str]:
        m = re.search(r'loc\("([^"]+)":(\d+):(\d+)', str(self.loc))
        return [f"{m.group(1)}:{m.group(2)}"] if m else []

    def _arg_type(self, root: ir.Value) -> ir.MemRefType:
        """The kernel argument type of a buffer (zero dims as 1, as emit.memref_type)."""
        t = ir.MemRefType(self._schedule_type(root))
        return ir.MemRefType.get([max(d, 1) for d in t.shape], t.element_type)

    def _schedule_type(self, root: ir.Value) -> ir.Type:
        """The memref type the schedule gives a buffer: the function's result type where it
        returns a reshape of it (so the call's result is that buffer), else its own."""
        t = ir.MemRefType(root.type)
        return self._returned.get(root, ir.MemRefType.get(t.shape, t.element_type))

    def _natural_view(self, arg: ir.Value, root: ir.Value) -> ir.Value:
        """The kernel argument seen as the buffer's own type (a reshape when the schedule
        gives it another shape)."""
        from mlir.dialects import memref

        own = ir.MemRefType(root.type)
        have = ir.MemRefType(arg.type)
        if list(own.shape) == list(have.shape):
            return arg
        flat = arg
        if have.rank != 1:
            n = 1
            for d in have.shape:
                n *= d
            flat = memref.collapse_shape(ir.MemRefType.get([n], own.element_type), arg,
                                         [list(range(have.rank))] if have.rank else [])
        if own.rank == 1:
            return flat
        return memref.expand_shape(ir.MemRefType.get(list(own.shape), own.element_type), flat,
                                   [list(range(own.rank))] if own.rank else [], [], list(own.shape))

    # ------------------------------------------------------------------ the schedule

    def _schedule(self, launches, ret: ir.Operation, globals_: dict) -> None:
        from kf.dialects import builders as kb_


        call = self.call
        f_args = list(self.callee.regions[0].blocks[0].arguments)
        current: dict = {}
        with ir.InsertionPoint(call), self.loc:

            def value_of(root: ir.Value) -> ir.Value:
                if root in current:
                    return current[root]
                if _is_arg(root):
                    v = call.operands[ir.BlockArgument(root).arg_number]
                elif root.owner.operation.name == "memref.get_global":
                    g = globals_[ir.FlatSymbolRefAttr(root.owner.attributes["name"]).value]
                    v = kb_.constant(g.attributes["initial_value"])
                else:
                    v = self._empty(self._tensor_type(root))
                current[root] = v
                return v

            for name, roots, written, geometry in launches:
                operands = [value_of(r) for r in roots]
                outs = [r for r in roots if r in written]
                decl_type = ir.FunctionType.get([v.type for v in operands], [self._tensor_type(r) for r in outs])
                self._declare(name, decl_type, {"kf.gpu_func": ir.SymbolRefAttr.get([GPU_MODULE, name]),
                                                "kf.tied": ir.DenseI64ArrayAttr.get([roots.index(r) for r in outs])})
                c = func.CallOp(list(decl_type.results), ir.FlatSymbolRefAttr.get(name), operands)
                for r, v in zip(outs, c.results):
                    current[r] = v
            results = [value_of(_root(v)) for v in ret.operands]
        for old, new in zip(call.results, results):
            if old.type != new.type:
                self.fail(f"its result has type {new.type}, the call's {old.type}")
            old.replace_all_uses_with(new)
        call.erase()

    def _tensor_type(self, root: ir.Value) -> ir.Type:
        t = ir.MemRefType(self._schedule_type(root))
        return ir.RankedTensorType.get(list(t.shape), t.element_type)

    def _empty(self, t: ir.Type) -> ir.Value:
        name = f"{self.prefix}_buffer{self._buffers}"
        self._buffers += 1
        self._declare(name, ir.FunctionType.get([], [t]), {"kf.empty": ir.UnitAttr.get()})
        return func.CallOp([t], ir.FlatSymbolRefAttr.get(name), []).result

    def _declare(self, name: str, ftype: ir.FunctionType, attrs: dict) -> None:
        with ir.InsertionPoint(self.callee), self.loc:
            decl = func.FuncOp(name, ftype, visibility="private")
        for k, v in attrs.items():
            decl.attributes[k] = v


def _expand_math(g: ir.Operation) -> None:
    """math ops that a back end has no lowering for, as arith: math.absi (NVVM), and
    math.fpowi and math.ipowi (SPIR-V has neither; NVVM would call compiler-rt's powi)."""
    ops: list[ir.Operation] = []
    g.walk(lambda op: (ops.append(op.operation) if op.name in ("math.absi", "math.fpowi", "math.ipowi") else None)
           or ir.WalkResult.ADVANCE)
    for op in ops:
        with ir.InsertionPoint(op), op.location:
            if op.name == "math.absi":
                x = op.operands[0]
                zero = arith.constant(x.type, 0)
                out = arith.select(arith.cmpi(arith.CmpIPredicate.slt, x, zero), arith.subi(zero, x), x)
            else:
                out = _power(op.operands[0], op.operands[1], floating=op.name == "math.fpowi")
        op.results[0].replace_all_uses_with(out)
        op.erase()


def _power(x: ir.Value, n: ir.Value, floating: bool) -> ir.Value:
    """x ** n for an integer n by squaring (one multiply a bit of |n|, in a loop over the
    bits of n's type); a negative n gives 1 / x ** |n|, in integers truncated (0 unless
    x ** |n| is 1 or -1)."""
    mul = arith.mulf if floating else arith.muli
    width = ir.IntegerType(n.type).width
    zero_n = arith.constant(n.type, 0)
    one_n = arith.constant(n.type, 1)
    one = arith.constant(x.type, 1.0 if floating else 1)
    negative = arith.cmpi(arith.CmpIPredicate.slt, n, zero_n)
    e = arith.select(negative, arith.subi(zero_n, n), n)
    index = ir.IndexType.get()
    loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, width), arith.constant(index, 1), [one, x])
    with ir.InsertionPoint(loop.body):
        i = arith.index_cast(n.type, loop.induction_variable)
        r, b = loop.inner_iter_args
        bit = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(arith.shrui(e, i), one_n), zero_n)
        scf.YieldOp([arith.select(bit, mul(r, b), r), mul(b, b)])
    r = loop.results[0]
    if floating:
        inverse = arith.divf(one, r)
    else:  # 1 / r in integers: r itself where r is 1 or -1, else 0 (and no division by 0)
        unit = arith.cmpi(arith.CmpIPredicate.eq, arith.muli(r, r), one)
        inverse = arith.select(unit, r, arith.constant(x.type, 0))
    return arith.select(negative, inverse, r)


def _ops_in(op: ir.Operation, out: dict) -> None:
    """op and the ops nested in it."""
    out[op] = op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                _ops_in(inner.operation, out)


def _operands_in(op: ir.Operation):
    yield from op.operands
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _operands_in(inner.operation)


def _writes(op: ir.Operation) -> bool:
    """Whether op writes memory (else it is a scalar op, rebuilt where it is used)."""
    w = set()
    _collect_writes(op, w)
    return bool(w)


def _collect_writes(op: ir.Operation, out: set) -> None:
    if op.name == "memref.store":
        out.add(_root(op.operands[1]))
    elif op.name == "memref.copy":
        out.add(_root(op.operands[1]))
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                _collect_writes(inner.operation, out)


def _remap(op: ir.Operation, mapping: dict) -> None:
    """Replace, in op and the ops nested in it, operands that mapping maps."""
    for i, v in enumerate(op.operands):
        if v in mapping:
            op.operands[i] = mapping[v]
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                _remap(inner.operation, mapping)
