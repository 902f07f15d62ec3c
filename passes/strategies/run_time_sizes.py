"""Kernels with run-time sizes: a kernel function whose tensors have ``?`` dims
(compiler/dynamic.py) planned and written as one kernel for every size.

What a strategy sees is the kernel at its largest: ``bounded`` gives a copy of the kernel
function with each ``?`` made ``BOUND`` (the largest run-time size, MAX_DYNAMIC_SIZE),
so the plans, memref types and the static parts of the index arithmetic are those of a
static kernel. A tensor has one ``?`` at most (but an attention kernel's mask or bias:
``check_several``). Where it is the first dim of its tensor that
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

A plan made for the bound must hold for every size up to it: a strategy with
choices that hold for some sizes only asks ``is_bounded`` of the kernel it plans.
Code that guards tails asks ``ragged`` whether a dim needs them (a run-time size always
does).

Strategies that write such kernels list themselves in ``RUN_TIME_KINDS``; kf-tile gives
a kernel whose kind's strategy cannot take its run-time sizes or strides to the generic
strategy, which takes both (every tensor with a run-time size a flat buffer); a kernel
that no strategy can write with its ``?`` dims is an error that makes the driver compile
the function for static sizes, and the error is the reason the driver logs.

A strategy finds the run-time extent of a tensor inside the kernel, not only of its
arguments, with ``RunTimeShapes`` (the bounded copy keeps which dims were ``?``:
``RUN_TIME_DIMS``); ``SizeTexts`` gives the same over the kernel's ``?`` types as text over
its inputs' slots, which kf-map-to-gpu records (``kf.result_sizes``) so that the driver
names the size of a buffer that one kernel writes and another reads.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

from mlir import ir
from mlir.dialects import arith, memref

from kf.dialects.attrs import SIZES_FROM, sizes_from
from kf.runtime.abi import MAX_DYNAMIC_SIZE

#: the size a ``?`` dim is declared with in the kernel: the largest a run-time size takes
BOUND = MAX_DYNAMIC_SIZE

#: the bounded copy's attribute that keeps, per op of its body, the ``?`` dim of each result
RUN_TIME_DIMS = "kf.run_time_dims"

#: the strategies that write kernels with run-time sizes
RUN_TIME_KINDS = ("rowwise", "elementwise", "attention", "attention_backward", "matmul", "generic")
#: those whose kernels also address buffers with run-time strides (a run-time sequence
#: after a static number of heads): flat buffers, indices linearized with the sizes
RUN_TIME_STRIDE_KINDS = ("attention", "attention_backward", "generic")


def _is_dynamic(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and not t.has_static_shape


def _dynamic_dim(t: ir.Type) -> int:
    if not _is_dynamic(t):
        return -1
    rt = ir.RankedTensorType(t)
    return next(i for i in range(rt.rank) if rt.is_dynamic_dim(i))


def _run_time_dims(t: ir.Type) -> list[int]:
    """The ``?`` dims of a type, in order (none for a static or non-tensor type)."""
    if not _is_dynamic(t):
        return []
    rt = ir.RankedTensorType(t)
    return [i for i in range(rt.rank) if rt.is_dynamic_dim(i)]


def _dims_mask(t: ir.Type) -> int:
    """The run-time dims of a type as a bit mask (bit d: dim d is ``?``; 0: none)."""
    return sum(1 << i for i in _run_time_dims(t))


def _dims_of_mask(mask: int) -> set[int]:
    return {d for d in range(mask.bit_length()) if mask >> d & 1}


def _bounded_type(t: ir.Type) -> ir.Type:
    if not _is_dynamic(t):
        return t
    rt = ir.RankedTensorType(t)
    shape = [BOUND if rt.is_dynamic_dim(i) else d for i, d in enumerate(rt.shape)]
    return ir.RankedTensorType.get(shape, rt.element_type, rt.encoding)


def slots_of(kernel: ir.Operation) -> list[tuple[int, int]]:
    """The kernel function's run-time dims as (argument position, dim): inputs, then
    results, a tensor's in order of its dims."""
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    slots = []
    for pos, t in enumerate([*ftype.inputs, *ftype.results]):
        slots.extend((pos, i) for i in _run_time_dims(t))
    return slots


#: the strategies whose kernels take an input with several run-time dims: the attention
#: kernel reads a mask or bias of [..., queries, keys] at two run-time lengths (each dim
#: its own slot's size, ``SizeSlots.strides_at``), and the generic strategy reads any
#: such input as a flat buffer (``RunTimeShapes`` finds each of its extents) -- SDPA's
#: rows that a [b, 1, queries, keys] mask masks everywhere
SEVERAL_SIZE_KINDS = ("attention", "generic")

#: the most elements such an input may hold at its bound: its flat buffer's extent and
#: the index arithmetic over it stay within i32
SEVERAL_SIZE_ELEMENTS = 2**31 - 1


def check_several(kernel: ir.Operation, kind: str) -> None:
    """ValueError where a tensor of the kernel function has more than one run-time size
    and the strategy of ``kind`` does not take that (SEVERAL_SIZE_KINDS: an input only,
    of at most SEVERAL_SIZE_ELEMENTS at its bound)."""
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    n_in = len(ftype.inputs)
    for pos, t in enumerate([*ftype.inputs, *ftype.results]):
        if len(_run_time_dims(t)) < 2:
            continue
        if kind not in SEVERAL_SIZE_KINDS or pos >= n_in:
            raise ValueError(f"{t} has more than one run-time size")
        if math.prod(ir.RankedTensorType(_bounded_type(t)).shape) > SEVERAL_SIZE_ELEMENTS:
            raise ValueError(f"{t} has more than one run-time size and more than {SEVERAL_SIZE_ELEMENTS} "
                             f"elements at the bound ({BOUND})")


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


def strided_positions(specs: Sequence, slots) -> dict[int, int]:
    """{position: run-time dim} of the kernel buffers (``specs``: inputs, then results)
    whose run-time dim follows a dim that is not 1: their strides are run-time sizes,
    so they are declared flat (``flat_type``). A buffer with several run-time dims
    (``check_several``) is named with its last such dim; ``dims_of`` gives them all."""
    return {pos: dim for pos, dim in slots if any(d != 1 for d in specs[pos].shape[:dim])}


def dims_of(slots, pos: int) -> dict[int, int]:
    """{run-time dim: slot} of the buffer at ``pos``: what ``SizeSlots.strides_at`` takes."""
    return {dim: k for k, (p, dim) in enumerate(slots) if p == pos}


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
    for op in kernel.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "kf.concat" and _is_dynamic(op.results[0].type):
            rt = ir.RankedTensorType(op.results[0].type)
            axis = int(ir.IntegerAttr(op.attributes["dim"]).value) % rt.rank
            if rt.is_dynamic_dim(axis):
                # its size is the sum of its operands' and can pass BOUND, which every
                # run-time size of the kernel is planned at
                raise ValueError("a concatenation along a run-time dim: its size can pass the bound kernels "
                                 "with run-time sizes are planned at")
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

        # which dims of each op's results were ``?`` (a bit mask; 0: none), for RunTimeShapes
        copy.attributes[RUN_TIME_DIMS] = ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get(
            [_dims_mask(r.type) for r in op.results]) for op in copy.regions[0].blocks[0].operations])
        copy.walk(visit)
        ftype = ir.FunctionType(ir.TypeAttr(copy.attributes["function_type"]).value)
        copy.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [_bounded_type(t) for t in ftype.inputs], [_bounded_type(t) for t in ftype.results]))
        copy.attributes[BOUNDED_ATTR] = ir.UnitAttr.get()
        yield copy, slots
    finally:
        copy.erase()


#: the mark of a kernel function ``bounded`` made from one with run-time sizes
BOUNDED_ATTR = "kf.bounded"


def largest_slot(kernel: ir.Operation) -> int:
    """The largest run-time size the kernel's slots may take (BOUND, which it is planned
    at, where each run-time dim inside it is a slot's; less where a reshape merges a
    run-time dim with static ones: ``[3, n, 8]`` to ``[3n, 8]`` takes n up to BOUND / 3)."""
    factor = 1
    for op in kernel.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "kf.reshape" or not _is_dynamic(op.results[0].type):
            continue
        src, dst = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.results[0].type)
        static_src = math.prod(n for i, n in enumerate(src.shape) if not src.is_dynamic_dim(i))
        static_dst = math.prod(n for i, n in enumerate(dst.shape) if not dst.is_dynamic_dim(i))
        if static_dst and static_src > static_dst:
            factor = max(factor, -(-static_src // static_dst))
    return BOUND // factor


def innermost_is_run_time(kernel: ir.Operation) -> bool:
    """Whether a bounded kernel's run-time dim is the innermost dim of a result of one of
    its ops (the one dim of a 1-d tensor of run-time length)."""
    if RUN_TIME_DIMS not in kernel.attributes:
        return False
    body = kernel.regions[0].blocks[0]
    for op, ds in zip(body.operations, ir.ArrayAttr(kernel.attributes[RUN_TIME_DIMS])):
        for r, m in zip(op.operation.results, ir.DenseI64ArrayAttr(ds)):
            if isinstance(r.type, ir.RankedTensorType) and r.type.rank and m >> (r.type.rank - 1) & 1:
                return True
    return False


def results_with_run_time_sizes(kernel: ir.Operation) -> bool:
    """Whether a bounded kernel (``bounded``) returns a tensor that had a run-time dim."""
    if RUN_TIME_DIMS not in kernel.attributes:
        return False
    body = kernel.regions[0].blocks[0]
    dims = {}
    for op, ds in zip(body.operations, ir.ArrayAttr(kernel.attributes[RUN_TIME_DIMS])):
        for r, m in zip(op.operation.results, ir.DenseI64ArrayAttr(ds)):
            dims[r] = m
    ret = list(body.operations)[-1].operation
    return any(dims.get(v, 0) for v in ret.operands)


def is_bounded(kernel: ir.Operation) -> bool:
    """Whether kernel is ``bounded``'s copy of a kernel with run-time sizes: its plan is
    then for every size up to BOUND, so a plan choice that holds only for some sizes
    (whole key blocks, a table of the mask's blocks, a persistent grid) is not taken."""
    return BOUNDED_ATTR in kernel.attributes


def ragged(n: int | ir.Value, block: int) -> bool:
    """Whether tiles of ``block`` over a dim of ``n`` need tail guards: a run-time size
    (an index value) always, a static one where the tiles do not divide it."""
    return not isinstance(n, int) or bool(n % block or n < block)


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
        return self.strides_at(shape, {dim: k})

    def strides_at(self, shape: Sequence[int], dims: dict[int, int]) -> list[ir.Value | int]:
        """``strides`` of a shape with a run-time size at each dim of ``dims`` ({dim:
        slot}, ``dims_of``)."""
        out: list[ir.Value | int] = [1] * len(shape)
        with self._ip():
            for d in range(len(shape) - 2, -1, -1):
                inner = self.size(dims[d + 1]) if d + 1 in dims else shape[d + 1]
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


def launch_slots(slots, n_in: int, shift: int) -> tuple:
    """The kernel function's slots as its gpu.func's launch names them, where the
    gpu.func takes ``shift`` buffers of its own (a prelude's workspace or table) between
    its inputs and its results: a result's position ``shift`` further."""
    return tuple((pos if pos < n_in else pos + shift, dim) for pos, dim in slots)


def grid_text(k: int, per_slot: int, per_block: int) -> str:
    """The grid's x as the launcher evaluates it: ceil(k<k> * per_slot / per_block)."""
    return f"FloorDiv(k{k}*{per_slot} + {per_block - 1}, {per_block})"


#: ops whose results line up with their operands dim by dim from the right (a ``?`` of a
#: result is the ``?`` of the operand dim it lines up with)
_ALIGNED = ("kf.broadcast_to", "kf.softmax", "kf.log_softmax", "kf.scan", "kf.iota", "kf.fill")


class RunTimeShapes:
    """The shape of every tensor of a bounded kernel (``bounded``) with its run-time dim
    as an index value: a kernel argument's or result's is its slot; another tensor's is
    found from its operands or users -- lined up with them (elementwise ops, broadcasts,
    slices and concats along other dims, reductions' kept dims, a scatter's input),
    permuted (transpose), the rows of a matmul, the element count of a reshape's operand
    over its static dims, the sum of a concat's operands along it, an index_add's
    indices as its source's rows. ``shape(v)`` raises ValueError for a run-time dim none
    of these reaches (the driver then compiles static sizes)."""

    def __init__(self, kernel: ir.Operation, sizes: "SizeSlots"):
        self.sizes = sizes
        body = kernel.regions[0].blocks[0]
        per_op = ir.ArrayAttr(kernel.attributes[RUN_TIME_DIMS])
        dims = {}
        for op, ds in zip(body.operations, per_op):
            for r, m in zip(op.operation.results, ir.DenseI64ArrayAttr(ds)):
                if m:
                    dims[r] = _dims_of_mask(m)
        self._solve(kernel, dims, {k: (pos, d) for k, (pos, d) in enumerate(sizes.slots)}, sizes.size)

    def _solve(self, kernel: ir.Operation, dims: dict, slots: dict, size) -> None:
        """Find every run-time extent: ``dims`` the run-time dims of each op result (a
        set), ``slots`` {k: (argument position, dim)} the slots to start from, ``size(k)``
        slot k's extent. ``extent`` holds them by (value, dim)."""
        from kf.dialects.attrs import op_attrs

        self._attrs = op_attrs
        body = kernel.regions[0].blocks[0]
        self.ops = [op.operation for op in body.operations]
        self.dim: dict = {v: set(ds) for v, ds in dims.items()}
        self.extent: dict = {}
        self.args = args = list(body.arguments)
        n_inputs = len(args)
        results = list(self.ops[-1].operands) if self.ops and self.ops[-1].name == "func.return" else []
        for k, (pos, d) in slots.items():
            v = args[pos] if pos < n_inputs else results[pos - n_inputs]
            self.dim.setdefault(v, set()).add(d)
            self.extent.setdefault((v, d), size(k))
        changed = True
        while changed:
            changed = False
            for op in self.ops:
                changed |= self._forward(op) | self._backward(op) | self._across(op)

    def _bounded(self, v: ir.Value) -> list[int]:
        return list(ir.RankedTensorType(v.type).shape) if isinstance(v.type, ir.RankedTensorType) else []

    def _at(self, v: ir.Value, d: int):
        """v's extent along d: an int, an index value, or None (a run-time dim not yet found)."""
        if d in self.dim.get(v, ()):
            return self.extent.get((v, d))
        return self._bounded(v)[d]

    def _lined_up(self, op: ir.Operation) -> bool:
        if op.name in _ALIGNED or op.name in _elementwise():
            return True
        if op.name in ("kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var", "kf.argmax",
                       "kf.logsumexp"):
            return bool(self._attrs(op).get("keepdim", False))
        return op.name in ("kf.slice", "kf.concat")

    def _pairs(self, op: ir.Operation):
        """(result dim, operand, operand dim) of the dims that are the same extent."""
        r = op.results[0]
        rr = len(self._bounded(r))
        attrs = self._attrs(op)
        if not len(op.operands) and SIZES_FROM in op.attributes:  # sized by the kernel's arguments
            for j, (a, d) in enumerate(sizes_from(op)):
                if 0 <= a < len(self.args):
                    yield j, self.args[a], d
            return
        if op.name == "kf.transpose":
            for j, p in enumerate(attrs["perm"]):
                yield j, op.operands[0], int(p)
            return
        if op.name == "kf.index_select":  # the indexed dim is the index's; the others the input's
            x, index = op.operands[:2]
            along = int(attrs["dim"]) % rr
            yield along, index, 0
            for j in range(rr):
                if j != along:
                    yield j, x, j
            return
        if op.name == "kf.gather":  # the index's shape
            for j in range(rr):
                yield j, op.operands[1], j
            return
        if op.name in ("kf.scatter_add", "kf.scatter_reduce", "kf.index_add"):  # the input's shape
            for j in range(rr):
                yield j, op.operands[0], j
            return
        if op.name == "kf.matmul":
            a, b = op.operands
            yield rr - 2, a, len(self._bounded(a)) - 2
            yield rr - 1, b, len(self._bounded(b)) - 1
            for o in (a, b):
                ro = len(self._bounded(o))
                for j in range(ro - 2):
                    yield rr - ro + j, o, j
            return
        if op.name in ("kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var", "kf.argmax",
                       "kf.logsumexp") and not attrs.get("keepdim", False):
            x = op.operands[0]
            rx = len(self._bounded(x))
            dims = attrs.get("dims")
            red = {int(attrs["dim"]) % rx} if op.name == "kf.argmax" else \
                ({int(d) % rx for d in dims} if dims else set(range(rx)))
            kept = [d for d in range(rx) if d not in red]
            for j, d in enumerate(kept):
                yield j, x, d
            return
        if not self._lined_up(op):
            return
        along = None
        if op.name in ("kf.slice", "kf.concat"):
            along = int(attrs["dim"]) % rr
        for o in op.operands:
            ro = len(self._bounded(o))
            for j in range(max(0, rr - ro), rr):
                if j != along:
                    yield j, o, j - (rr - ro)

    def _set(self, v: ir.Value, d: int, extent) -> bool:
        if d in self.dim.get(v, ()) and (v, d) not in self.extent and extent is not None:
            self.extent[(v, d)] = extent
            return True
        return False

    def _found(self, v: ir.Value) -> bool:
        """Whether every run-time extent of v is found."""
        return all((v, d) in self.extent for d in self.dim.get(v, ()))

    def _forward(self, op: ir.Operation) -> bool:
        if not op.results:
            return False
        r = op.results[0]
        changed = False
        for d in sorted(self.dim.get(r, ())):
            if (r, d) not in self.extent:
                changed |= self._forward_dim(op, r, d)
        return changed

    def _forward_dim(self, op: ir.Operation, r: ir.Value, d: int) -> bool:
        if op.name == "kf.reshape":
            x = op.operands[0]
            if not self._found(x) or len(self.dim[r]) > 1:
                return False
            rest = math.prod(s for j, s in enumerate(self._bounded(r)) if j != d)
            shape = self.shape(x)
            static = math.prod(s for s in shape if isinstance(s, int))
            ext = next((s for s in shape if not isinstance(s, int)), None)
            ext = ext if len(self.dim.get(x, ())) <= 1 else None
            if ext is not None and static % rest == 0:  # (x's one run-time extent, times a whole factor)
                return self._set(r, d, ext if static == rest else self._mul(ext, static // rest))
            n = self.numel(x)
            return self._set(r, d, n if rest == 1 else self._div(n, rest))
        if op.name == "kf.slice" and int(self._attrs(op)["dim"]) % len(self._bounded(r)) == d:
            return self._set(r, d, self._slice_length(op))
        if op.name == "kf.concat" and int(self._attrs(op)["dim"]) % len(self._bounded(r)) == d:
            parts = [self._at(o, d) for o in op.operands]
            if any(p is None for p in parts):
                return False
            return self._set(r, d, self._add(*parts))
        for j, o, od in self._pairs(op):
            if j == d and (o, od) in self.extent:
                return self._set(r, d, self.extent[(o, od)])
        return False

    def _backward(self, op: ir.Operation) -> bool:
        if not op.results or op.name == "kf.reshape":
            return False
        r = op.results[0]
        changed = False
        for d in sorted(self.dim.get(r, ())):
            if (r, d) not in self.extent:
                continue
            for j, o, od in self._pairs(op):
                if j == d:
                    changed |= self._set(o, od, self.extent[(r, d)])
        return changed

    def _across(self, op: ir.Operation) -> bool:
        """Between the operands of an index_add: as many indices as the source has rows
        along its dim (an embedding's gradient by positions ``arange(n)`` made in the
        kernel: their count is the gradient's)."""
        if op.name != "kf.index_add":
            return False
        _, index, source = op.operands
        along = int(self._attrs(op)["dim"]) % max(len(self._bounded(source)), 1)
        if 0 not in self.dim.get(index, ()) or along not in self.dim.get(source, ()):
            return False
        if (index, 0) in self.extent and (source, along) not in self.extent:
            return self._set(source, along, self.extent[(index, 0)])
        if (source, along) in self.extent and (index, 0) not in self.extent:
            return self._set(index, 0, self.extent[(source, along)])
        return False

    def _slice_length(self, op: ir.Operation):
        """The run-time length of a slice along its input's run-time dim from the start
        to a bound counted from the end (``x[:, 1:]``, ``x[:, :-1]``: kf.slice's rule,
        dialects.ops.slice_bounds); None until the input's extent is found. A slice from
        a bound counted from the end to one from the start is a ValueError."""
        from kf.dialects.ops import slice_bounds

        x = op.operands[0]
        attrs = self._attrs(op)
        n = self._at(x, int(attrs["dim"]) % len(self._bounded(x)))
        if n is None:
            return None
        start, end, step = int(attrs["start"]), int(attrs["end"]), int(attrs.get("step", 1))
        lo, hi = slice_bounds(start, end, None)
        if lo is None or hi is not None:
            raise ValueError(f"a slice [{start}:{end}] of a run-time dim from its end to a bound from its start")
        length = self._add(n, end - lo + step - 1)
        return length if step == 1 else self._div(length, step)

    # the arithmetic of extents: index values at the top of the kernel (SizeTexts: text)
    def _index(self, n):
        if not isinstance(n, int):
            return n
        with self.sizes._ip():
            return arith.constant(ir.IndexType.get(), n)

    def _mul(self, a, b):
        with self.sizes._ip():
            return arith.muli(self._index(a), self._index(b))

    def _div(self, a, b: int):
        with self.sizes._ip():
            return arith.divui(self._index(a), self._index(b))

    def _add(self, a, b):
        with self.sizes._ip():
            return arith.addi(self._index(a), self._index(b))

    def numel(self, v: ir.Value):
        shape = self.shape(v)
        out = math.prod(s for s in shape if isinstance(s, int))
        for s in shape:
            if not isinstance(s, int):
                out = s if out == 1 else self._mul(out, s)
        return out

    def has(self, v: ir.Value) -> bool:
        return v in self.dim

    def shape(self, v: ir.Value) -> list:
        """v's shape: ints, and its run-time dims as index values."""
        shape = self._bounded(v)
        for d in self.dim.get(v, ()):
            if (v, d) not in self.extent:
                owner = v.owner
                what = owner.name if hasattr(owner, "name") else "an argument"
                raise ValueError(f"the run-time size of a result of {what} is not found from its operands or users")
            shape[d] = self.extent[(v, d)]
        return shape


def _elementwise():
    from .emit import ELEMENTWISE

    return ELEMENTWISE


class SizeTexts(RunTimeShapes):
    """RunTimeShapes over a kernel function with ``?`` dims (not bounded), its extents
    text over its input slots ``a<pos>d<dim>``: what each result's run-time size is in
    terms of the inputs' (``result_texts``), and each input's in terms of the other
    inputs' (``input_texts``), so that the driver can name the size of a buffer between
    two kernels from the kernel that writes it or from one that reads it.
    ``without``: an input position whose slot is not a starting point."""

    def __init__(self, kernel: ir.Operation, without: int = -1):
        self.kernel = kernel
        body = kernel.regions[0].blocks[0]
        dims = {r: set(_run_time_dims(r.type)) for op in body.operations for r in op.operation.results
                if _is_dynamic(r.type)}
        for a in body.arguments:
            if _is_dynamic(a.type):
                dims[a] = set(_run_time_dims(a.type))
        n_in = len(body.arguments)
        slots = {k: (pos, d) for k, (pos, d) in enumerate(slots_of(kernel)) if pos < n_in and pos != without}
        self._solve(kernel, dims, slots, lambda k: f"a{slots[k][0]}d{slots[k][1]}")

    def input_texts(self) -> list[str]:
        """Per kernel input, its run-time size as text over the other inputs' slots (""
        where it has none, or none is found)."""
        out = []
        for pos, a in enumerate(self.args):
            if _dynamic_dim(a.type) < 0:
                out.append("")
                continue
            other = SizeTexts(self.kernel, without=pos)
            out.append(str(other.extent.get((other.args[pos], _dynamic_dim(a.type)), "")))
        return out

    def _bounded(self, v: ir.Value) -> list[int]:
        if not isinstance(v.type, ir.RankedTensorType):
            return []
        t = ir.RankedTensorType(v.type)
        return [BOUND if t.is_dynamic_dim(i) else d for i, d in enumerate(t.shape)]

    def _mul(self, a, b):
        return f"({a})*({b})"

    def _div(self, a, b: int):
        return f"FloorDiv({a}, {b})"

    def _add(self, a, b):
        return f"({a}) + ({b})"

    def result_texts(self) -> list[str]:
        """Per kernel result, its run-time size as text over the input slots ("" where it
        has none, or none is found)."""
        ret = self.ops[-1]
        out = []
        for v in ret.operands:
            e = self.extent.get((v, min(self.dim[v])), "") if v in self.dim else ""
            out.append(str(e))
        return out
