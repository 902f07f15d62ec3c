"""Column sums by slices of rows: the generic strategy's plan for a kernel that sums
values over their leading dims (``mode = "columns"``) -- the last stage of column
partials, where the row kernel wrote the sums of G blocks of rows as ``[G, N]`` f32 and
this kernel adds the G rows (a norm's weight and bias gradients, with their casts), and
the column kernel of a norm's backward at row counts that are not split into blocks, or
of bias + GELU's bias gradient (the summed values an elementwise chain of the kernel's
inputs, which the generic Evaluator computes at each element).

Shape of the kernel (C columns a workgroup, S slices of rows, C x S threads):

    col = block_id.x * C + tid % C            (clamped to the last column: loads stay in)
    s = tid / C
    for each column sum x:                    acc = sum of x[g, col], g = s, s + S, ...
        buf[s][tid % C] = acc; barrier
        total = buf[0][tid % C] + ... + buf[S - 1][tid % C]; barrier
    if s == 0 and col < N: out[col] = f(totals)   (the evaluator's chain: casts, a mean's
                                                   division)

Why: the plain generic plan gives each output column one thread walking all G rows --
N threads in all, each with G loads in sequence, which leaves a GPU mostly idle for N of
a few thousand. Here C x S threads share a block of columns: consecutive threads read
consecutive columns of a row (coalesced), and S times as many threads walk G / S rows
each. The slices' sums are added in a fixed order, so the result does not depend on
scheduling.

The sum of a whole tensor is one column of all its elements: a workgroup of
COLUMNS x SLICES threads, each a slice of the elements, not the plain plan's one thread
looping over all of them (at run-time sizes kf-split-reductions cannot cut the tensor,
so this is its only parallel plan).

Not handled (``column_sums`` returns None, and the plain plan is used): reductions other
than kf.sum and kf.mean over leading dims, sums of values of different shapes, ops other
than elementwise ones, fills and reshapes in the kernel, outputs of another size than
the columns, columns of a run-time count (a position embedding's gradient: a sum over
the batch of each position's row).
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf

from kf.dialects.attrs import op_attrs
from kf.passes import scalar_math as sm

from . import emit as E

#: Columns a workgroup (a warp's worth: a row's loads of a warp are one 128-byte line).
COLUMNS = 32
#: Slices of rows: threads of one column.
SLICES = 8


def column_sums(kernel: ir.Operation) -> tuple[list[ir.Operation], tuple[int, ...], int] | None:
    """(the sum ops, the summed values' shape, leading dims summed) where every output of
    kernel is elementwise ops over sums over the leading dims of elementwise values of
    the kernel's inputs, else None."""
    sums, shape, lead = [], None, None
    for op in E.kernel_ops(kernel):
        if op.name in ("kf.sum", "kf.mean"):
            x = op.operands[0]
            xs = E.shape_of(x)
            dims = sorted({int(d) % max(len(xs), 1) for d in (op_attrs(op).get("dims") or range(len(xs)))})
            full = len(dims) == len(xs) >= 1  # a whole tensor: one column of all its elements
            if (len(xs) < 2 and not full) or dims != list(range(len(dims))) \
                    or not E.elem_of(x).startswith(("f", "bf")):
                return None
            if shape is None:
                shape, lead = xs, len(dims)
            elif (xs, len(dims)) != (shape, lead):
                return None
            sums.append(op)
        elif op.name not in E.ELEMENTWISE and op.name not in ("kf.fill", "kf.reshape"):
            return None
    if not sums:
        return None
    n = math.prod(shape[lead:])
    if any(E.numel(E.shape_of(r)) != n for r in E.kernel_results(kernel)):
        return None
    return sums, shape, lead


def plan(kernel: ir.Operation, target_max_threads: int, max_grid: int) -> dict | None:
    """The columns plan of kernel, or None where ``column_sums`` does not apply or the
    grid would be too large."""
    from . import run_time_sizes

    found = column_sums(kernel)
    if found is None or COLUMNS * SLICES > target_max_threads:
        return None
    if run_time_sizes.results_with_run_time_sizes(kernel):
        return None  # (the plain plan: a thread an output element, over the run-time count)
    _, shape, lead = found
    n = math.prod(shape[lead:])
    # a whole tensor's sum: one column, every thread of the workgroup a slice of it
    columns, slices = (1, COLUMNS * SLICES) if lead == len(shape) else (COLUMNS, SLICES)
    grid = -(-n // columns)
    if grid > max_grid or n == 0 or math.prod(shape[:lead]) == 0:
        return None  # (empty tensors: the plain plan's guards)
    return {"strategy": "generic", "mode": "columns", "block": columns * slices, "columns": columns,
            "slices": slices, "numel": n, "grid": grid, "grid_stride": False}


def emit(ev, kernel: ir.Operation, entry: ir.Block, outputs: list[ir.Value], scratch: ir.Value, plan: dict,
         flat=()) -> None:
    """The kernel's body at the current insertion point (``ev``: the generic Evaluator
    over its inputs, with its run-time shapes where the kernel has run-time sizes: the
    rows summed may be a run-time count; ``scratch``: a workgroup buffer of block f32
    values). No output may have a run-time size (``flat``: which would)."""
    from .generic import count

    if any(flat):
        raise ValueError("a column sum kernel whose outputs have run-time sizes")
    kb = ev.kb
    sums, shape, lead = column_sums(kernel)
    C, S = int(plan["columns"]), int(plan["slices"])
    n = int(plan["numel"])
    cols = shape[lead:]
    tid = gpu.thread_id(gpu.Dimension.x)
    bid = gpu.block_id(gpu.Dimension.x)
    lane = arith.remui(tid, kb.value(C))
    s = arith.divui(tid, kb.value(C))
    col = arith.addi(arith.muli(bid, kb.value(C)), lane)
    col_ok = arith.cmpi(arith.CmpIPredicate.ult, col, kb.value(n))
    at = kb.delinearize(arith.minui(col, kb.value(n - 1)), list(cols))
    f32 = ir.F32Type.get()
    seeded = []
    for op in sums:
        x = op.operands[0]
        t = E.compute_type(E.elem_of(op.results[0]))
        lead_shape = ev.shape(x)[:lead]
        n_rows = ev.numel(lead_shape)
        loop = scf.ForOp(s, kb.value(n_rows), kb.value(S), [sm.const(t, 0.0)])
        with ir.InsertionPoint(loop.body), ev.scope():
            v = ev.value(x, kb.delinearize(loop.induction_variable, list(lead_shape)) + list(at))
            scf.YieldOp([arith.addf(loop.inner_iter_args[0], sm.convert(v, t))])
        memref.store(sm.convert(loop.results[0], f32), scratch, [tid])
        gpu.barrier()
        if S <= SLICES:
            total = None
            for k in range(S):
                part = memref.load(scratch, [arith.addi(lane, kb.value(k * C)) if k else lane])
                total = part if total is None else arith.addf(total, part)
        else:  # a whole tensor's 256 slices: a loop (unrolled, their loads spilled registers)
            add = scf.ForOp(kb.value(0), kb.value(S), kb.value(1), [sm.const(f32, 0.0)])
            with ir.InsertionPoint(add.body):
                at_k = arith.addi(lane, arith.muli(add.induction_variable, kb.value(C)))
                scf.YieldOp([arith.addf(add.inner_iter_args[0], memref.load(scratch, [at_k]))])
            total = add.results[0]
        gpu.barrier()  # the next sum writes the buffer
        total = sm.convert(total, t)
        if op.name == "kf.mean":
            total = arith.divf(total, count(n_rows, t))
        seeded.append((op, total))
    first = arith.andi(col_ok, arith.cmpi(arith.CmpIPredicate.eq, s, kb.value(0)))
    guard = scf.IfOp(first)
    with ir.InsertionPoint(guard.then_block), ev.scope():
        for op, total in seeded:
            ev.seed(op, _index(E.shape_of(op.results[0]), cols, at, kb, col, n), total)
        for value, mem in zip(E.kernel_results(kernel), outputs):
            idx = _index(E.shape_of(value), cols, at, kb, col, n)
            E.store(ev.value(value, idx), mem, idx, kb)
        scf.YieldOp([])


def _index(shape, cols, at, kb, col, n) -> list:
    """The index of column col in a tensor of shape: ``at`` (the column's index in cols)
    where shape is cols with dims of size 1 added or removed -- the same index values, so
    that the evaluator finds a seeded total (a keepdim sum, its cast) --, else col
    delinearized."""
    if [d for d in shape if d != 1] != [d for d in cols if d != 1]:
        return kb.delinearize(arith.minui(col, kb.value(n - 1)), list(shape))
    kept = iter(i for i, d in zip(at, cols) if d != 1)
    return [0 if d == 1 else next(kept) for d in shape]
