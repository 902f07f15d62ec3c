"""Kernels with run-time sizes: a kernel function whose tensors have ``?`` dims
(compiler/dynamic.py) planned and written as one kernel for every size.

What a strategy sees is the kernel at its largest: ``bounded`` gives a copy of the kernel
function with each ``?`` made ``BOUND`` (the largest run-time size, MAX_DYNAMIC_SIZE),
so the plans, memref types and the static parts of the index arithmetic are those of a
static kernel. A tensor has one ``?`` at most. Where it is the first dim of its tensor that
is not 1, every stride is static and addresses never depend on a run-time size (the
bound only declares the buffer's extent; a kernel reads no element past the run-time
one); elsewhere (a sequence after heads) the dims before it have run-time strides,
which only the strategies of ``RUN_TIME_STRIDE_KINDS`` take: their kernels declare such
a buffer flat (``flat_type``) and linearize indices with ``SizeSlots.strides``. The run-time sizes themselves, one a *slot* ((kernel
argument, dim) pairs, the plan's ``sizes``), reach the kernel in a small buffer of i32,
its last argument (after the index error flag), which the launcher fills at each call
(runtime/abi.py: ``KernelABI.sizes``); the strategy reads them (``SizeSlots``) where the
extent matters: the guards of tails and the loops' bounds. The grid is an expression
over the slots ``k0``, ``k1``, ... (``KernelABI.grid_sizes``) the launcher evaluates.

Strategies that write such kernels list themselves in ``RUN_TIME_KINDS``; a kernel with
``?`` dims that another strategy would write is an error that makes the driver compile
the function for static sizes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from mlir import ir
from mlir.dialects import arith, memref

from kf.runtime.abi import MAX_DYNAMIC_SIZE

#: the size a ``?`` dim is declared with in the kernel: the largest a run-time size takes
BOUND = MAX_DYNAMIC_SIZE

#: the strategies that write kernels with run-time sizes
RUN_TIME_KINDS = ("rowwise", "elementwise", "attention", "matmul")
#: those whose kernels also address buffers with run-time strides (a run-time sequence
#: after a static number of heads): flat buffers, indices linearized with the sizes
RUN_TIME_STRIDE_KINDS = ("attention",)


def _is_dynamic(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and not t.has_static_shape


def _bounded_type(t: ir.Type) -> ir.Type:
    if not _is_dynamic(t):
        return t
    rt = ir.RankedTensorType(t)
    shape = [BOUND if rt.is_dynamic_dim(i) else d for i, d in enumerate(rt.shape)]
    return ir.RankedTensorType.get(shape, rt.element_type, rt.encoding)


def slots_of(kernel: ir.Operation) -> list[tuple[int, int]]:
    """The kernel function's run-time dims as (argument position, dim): inputs, then
    results; ValueError for a tensor with more than one."""
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    slots = []
    for pos, t in enumerate([*ftype.inputs, *ftype.results]):
        if not _is_dynamic(t):
            continue
        rt = ir.RankedTensorType(t)
        dyn = [i for i in range(rt.rank) if rt.is_dynamic_dim(i)]
        if len(dyn) > 1:
            raise ValueError(f"{t} has more than one run-time size")
        slots.append((pos, dyn[0]))
    return slots


def check_strides(kernel: ir.Operation, kind: str) -> None:
    """ValueError where a strategy whose kernels address their buffers with static
    strides (all but RUN_TIME_STRIDE_KINDS) meets a ``?`` that is not its tensor's first
    dim that is not 1 (the dims before it would have run-time strides)."""
    if kind in RUN_TIME_STRIDE_KINDS:
        return
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    for t in [*ftype.inputs, *ftype.results]:
        if _is_dynamic(t):
            rt = ir.RankedTensorType(t)
            first = next(i for i in range(rt.rank) if rt.is_dynamic_dim(i) or rt.shape[i] != 1)
            if not rt.is_dynamic_dim(first):
                raise ValueError(f"{t} has a run-time size after its first dim that is not 1 (its strides would "
                                 f"take run-time sizes, which the {kind} strategy's kernels do not)")


def flat_type(t: ir.MemRefType) -> ir.MemRefType:
    """A kernel buffer addressed with run-time strides: one dim of all its (bounded)
    elements."""
    n = 1
    for d in t.shape:
        n *= d
    return ir.MemRefType.get([max(n, 1)], t.element_type)


def has_run_time_sizes(kernel: ir.Operation) -> bool:
    found = []

    def visit(op):
        if any(_is_dynamic(r.type) for r in op.results) or (
                op.name == "func.func" and any(_is_dynamic(a.type) for a in op.regions[0].blocks[0].arguments)):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    kernel.walk(visit)
    return bool(found)


@contextlib.contextmanager
def bounded(kernel: ir.Operation) -> Iterator[tuple[ir.Operation, list[tuple[int, int]]]]:
    """(the kernel function to plan and write, its slots): the kernel itself where it
    has no ``?``, else a copy (in a module of its own, erased after) with each ``?``
    made BOUND. Every ``?`` of its ops must be its tensor's first dim that is not 1 too,
    else ValueError."""
    if not has_run_time_sizes(kernel):
        yield kernel, []
        return
    slots = slots_of(kernel)
    holder = ir.Module.create(kernel.location)
    with ir.InsertionPoint(holder.body):
        copy = kernel.clone()
    try:
        def visit(op):
            for r in op.results:
                if _is_dynamic(r.type):
                    r.set_type(_bounded_type(r.type))
            for region in op.regions:
                for block in region.blocks:
                    for a in block.arguments:
                        a.set_type(_bounded_type(a.type))
            return ir.WalkResult.ADVANCE

        copy.walk(visit)
        ftype = ir.FunctionType(ir.TypeAttr(copy.attributes["function_type"]).value)
        copy.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [_bounded_type(t) for t in ftype.inputs], [_bounded_type(t) for t in ftype.results]))
        yield copy, slots
    finally:
        copy.erase()


def slot_type(n: int) -> ir.MemRefType:
    """The kernel argument that holds n run-time sizes."""
    return ir.MemRefType.get([max(n, 1)], ir.IntegerType.get_signless(32))


class SizeSlots:
    """The run-time sizes of a kernel being written: ``size(k)``, slot k as an index, and
    ``extent(n, k)``: a static extent ``n`` of the bounded kernel that holds slot k's dim
    once (``n = BOUND * r``), as the run-time ``size * r``. Both are computed at the top
    of the entry block, before what it held when this was made."""

    def __init__(self, entry: ir.Block, arg: ir.Value, slots: Sequence[Sequence[int]]):
        self.entry, self.arg, self.slots = entry, arg, [tuple(s) for s in slots]
        ops = list(entry.operations)
        self._anchor = ops[0] if ops else None
        self._loaded: dict[int, ir.Value] = {}

    def _ip(self) -> ir.InsertionPoint:
        return ir.InsertionPoint(self._anchor) if self._anchor is not None else ir.InsertionPoint(self.entry)

    def size(self, k: int) -> ir.Value:
        if k not in self._loaded:
            with self._ip():
                index = ir.IndexType.get()
                size = arith.index_cast(index, memref.load(self.arg, [arith.constant(index, k)]))
                # at most BOUND (the launcher's promise, bind_sizes): what bounds the
                # loops over it for kf-to-spirv's count of loop iterations
                self._loaded[k] = arith.minui(size, arith.constant(index, BOUND))
        return self._loaded[k]

    def strides(self, shape: Sequence[int], dim: int, k: int) -> list[ir.Value | int]:
        """The row-major strides of a (bounded) shape whose dim ``dim`` is slot k's
        run-time size: index values from that dim on outwards, ints inside it."""
        out: list[ir.Value | int] = [1] * len(shape)
        with self._ip():
            for d in range(len(shape) - 2, -1, -1):
                inner = self.size(k) if d + 1 == dim else shape[d + 1]
                prev = out[d + 1]
                if isinstance(prev, int) and isinstance(inner, int):
                    out[d] = prev * inner
                    continue
                a = prev if not isinstance(prev, int) else arith.constant(ir.IndexType.get(), prev)
                b = inner if not isinstance(inner, int) else arith.constant(ir.IndexType.get(), inner)
                out[d] = arith.muli(a, b)
        return out

    def extent(self, n: int, k: int = 0) -> ir.Value:
        if n % BOUND:
            raise ValueError(f"extent {n} does not hold a run-time dim")
        size = self.size(k)
        if n == BOUND:
            return size
        with self._ip():
            return arith.muli(size, arith.constant(ir.IndexType.get(), n // BOUND))


def grid_text(k: int, per_slot: int, per_block: int) -> str:
    """The grid's x as the launcher evaluates it: ceil(k<k> * per_slot / per_block)."""
    return f"FloorDiv(k{k}*{per_slot} + {per_block - 1}, {per_block})"
