"""kf-promote-shared: read a row from global memory once when several phases read it.

A rowwise kernel reads its input row in every phase: the mean, the variance, the output
(layer norm reads x three times, softmax three times, RMSNorm twice). The second and
later reads hit L1/L2 at best and DRAM at worst. This pass copies the row once into a
workgroup buffer and makes every phase read that buffer:

    scf.for %j = %tid to %R step %T {kf.row_loop}        (inserted before the first phase)
      %v = memref.load %x[%row, %j]
      memref.store %v, %buf[%j]                      %buf: gpu.func workgroup attribution
    gpu.barrier
    ... every marked memref.load %x[%row, %j] in a phase -> memref.load %buf[%j]

What it rewrites, and why that is sound:

- Candidates are ``memref.load`` ops carrying ``kf.promote`` (the rowwise strategy's
  marker: "this input is read again in another phase") inside top-level ``scf.for`` loops
  carrying ``kf.row_loop`` (IV = thread id + k * block size over [0, ub): together the
  threads of a workgroup visit every column once) -- top-level in the gpu.func or in the
  body of one of its loops (the rowwise kernel's group loop, a row an iteration: the copy
  is made each iteration, after a barrier that waits for every read of the previous
  row). Unmarked IR is left alone.
- The loaded memref must be a kernel argument that nothing in the kernel writes or passes
  to another op, so the copy cannot go stale; its last index must be the loop IV, its
  other indices values defined before the first loop (the copy loop uses them), and
  the loop bound must be the argument's last dimension (the buffer holds the whole row).
- Loads of one (argument, leading indices) group in fewer than ``min-reads`` loops are
  left as they are: a row read once gains nothing from a detour through shared memory.
- The buffer is a gpu.func *workgroup attribution*: kf-to-cuda (convert-gpu-to-nvvm) and
  kf-to-spirv (which turns attributions into Workgroup variables) both take it, whereas
  ``memref.alloca`` in workgroup space only works on the SPIR-V side.
- Shared memory is finite: groups are promoted while the kernel's workgroup memory (its
  existing attributions and allocations plus the new buffers) fits ``max-shared-bytes``,
  or the ``kf.max_shared_bytes`` the strategy copied from the target onto the gpu.func,
  or 48 KiB; the rest keep reading global memory.
- The buffer is written once, before a barrier, and only read afterwards: no other
  barrier is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from mlir import ir
from mlir.dialects import gpu, memref, scf

from .base import KfPass, PassError

ROW_LOOP = "kf.row_loop"
PROMOTE = "kf.promote"
MAX_SHARED = "kf.max_shared_bytes"
VECTOR_LANES = "kf.vector_lanes"
_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1}


def _walk(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


def _is_workgroup(t: ir.Type) -> bool:
    return isinstance(t, ir.MemRefType) and t.memory_space is not None and "workgroup" in str(t.memory_space)


def _nbytes(t: ir.MemRefType) -> int:
    return math.prod(t.shape) * _BYTES.get(str(t.element_type), 4)


def _const_index(v: ir.Value) -> int | None:
    owner = v.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def workgroup_bytes(fn: ir.Operation) -> int:
    """Workgroup memory of a gpu.func: its workgroup attributions and allocations."""
    entry = fn.regions[0].blocks[0]
    total = sum(_nbytes(a.type) for a in entry.arguments if _is_workgroup(a.type))
    for op in _walk(fn):
        if op.name in ("memref.alloc", "memref.alloca") and _is_workgroup(op.results[0].type):
            total += _nbytes(op.results[0].type)
    return total


@dataclass(frozen=True)
class PromoteSharedPass(KfPass):
    """``kf-promote-shared{max-shared-bytes=0 min-reads=2}``."""

    NAME: ClassVar[str] = "kf-promote-shared"
    DESCRIPTION: ClassVar[str] = "copy rows read in several phases into workgroup memory once (rowwise kernels)"

    max_shared_bytes: int = 0  # 0: the gpu.func's kf.max_shared_bytes, else 48 KiB
    min_reads: int = 2

    def run(self, module: ir.Operation) -> None:
        if self.max_shared_bytes < 0:
            raise PassError(f"max-shared-bytes must be 0 (the kernel's own limit) or positive, got "
                            f"{self.max_shared_bytes}", module.location)
        if self.min_reads < 1:
            raise PassError(f"min-reads must be at least 1, got {self.min_reads}", module.location)
        for gm in _walk(module):
            if gm.name != "gpu.module":
                continue
            for fn in list(gm.regions[0].blocks[0].operations):
                fn = fn.operation
                if fn.name == "gpu.func" and "gpu.kernel" in fn.attributes:
                    self.promote(fn)

    def limit(self, fn: ir.Operation) -> int:
        if self.max_shared_bytes:
            return self.max_shared_bytes
        if MAX_SHARED in fn.attributes:
            limit = fn.attributes[MAX_SHARED]
            if not isinstance(limit, ir.IntegerAttr) or limit.value <= 0:
                raise PassError(f"{MAX_SHARED} is {limit}, not a positive number of bytes", fn.location)
            return limit.value
        return 48 * 1024

    def promote(self, fn: ir.Operation) -> list[int]:
        """Promote the rows of fn that qualify; returns the promoted argument numbers."""
        entry = fn.regions[0].blocks[0]
        n_inputs = len(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
        n_wg = ir.IntegerAttr(fn.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in fn.attributes else 0
        if len(entry.arguments) != n_inputs + n_wg:
            return []  # private attributions follow the workgroup ones: not appendable here
        promoted = self._promote_block(fn, entry, entry, n_inputs, False)
        # a rowwise kernel's group loop (column partials): its body's row loops, one row an
        # iteration
        for op in [op.operation for op in entry.operations]:
            if op.name == "scf.for" and ROW_LOOP not in op.attributes:
                body = op.regions[0].blocks[0]
                promoted += self._promote_block(fn, entry, body, n_inputs, True)
        return promoted

    def _promote_block(self, fn: ir.Operation, entry: ir.Block, block: ir.Block, n_inputs: int,
                       repeated: bool) -> list[int]:
        """Promote the rows read by the row loops at the top of block (entry, or the body
        of a loop of entry: ``repeated``, where each iteration copies a row again, after a
        barrier that waits for every read of the previous one)."""
        n_wg = ir.IntegerAttr(fn.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in fn.attributes else 0
        top = [op.operation for op in block.operations]
        position = {op: i for i, op in enumerate(top)}
        loops = [op for op in top if op.name == "scf.for" and ROW_LOOP in op.attributes]
        groups: dict[tuple, dict] = {}
        for loop in loops:
            iv = loop.regions[0].blocks[0].arguments[0]
            for op in _walk(loop):
                if op.name != "memref.load" or PROMOTE not in op.attributes:
                    continue
                mem = op.operands[0]
                if not isinstance(mem.owner, ir.Block) or mem.owner != entry or \
                        ir.BlockArgument(mem).arg_number >= n_inputs:
                    continue
                idx = list(op.operands)[1:]
                if not idx or idx[-1] != iv:
                    continue
                key = (ir.BlockArgument(mem).arg_number, tuple(_value_key(v) for v in idx[:-1]))
                g = groups.setdefault(key, {"arg": mem, "lead": idx[:-1], "loops": [], "loads": []})
                if not any(l is loop for l in g["loops"]):
                    g["loops"].append(loop)
                g["loads"].append(op)
        budget = self.limit(fn) - workgroup_bytes(fn)
        promoted = []
        wg = ir.Attribute.parse("#gpu.address_space<workgroup>")
        barriers_after: dict = {}
        for key, g in sorted(groups.items(), key=lambda kv: kv[0][0]):
            arg, first = g["arg"], g["loops"][0]
            t = ir.MemRefType(arg.type)
            if len(g["loops"]) < self.min_reads or not self._only_loaded(arg):
                continue
            ub = _const_index(first.operands[1])
            if ub is None or ub != t.shape[-1] or any(
                    _const_index(l.operands[1]) != ub or l.operands[0] != first.operands[0]
                    or _value_key(l.operands[2]) != _value_key(first.operands[2]) for l in g["loops"]):
                continue
            if not all(_dominates_top(v, block, position, position[first]) for v in g["lead"]):
                continue
            buf_t = ir.MemRefType.get([ub], t.element_type, None, wg)
            if _nbytes(buf_t) > budget:
                continue
            budget -= _nbytes(buf_t)
            with first.location:
                buf = entry.add_argument(buf_t, first.location)
                n_wg += 1
                fn.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n_wg)
                copy = scf.ForOp(first.operands[0], first.operands[1], first.operands[2], ip=ir.InsertionPoint(first))
                copy.operation.attributes[ROW_LOOP] = ir.UnitAttr.get()
                copy.operation.attributes["kf.promoted"] = ir.UnitAttr.get()
                if VECTOR_LANES in first.attributes:
                    copy.operation.attributes[VECTOR_LANES] = first.attributes[VECTOR_LANES]
                with ir.InsertionPoint(copy.body):
                    v = memref.load(arg, g["lead"] + [copy.induction_variable])
                    memref.store(v, buf, [copy.induction_variable])
                    scf.YieldOp([])
                if first not in barriers_after:
                    if repeated:
                        gpu.BarrierOp(ip=ir.InsertionPoint(copy.operation))
                    barriers_after[first] = gpu.BarrierOp(ip=ir.InsertionPoint(first)).operation
                else:  # one barrier after every copy placed before this loop
                    copy.operation.move_before(barriers_after[first])
            for load in g["loads"]:
                with load.location:
                    iv = list(load.operands)[-1]
                    new = memref.LoadOp(buf, [iv], ip=ir.InsertionPoint(load))
                load.results[0].replace_all_uses_with(new.result)
                load.erase()
            promoted.append(key[0])
        return promoted

    @staticmethod
    def _only_loaded(arg: ir.Value) -> bool:
        """The kernel only loads from arg (no stores, no views, no calls): a copy stays valid."""
        return all(_op(use.owner).name == "memref.load" for use in arg.uses)


def _value_key(v: ir.Value):
    """A hashable identity for an SSA value (constants by value, so that two
    ``arith.constant 0 : index`` ops count as one index)."""
    c = _const_index(v)
    return ("const", c) if c is not None else ("value", v)


def _op(x) -> ir.Operation:
    return x.operation if isinstance(x, ir.OpView) else x


def _dominates_top(v: ir.Value, block: ir.Block, position: dict, before: int) -> bool:
    """v is available at the top level of block before op number ``before``: defined
    there before it, or in a block that holds block (an argument of one included)."""
    owner = v.owner
    holders = [block]
    while _op(holders[-1].owner).name != "gpu.func":
        holders.append(_op(holders[-1].owner).block)
    if isinstance(owner, ir.Block):
        return owner in holders
    owner = _op(owner)
    if owner in position:
        return position[owner] < before
    return any(owner.block == h for h in holders[1:])
