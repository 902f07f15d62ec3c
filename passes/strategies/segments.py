"""index_add by sorted segments: the generic strategy's path for a long index.

The generic strategy computes index_add's output element (.., v, ..) by walking the whole
index and adding the sources whose index is v: len(index) steps an output element. An
embedding's gradient (32000 x 2048 outputs from 2048 tokens) is then 1.3e11 steps, most
of a Llama training step. Here a prelude kernel (``EmittedKernel.prelude``) sorts the
index once, stably: thread t ranks index[t] by the indices that sort before it (smaller,
or equal at an earlier position) and writes the key and t at that rank into a table; the
first position of each key also writes its output row's segment (start and length). The
main kernel's element v reads its row's segment (three loads, the same for a whole output
row) and adds only the sources in it, in index order: the walk's sum, bit for bit, in the
same compute type. Rows the index never names are not written: their entry holds whatever
the buffer held, and an entry is taken only where the sorted key at its start equals the
row, which for such a row no key does.

Bounds: an out-of-range index keeps its value in the table and, sorted, lies first or
last; the main kernel checks the first and the last key against the dimension
(``emit.IndexChecks``, the walk's site), so the program raises the walk's IndexError.

Taken (``plan["segments"]``) for a kernel with one index_add whose 1-D index has at least
``MIN_INDICES`` elements (or a run-time number of them) and no more than its input, and
whose index is computed without reading through another index (the prelude has no error
flag). With run-time sizes the table is sized at the bound of the index's length and
filled up to its run-time length.
"""

from __future__ import annotations

from kf.dialects.attrs import op_attrs
from kf.dialects.types import TensorSpec, normalize_dim
from kf.passes import scalar_math as sm
from mlir import ir
from mlir.dialects import arith, memref, scf

from . import emit as E
from . import run_time_sizes
from .base import EmittedKernel, TargetInfo

#: the shortest index sorted into segments: below it the walk costs about what the sort does
MIN_INDICES = 64

#: threads a workgroup of the sorting prelude
THREADS = 256


def _reads_through_index(v: ir.Value) -> bool:
    """Whether computing v reads through an index (gather and the like, whose checks
    need the program's error flag)."""
    seen, todo = set(), [v]
    while todo:
        owner = todo.pop().owner
        if isinstance(owner, ir.Block):
            continue
        op = owner.operation if hasattr(owner, "operation") else owner
        if id(op) in seen:
            continue
        seen.add(id(op))
        if op.name in E.INDEXING_OPS:
            return True
        todo.extend(op.operands)
    return False


def segment_op(kernel: ir.Operation) -> ir.Operation | None:
    """The kernel function's index_add to sort into segments, or None."""
    adds = [op for op in E.kernel_ops(kernel) if op.name == "kf.index_add"]
    if len(adds) != 1:
        return None
    op = adds[0]
    x, index, _ = op.operands
    shape, x_shape = E.shape_of(index), E.shape_of(x)
    if len(shape) != 1:
        return None
    # a run-time length (negative here, before kf-map-to-gpu bounds it) is taken as long
    if shape[0] >= 0 and (shape[0] < MIN_INDICES or (min(x_shape) >= 0 and shape[0] > E.numel(x_shape))):
        return None
    if E.elem_of(index) not in ("i32", "i64") or _reads_through_index(index):
        return None
    return op


def _rows(op: ir.Operation) -> int:
    """The rows index_add writes along: its input's size in ``dim``."""
    x = op.operands[0]
    return E.shape_of(x)[normalize_dim(int(op_attrs(op)["dim"]), len(E.shape_of(x)))]


def table_spec(op: ir.Operation) -> TensorSpec:
    """The prelude's table, [2, n + rows]: the sorted keys (row 0) and their positions in
    the index (row 1), then per output row v its segment's start (row 0) and length
    (row 1), written only for the rows the index names."""
    index = op.operands[1]
    return TensorSpec((2, E.shape_of(index)[0] + _rows(op)), E.elem_of(index))


def table_type(op: ir.Operation) -> ir.RankedTensorType:
    """``table_spec`` as the tensor type kf-map-to-gpu schedules the prelude with."""
    spec = table_spec(op)
    return ir.RankedTensorType.get(list(spec.shape), E.compute_type(spec.elem))


def emit_table(kernel: ir.Operation, op: ir.Operation, gpu_module: ir.Operation, target: TargetInfo,
               evaluator, slots=(), flat=()) -> EmittedKernel:
    """The prelude kernel: thread t writes index[t] and t at index[t]'s stable rank.
    ``evaluator``: makes the generic strategy's Evaluator (kb, inputs) for the index's
    values. ``slots``: the (bounded) kernel function's run-time sizes, ``flat`` which of
    its inputs are flat buffers: the prelude takes the inputs' slots, its table is sized
    at the bound and filled up to the run-time length."""
    ins, _ = E.kernel_signature(kernel)
    index = op.operands[1]
    n = E.shape_of(index)[0]
    name = f"{E.kernel_name(kernel)}_segments"
    block = min(THREADS, target.max_threads)
    grid = -(-n // block)
    slots = [tuple(s) for s in slots if s[0] < len(ins)]
    _, entry = E.make_gpu_func(gpu_module, name, ins, [table_spec(op)], [block], kernel.location,
                               target=target.name, sizes=len(slots), flat=[*flat, False] if slots else [])
    args = list(entry.arguments)
    table = args[len(ins)]
    with kernel.location, ir.InsertionPoint(entry):
        kb = E.IndexBuilder(entry)
        ev = evaluator(kb, args[:len(ins)])
        if slots:
            ev.shapes = run_time_sizes.RunTimeShapes(kernel, run_time_sizes.SizeSlots(entry, args[-1], slots))
            ev.flat = list(flat)
            n_run = ev.shape(index)[0]
        else:
            n_run = n

        rows = _rows(op)

        def body(t):
            with ev.scope():
                key = ev.value(index, [t])
                one, zero = kb.value(1), kb.value(0)

                def step(i, c):
                    other = ev.value(index, [i])
                    less = arith.cmpi(arith.CmpIPredicate.slt, other, key)
                    same = arith.cmpi(arith.CmpIPredicate.eq, other, key)
                    earlier = arith.andi(same, kb.lt(i, t))
                    return [arith.addi(c[0], arith.select(less, one, zero)),
                            arith.addi(c[1], arith.select(earlier, one, zero)),
                            arith.addi(c[2], arith.select(same, one, zero))]

                less, earlier, same = ev.loop(n_run, [zero, zero, zero], step)
                rank = arith.addi(less, earlier)
                memref.store(key, table, [kb.value(0), rank])
                memref.store(arith.index_cast(key.type, t), table, [kb.value(1), rank])
                # the first of its keys writes its row's segment (a key out of range has none)
                inside = arith.andi(arith.cmpi(arith.CmpIPredicate.sge, key, kb.const(key.type, 0)),
                                    arith.cmpi(arith.CmpIPredicate.slt, key, kb.const(key.type, rows)))
                write = scf.IfOp(arith.andi(kb.eq(earlier, 0), inside))
                with ir.InsertionPoint(write.then_block):
                    at = kb.add(kb.from_int(key), n)
                    memref.store(arith.index_cast(key.type, rank), table, [kb.value(0), at])
                    memref.store(arith.index_cast(key.type, same), table, [kb.value(1), at])
                    scf.YieldOp([])

        E.for_each_thread_item(kb, n_run, block, grid, False, body)
        E.finish(entry)
    run_time = {"sizes": tuple(slots), "grid_sizes": (str(grid), "1", "1")} if slots else {}
    return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, {"strategy": "generic", "mode": "segments"},
                         **run_time)


def segment_sum(ev, op: ir.Operation, idx: list, dim: int, table: ir.Value) -> list[ir.Value]:
    """index_add's element idx from the sorted table: its input there plus the sources of
    the keys equal to idx[dim] (``dim`` normalized), in index order."""
    kb = ev.kb
    x, index, source = op.operands
    n = E.shape_of(index)[0]
    n_run = ev.shape(index)[0]  # the run-time length (at least 1), or n
    bound = E.shape_of(x)[dim]
    key_t = ir.MemRefType(table.type).element_type
    first = memref.load(table, [kb.value(0), kb.value(0)])
    last = memref.load(table, [kb.value(0), kb.value(kb.sub(n_run, 1))])
    ev.checks.verify(op, first, bound, dim)
    ev.checks.verify(op, last, bound, dim)
    # the row's segment: where the prelude wrote it, its start names a key equal to the
    # row; a row the index never names holds whatever the buffer held, which names none
    row = kb.add(idx[dim], n)
    start = arith.minui(kb.from_int(memref.load(table, [kb.value(0), kb.value(row)])), kb.value(kb.sub(n_run, 1)))
    v = idx[dim]
    v = kb.const(key_t, v) if isinstance(v, int) else arith.index_cast(key_t, v)
    named = arith.cmpi(arith.CmpIPredicate.eq, memref.load(table, [kb.value(0), start]), v)
    length = arith.minui(kb.from_int(memref.load(table, [kb.value(1), kb.value(row)])), kb.value(n))

    def step(i, c):
        pos = kb.from_int(memref.load(table, [kb.value(1), arith.addi(start, i)]))
        at = list(idx)
        at[dim] = pos
        return [sm.emit("add", [c[0], ev.value(source, at)])]

    trips = arith.select(named, length, kb.value(0))
    return ev.loop(trips, [ev.value(x, idx)], step)
