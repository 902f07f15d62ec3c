"""The kernel-building toolkit every GPU strategy writes its gpu.func with.

- ``KernelView``: a kernel function as kf-fuse made it (arguments, results, kf ops).
- ``GpuFunc``: a ``gpu.func`` being written: arguments, workgroup buffers (static or
  carved from dynamic shared memory), cached constants at the top of the entry block,
  index arithmetic folded where both sides are known, and scf loops and ifs that carry
  values.
- ``Pointwise``: a kernel function's elementwise ops evaluated at one index, in
  registers (scalar_math gives each op's arithmetic): the prologues and epilogues that
  kf-fuse puts around a matmul, an attention's score chain.
- Tile staging: ``stage_tile`` (element by element, any value), ``VectorStaging``
  (vector loads from an argument read as it lies, and cp.async copies of them on CUDA),
  ``Direct`` and ``direct_source`` (which tiles read an argument as it lies).
- Small helpers the strategies share: ``quad_reduce``, ``store_value``,
  ``gpu_arg_types``, ``unique_results``, ``contiguous_last``, ``elem_bytes``.

Instructions of one vendor (mma.sync, wgmma, mbarriers) are in ``nvidia/``; ``emit.py``
holds the kernel-function queries and element-type helpers this builds on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kf.dialects import BY_NAME, KfTypeError, spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.elements import FP8 as FP8_ELEMS
from kf.dialects.elements import NARROW_INTS
from kf.dialects.types import defining, swaps_last_two
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref, scf

from .base import NotApplicable, TargetInfo
from .emit import compute_type, index_value, memref_type
from .emit import to_storage as emit_to_storage
from .emit import widen as emit_widen
from .run_time_sizes import ragged


WORKGROUP = "#gpu.address_space<workgroup>"

# --------------------------------------------------------------------------- kernel functions


class KernelView:
    """A kernel function as the strategies read it: its arguments, the values it returns
    and its ops, checked to be the shape kf-fuse makes (one block of kf ops ending in
    ``func.return``, statically shaped tensors)."""

    def __init__(self, kernel: ir.Operation):
        kernel = kernel.operation
        if kernel.name != "func.func" or not kernel.regions or not kernel.regions[0].blocks:
            raise NotApplicable("not a kernel function (func.func with a body)")
        self.op = kernel
        self.name = ir.StringAttr(kernel.attributes["sym_name"]).value
        block = kernel.regions[0].blocks[0]
        self.args = list(block.arguments)
        ops = [o.operation for o in block.operations]
        if not ops or ops[-1].name != "func.return":
            raise NotApplicable(f"@{self.name} does not end in func.return")
        self.ops = ops[:-1]
        self.results = list(ops[-1].operands)
        for op in self.ops:
            if not op.name.startswith("kf."):
                raise NotApplicable(f"@{self.name} holds {op.name}, not only kf ops")
        try:
            self.arg_specs = [spec_of(a.type) for a in self.args]
            self.result_specs = [spec_of(r.type) for r in self.results]
        except KfTypeError as e:  # unranked or dynamic tensors
            raise NotApplicable(f"@{self.name}: {e}") from None

    def arg_index(self, v: ir.Value) -> int | None:
        for i, a in enumerate(self.args):
            if a == v:
                return i
        return None


# --------------------------------------------------------------------------- gpu.func


class GpuFunc:
    """A ``gpu.func ... kernel`` being written: arguments (kernel inputs then outputs as
    memrefs), workgroup attributions, the known block size, and cached constants.

    Constants go to the top of the entry block, so they dominate every use wherever the
    builder currently is (inside loops and ifs)."""

    def __init__(self, gpu_module: ir.Operation, name: str, arg_types: Sequence[ir.Type],
                 workgroup: Sequence[ir.Type], block: tuple[int, int, int], dynamic_shared: bool = False):
        body = gpu_module.regions[0].blocks[0]
        ftype = ir.FunctionType.get(list(arg_types), [])
        with ir.InsertionPoint(body):
            self.op = gpu.GPUFuncOp(ftype, sym_name=name, kernel=True, known_block_size=list(block))
        attributions = [] if dynamic_shared else list(workgroup)
        self.entry = self.op.regions[0].blocks.append(*arg_types, *attributions)
        i64 = ir.IntegerType.get_signless(64)
        self.op.attributes["workgroup_attributions"] = ir.IntegerAttr.get(i64, len(attributions))
        if attributions:
            # 16-byte aligned buffers, so 128-bit accesses at 16-byte offsets are legal
            # (convert-gpu-to-nvvm otherwise aligns an attribution to its element only).
            aligned = ir.DictAttr.get({"llvm.align": ir.IntegerAttr.get(i64, 16)})
            self.op.attributes["workgroup_attrib_attrs"] = ir.ArrayAttr.get([aligned] * len(attributions))
        self.args = list(self.entry.arguments)[:len(arg_types)]
        self.shared = list(self.entry.arguments)[len(arg_types):]
        self._consts: dict = {}
        self._first: ir.Operation | None = None
        self.index = ir.IndexType.get()
        self.f32 = ir.F32Type.get()
        #: bytes of dynamic shared memory the launch must give (0: static attributions)
        self.dynamic_shared_bytes = 0
        if dynamic_shared:
            self.shared = self._carve_dynamic_shared(workgroup)

    def _carve_dynamic_shared(self, types: Sequence[ir.Type]) -> list[ir.Value]:
        """The workgroup buffers as views of ``gpu.dynamic_shared_memory`` at 128-byte
        aligned offsets: the way past the 48 KiB of static shared memory (the launch then
        names the size, and the runtime opts the function in)."""
        with ir.InsertionPoint(self.entry):
            window = gpu.dynamic_shared_memory(ir.MemRefType.get(
                [ir.ShapedType.get_dynamic_size()], ir.IntegerType.get_signless(8),
                memory_space=ir.Attribute.parse(WORKGROUP)))
            views, offset = [], 0
            for t in types:
                mt = ir.MemRefType(t)
                views.append(memref.view(t, window, self.c(offset), []))
                offset += -(-math.prod(mt.shape) * elem_bytes(mt.element_type) // 128) * 128
        self.dynamic_shared_bytes = offset
        return views

    def _const_ip(self) -> ir.InsertionPoint:
        return ir.InsertionPoint.at_block_begin(self.entry)

    def c(self, value: int) -> ir.Value:
        """An index constant."""
        key = ("index", int(value))
        if key not in self._consts:
            self._consts[key] = arith.constant(self.index, int(value), ip=self._const_ip())
        return self._consts[key]

    def fconst(self, value: float, t: ir.Type | None = None) -> ir.Value:
        t = t or self.f32
        key = (str(t), float(value).hex())  # -0.0 is not 0.0
        if key not in self._consts:
            self._consts[key] = arith.constant(t, float(value), ip=self._const_ip())
        return self._consts[key]

    def tid(self) -> ir.Value:
        return gpu.thread_id(gpu.Dimension.x)

    def bid(self, dim: str) -> ir.Value:
        return gpu.block_id(getattr(gpu.Dimension, dim))

    # index arithmetic with constant folding at build time where both sides are known
    def add(self, a: ir.Value, b: int | ir.Value) -> ir.Value:
        if isinstance(b, int):
            if b == 0:
                return a
            b = self.c(b)
        return arith.addi(a, b)

    def mul(self, a: ir.Value, b: int) -> ir.Value:
        return a if b == 1 else arith.muli(a, self.c(b))

    def div(self, a: ir.Value, b: int) -> ir.Value:
        return a if b == 1 else arith.divui(a, self.c(b))

    def rem(self, a: ir.Value, b: int) -> ir.Value:
        return self.c(0) if b == 1 else arith.remui(a, self.c(b))

    def lt(self, a: ir.Value, b: int | ir.Value) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ult, a, self.c(b) if isinstance(b, int) else b)

    def all_of(self, conds: Sequence[ir.Value]) -> ir.Value | None:
        out = None
        for c in conds:
            out = c if out is None else arith.andi(out, c)
        return out

    def delinearize(self, linear: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
        """Row-major multi-index of ``linear`` in ``shape``."""
        out = []
        for i, d in enumerate(shape):
            inner = math.prod(shape[i + 1:])
            q = self.div(linear, inner)
            out.append(self.rem(q, d) if i else q)
        return out

    def guarded(self, cond: ir.Value | None, types: Sequence[ir.Type], then: Callable[[], list[ir.Value]],
                otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
        """``cond ? then() : otherwise()`` as an scf.if (``then`` may read memory that is
        out of bounds when cond is false, so a select would not do)."""
        if cond is None:
            return then()
        op = scf.IfOp(cond, list(types), has_else=True)
        with ir.InsertionPoint(op.then_block):
            scf.yield_(then())
        with ir.InsertionPoint(op.else_block):
            scf.yield_(otherwise())
        return list(op.results)

    def when(self, cond: ir.Value | None, body: Callable[[], None]) -> None:
        if cond is None:
            body()
            return
        op = scf.IfOp(cond, [], has_else=False)
        with ir.InsertionPoint(op.then_block):
            body()
            scf.yield_([])

    def loop(self, lb: int | ir.Value, ub: int | ir.Value, step: int, init: Sequence[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
        """scf.for with iter_args; body(iv, carried) returns the next carried values."""
        op = scf.ForOp(*(self.c(b) if isinstance(b, int) else b for b in (lb, ub)), self.c(step), list(init))
        with ir.InsertionPoint(op.body):
            scf.yield_(body(op.induction_variable, list(op.inner_iter_args)))
        return list(op.results)

    def finish(self) -> None:
        with ir.InsertionPoint(self.entry):
            gpu.return_([])


def elem_bytes(t: ir.Type) -> int:
    return {"i64": 8, "f32": 4, "i32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1, "i8": 1}[str(t)]


def workgroup_memref(shape: Sequence[int], elem: ir.Type | None = None) -> ir.MemRefType:
    return ir.MemRefType.get(list(shape), elem or ir.F32Type.get(), memory_space=ir.Attribute.parse(WORKGROUP))


# --------------------------------------------------------------------------- pointwise values


#: kf ops Pointwise evaluates from their operands at one index: the elementwise ops of
#: scalar_math and the index-only layout ops.
_LAYOUT = {"kf.transpose", "kf.broadcast_to"}


def _is_pointwise(op: ir.Operation) -> bool:
    spec = BY_NAME.get(op.name)
    return op.name in _LAYOUT or op.name in ("kf.fill", "kf.iota") or (spec is not None and spec.category == "elementwise")


def pointwise_closure(view: KernelView, roots: Sequence[ir.Value], bound: Sequence[ir.Value]) -> None:
    """Check that every value reachable from ``roots`` (stopping at ``bound`` values and
    at kernel arguments) can be computed one element at a time; raise NotApplicable
    naming the first op that cannot."""
    seen = set()
    stack = list(roots)
    bound_set = set(bound)
    while stack:
        v = stack.pop()
        if v in seen or v in bound_set or view.arg_index(v) is not None:
            continue
        seen.add(v)
        op = defining(v)
        if op is None or not _is_pointwise(op):
            raise NotApplicable(f"{op.name if op else v} is not computed one element at a time")
        if op.name == "kf.constant":
            raise NotApplicable("kf.constant inside a kernel (kf-fuse passes constants as inputs)")
        stack.extend(op.operands)


class Pointwise:
    """Computes a kf value of the kernel function at one index, in registers.

    ``eval(v, index)`` takes ``v``'s own multi-index (one index Value per dimension of
    v). Kernel arguments are loaded from their memrefs; ``kf.fill`` is a constant,
    ``kf.iota`` the index along its dim;
    elementwise ops apply scalar_math to their operands, each evaluated at the
    broadcast of the index (right-aligned, size-1 dims at 0); ``kf.transpose`` permutes
    the index. ``bind`` gives values computed elsewhere (a matmul's accumulator).

    Floats are computed in f32 (f64 stays f64): a ``kf.cast`` to a narrower float
    rounds there and extends back, as torch rounds at the cast. Results are memoized per
    (value, index) so a shared subexpression is computed once per element.
    """

    def __init__(self, g: GpuFunc, view: KernelView, memrefs: Sequence[ir.Value]):
        self.g = g
        self.view = view
        self.memrefs = memrefs  # gpu.func arguments, one per kernel argument
        self.bound: dict = {}
        self.memo: dict = {}
        #: Divide by a constant as a multiply by its reciprocal (one f32 rounding more,
        #: no division: attention's ``scores / sqrt(d)`` per score element).
        self.reciprocal_of_constants = False
        #: argument index -> its value, loaded once (``hoist_scalars``)
        self.scalars: dict = {}
        #: argument index -> the strides of an argument declared flat (run-time strides,
        #: run_time_sizes.py): its loads linearize their index
        self.flat: dict = {}

    def hoist_scalars(self) -> None:
        """Load every rank-0 argument (a scale, an fp8 dequantization factor) here, at
        the insertion point (a kernel's entry), instead of once per use: attention's
        score chain used it per score, a load each in the softmax's dependency chain."""
        for i, spec in enumerate(self.view.arg_specs):
            if not spec.shape:
                self.scalars[i] = self.load_arg(i, [])

    def bind(self, v: ir.Value, scalar: ir.Value) -> None:
        self.bound[v] = scalar

    def reset(self) -> None:
        """Forget memoized values: call when the insertion point leaves their region."""
        self.memo = {}

    def operand_index(self, shape: Sequence[int], index: Sequence[ir.Value], rank: int) -> list[ir.Value]:
        """Index of an operand of ``shape`` into a result of rank ``rank`` at ``index``."""
        lead = rank - len(shape)
        return [self.g.c(0) if d == 1 else index[lead + i] for i, d in enumerate(shape)]

    def load_arg(self, i: int, index: Sequence[ir.Value]) -> ir.Value:
        if i in self.scalars:
            return self.scalars[i]
        spec = self.view.arg_specs[i]
        if i in self.flat:
            index = [linearize(self.g, index, self.flat[i])]
        v = memref.load(self.memrefs[i], list(index) if spec.shape else [])
        if spec.elem == "i1" and v.type != ir.IntegerType.get_signless(1):  # a boolean stored as a byte
            return arith.cmpi(arith.CmpIPredicate.ne, v, scalar_math.const(v.type, 0))
        if spec.elem in FP8_ELEMS:  # NVVM lowers no fp8 extf: decode the byte (exact)
            return emit_widen(v)
        return emit_widen(v, spec.elem)

    def eval(self, v: ir.Value, index: Sequence[ir.Value]) -> ir.Value:
        if v in self.bound:
            return self.bound[v]
        key = (v, tuple(index))
        if key in self.memo:
            return self.memo[key]
        out = self._eval(v, list(index))
        self.memo[key] = out
        return out

    def _eval(self, v: ir.Value, index: list[ir.Value]) -> ir.Value:
        spec = spec_of(v.type)
        i = self.view.arg_index(v)
        if i is not None:
            return self.load_arg(i, index)
        op = defining(v)
        attrs = op_attrs(op)
        ct = compute_type(spec.elem)
        if op.name == "kf.fill":
            return scalar_math.const(ct, attrs["value"])
        if op.name == "kf.iota":
            return index_value(index[int(attrs["dim"]) % len(index)], ct)
        if op.name == "kf.transpose":
            perm = attrs["perm"]
            inner = [None] * len(perm)
            for k, p in enumerate(perm):
                inner[p] = index[k]
            return self.eval(op.operands[0], inner)
        if op.name == "kf.broadcast_to":
            x = op.operands[0]
            return self.eval(x, self.operand_index(spec_of(x.type).shape, index, spec.rank))
        args = [self.eval(x, self.operand_index(spec_of(x.type).shape, index, spec.rank)) for x in op.operands]
        name = op.name.removeprefix("kf.")
        if name == "cast":
            src = args[0]
            if scalar_math.is_float(src.type) and spec.is_float:
                if spec.elem in ("f32", "f64") or str(src.type) == spec.elem:
                    return scalar_math.convert(src, ct)
                if spec.elem in FP8_ELEMS:  # through the byte: SPIR-V has no fp8 values
                    from .emit import round_to

                    return scalar_math.convert(round_to(src, spec.elem), ct)
                return scalar_math.convert(scalar_math.convert(src, ir.Type.parse(spec.elem)), ct)
            if spec.elem in NARROW_INTS:  # wraps: the low bits, extended back
                from .emit import round_to

                return round_to(src, spec.elem)
            return scalar_math.convert(src, ct)
        if name in ("add", "sub", "mul", "div", "max", "min", "pow", "cmp", "select"):
            # kf's operands have one element type; after extension they may differ (an
            # f32 argument beside an f16 computed value is impossible, but f64 beside
            # f32 compute types is not): bring them to the widest.
            first = 1 if name == "select" else 0
            types = {str(a.type) for a in args[first:]}
            if len(types) > 1:
                wide = ir.F64Type.get() if "f64" in types else ir.F32Type.get()
                args = args[:first] + [scalar_math.convert(a, wide) for a in args[first:]]
        if name == "div" and self.reciprocal_of_constants:
            c = float_constant(args[1])
            if c:
                return arith.mulf(args[0], self.g.fconst(1.0 / c, args[1].type))
        try:
            return scalar_math.emit(name, args, attrs)
        except ValueError as e:
            raise NotApplicable(str(e)) from None


def float_constant(v: ir.Value) -> float | None:
    """The value of an arith.constant float scalar, else None."""
    op = defining(v)
    if op is None or op.name != "arith.constant" or not isinstance(v.type, (ir.F32Type, ir.F64Type)):
        return None
    return ir.FloatAttr(op.attributes["value"]).value


#: Passes of a tile copy written out in straight-line code rather than an scf.for: unrolled,
#: LLVM folds the per-pass index arithmetic into constant offsets (attention at head_dim 64
#: on sm_90: 80 registers unrolled, 128 and a spill as a loop).
UNROLL_STAGING = 64


@dataclass
class Direct:
    """A tile source that is a kernel argument read as it is: tile element (r, c) is
    ``mem[lead + (c, r if swapped else r, c)]``. Only such sources are loaded with vectors:
    anything computed goes element by element through Pointwise."""

    mem: ir.Value
    lead: list
    swapped: bool
    #: the argument's strides where it is declared flat (run-time strides, see
    #: run_time_sizes.py: ints and index values), else None
    strides: list | None = None
    #: the argument's last dim where it is declared flat
    last: int = 0

    @property
    def contiguous(self) -> int:
        """Which tile coordinate (0: r, 1: c) walks the argument's contiguous last dim."""
        return 0 if self.swapped else 1

    @property
    def extent(self) -> int:
        return self.last if self.strides is not None else ir.MemRefType(self.mem.type).shape[-1]

    def at(self, g: "GpuFunc", index: list) -> list:
        """The memref index of the argument's element at ``lead + index``."""
        full = self.lead + index
        return full if self.strides is None else [linearize(g, full, self.strides)]


def direct_source(view: KernelView, memrefs: Sequence[ir.Value], value: ir.Value, lead: list,
                  tile_swapped: bool, flat: dict | None = None) -> Direct | None:
    """The Direct source of a tile whose element (r, c) is ``value[lead + (r, c)]`` (or
    ``(c, r)`` with tile_swapped), when value is an argument or an argument with its last
    two dims swapped by a kf.transpose; else None. ``flat``: argument index -> strides of
    the arguments declared flat (``Pointwise.flat``)."""
    swapped = tile_swapped
    op = defining(value)
    if op is not None and op.name == "kf.transpose":
        if not swaps_last_two(op_attrs(op)["perm"]):
            return None
        value, swapped = op.operands[0], not swapped
    i = view.arg_index(value)
    if i is None or view.arg_specs[i].rank < 2:
        return None
    if flat and i in flat:
        return Direct(memrefs[i], list(lead), swapped, list(flat[i]), view.arg_specs[i].shape[-1])
    return Direct(memrefs[i], list(lead), swapped)


def stage_tile(g: GpuFunc, pw: Pointwise, tid: ir.Value, threads: int, tile: ir.Value, rows: int, cols: int,
               fast_is_col: bool, row0: ir.Value | int, n_rows: int | ir.Value, col0: ir.Value | int,
               n_cols: int | ir.Value,
               read: Callable[[ir.Value, ir.Value], ir.Value], transposed: bool = False,
               direct: Direct | None = None, vector_bytes: int = 0, run_time_vectors: bool = False) -> None:
    """Copy a rows x cols block of a value into workgroup memory, converted to the
    tile's element type (f32 for the SIMT kernels, f16/bf16 for tensor-core operands):
    ``tile[r][c] = read(row0 + r, col0 + c)`` (``tile[c][r]`` when transposed), zero where
    the row or column is at or past n_rows / n_cols (the tails).

    The threads walk the block linearly, consecutive threads along the columns when
    the source is contiguous along them (``fast_is_col``), else along the rows, so the
    global reads coalesce. Whole passes of all threads run in an scf.for; a last partial
    pass is guarded by the thread's position. ``n_rows`` or ``n_cols`` may be a run-time
    size (an index value): every row (column) is then guarded, and the reads are scalars
    unless ``run_time_vectors`` (``direct`` then addresses the argument as it is
    declared, flat or not: vector loads as at static sizes)."""
    dynamic = not isinstance(n_rows, int) or not isinstance(n_cols, int)
    staging = None if dynamic and not run_time_vectors else VectorStaging(
        g, tid, threads, tile, rows, cols, n_rows, n_cols, transposed, direct, vector_bytes)
    if staging is not None and staging.ok:
        staging.store(staging.load(row0, col0))
        return
    total = rows * cols
    elem = ir.MemRefType(tile.type).element_type
    if str(elem) in FP8_ELEMS:  # fp8 tiles (tensor-core operands): rounded and zeroed through bytes
        zero = arith.bitcast(elem, arith.constant(ir.IntegerType.get_signless(8), 0))
    else:
        zero = g.fconst(0.0, elem)

    def one(lin: ir.Value) -> None:
        if fast_is_col:
            rr, cc = g.div(lin, cols), g.rem(lin, cols)
        else:
            rr, cc = g.rem(lin, rows), g.div(lin, rows)
        gr, gc = g.add(rr, row0) if isinstance(row0, int) else arith.addi(row0, rr), \
            g.add(cc, col0) if isinstance(col0, int) else arith.addi(col0, cc)
        cond = g.all_of([c for c in (g.lt(gr, n_rows) if ragged(n_rows, rows) else None,
                                     g.lt(gc, n_cols) if ragged(n_cols, cols) else None) if c is not None])

        def value():
            pw.reset()
            v = read(gr, gc)
            return [emit_to_storage(v, elem) if str(elem) in FP8_ELEMS else scalar_math.convert(v, elem)]

        val = g.guarded(cond, [elem], value, lambda: [zero])[0]
        memref.store(val, tile, [cc, rr] if transposed else [rr, cc])

    _passes(g, tid, threads, total, one)


def staging_vector_bytes(target: TargetInfo) -> int:
    """Bytes per staging load that plans record: the target's widest access on CUDA; 0
    (scalars) for SPIR-V, where kf-to-spirv splits vector accesses into scalars anyway
    (Vulkan's logical pointers) and refuses bf16 vectors."""
    return target.vector_bytes if target.name == "cuda" else 0


def _passes(g: GpuFunc, tid: ir.Value, threads: int, total: int, one: Callable[[ir.Value], None]) -> None:
    full, rest = divmod(total, threads)
    if full <= UNROLL_STAGING:
        for e in range(full):
            one(g.add(tid, e * threads))
    else:
        def body(e, carried):
            one(arith.addi(tid, e))
            return []

        g.loop(0, full * threads, threads, [], body)
    if rest:
        lin = g.add(tid, full * threads)
        g.when(g.lt(lin, total), lambda: one(lin))


class VectorStaging:
    """Staging of a tile from a Direct source with vector loads of ``vector_bytes``
    along the argument's contiguous dim, split into ``load`` (global memory to
    registers) and ``store`` (registers to the tile), so that a kernel can issue the
    loads of the next tile before computing on the current one (register prefetch).

    Usable (``ok``) when the argument's rows and the tile's extent along that dim are
    whole vectors (tails are then whole vectors too), the element types allow it and a
    thread's share is a few passes. Each thread's slots (tile positions) are computed
    once, where the object is made. Stores are vectors too where the tile's rows are
    contiguous along the same dim and 16-byte aligned. ``n_rows`` or ``n_cols`` may be a
    run-time size (an index value), which is then always guarded."""

    def __init__(self, g: GpuFunc, tid: ir.Value, threads: int, tile: ir.Value, rows: int, cols: int,
                 n_rows: int | ir.Value, n_cols: int | ir.Value, transposed: bool, direct: Direct | None,
                 vector_bytes: int):
        self.g, self.tile, self.rows, self.cols = g, tile, rows, cols
        self.n_rows, self.n_cols, self.transposed, self.direct = n_rows, n_cols, transposed, direct
        self.ok = False
        if direct is None or not vector_bytes:
            return
        src_elem = ir.MemRefType(direct.mem.type).element_type
        tile_t = ir.MemRefType(tile.type)
        dst_elem = tile_t.element_type
        widths = {"f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1, "i8": 1}
        if str(src_elem) not in widths or (src_elem != dst_elem and str(dst_elem) != "f32") or \
                (str(src_elem) in FP8_ELEMS and src_elem != dst_elem):  # fp8 widens through integers only
            return
        self.width = widths[str(src_elem)]
        vec = vector_bytes // self.width
        along = cols if direct.contiguous == 1 else rows
        total = rows * cols // max(vec, 1)
        full, rest = divmod(total, threads)
        if vec < 2 or direct.extent % vec or along % vec or full + bool(rest) > UNROLL_STAGING:
            return
        if not isinstance(n_rows if direct.contiguous == 0 else n_cols, int):
            return  # a run-time extent along the vectors: the last may be partial
        self.ok, self.vec = True, vec
        self.src_t, self.dst_t = ir.VectorType.get([vec], src_elem), ir.VectorType.get([vec], dst_elem)
        dst_width = widths[str(dst_elem)]
        lands_in_row = (direct.contiguous == 1) != transposed
        self.vector_store = lands_in_row and (tile_t.shape[-1] * dst_width) % 16 == 0 and vec * dst_width == 16
        # the tile coordinate (in store order) that a vector's elements walk
        self.moving = direct.contiguous if not transposed else 1 - direct.contiguous
        self.slots = []
        for e in range(full + bool(rest)):
            lin = g.add(tid, e * threads)
            if direct.contiguous == 1:
                rr, cc = g.div(lin, cols // vec), g.mul(g.rem(lin, cols // vec), vec)
            else:
                rr, cc = g.mul(g.rem(lin, rows // vec), vec), g.div(lin, rows // vec)
            self.slots.append((rr, cc, g.lt(lin, total) if e == full else None))

    def load(self, row0: ir.Value | int, col0: ir.Value | int, guard_all: bool = False) -> list[ir.Value]:
        """This thread's vectors of the tile at (row0, col0), zero outside the argument.
        ``guard_all`` checks both bounds even where the tile divides them (a prefetch
        past the last tile)."""
        from mlir.dialects import vector

        g, d = self.g, self.direct
        if self.width == 1:  # fp8: zero bytes, bitcast (NVVM lowers no fp8 constants)
            i8s = ir.VectorType.get([self.vec], ir.IntegerType.get_signless(8))
            zero = arith.bitcast(self.src_t, arith.constant(i8s, ir.DenseElementsAttr.get_splat(
                i8s, ir.IntegerAttr.get(ir.IntegerType.get_signless(8), 0))))
        else:
            zero = arith.constant(self.src_t, ir.DenseElementsAttr.get_splat(
                self.src_t, ir.FloatAttr.get(self.src_t.element_type, 0.0)))
        out = []
        for rr, cc, in_tile in self.slots:
            gr = g.add(rr, row0) if isinstance(row0, int) else arith.addi(row0, rr)
            gc = g.add(cc, col0) if isinstance(col0, int) else arith.addi(col0, cc)
            row_tail = guard_all or ragged(self.n_rows, self.rows)
            col_tail = guard_all or ragged(self.n_cols, self.cols)
            cond = g.all_of([c for c in (in_tile, g.lt(gr, self.n_rows) if row_tail else None,
                                         g.lt(gc, self.n_cols) if col_tail else None) if c is not None])
            index = d.at(g, [gc, gr] if d.swapped else [gr, gc])
            out.append(g.guarded(cond, [self.src_t], lambda index=index: [
                vector.load(self.src_t, d.mem, index, alignment=self.vec * self.width)], lambda: [zero])[0])
        return out

    @property
    def copies_async(self) -> bool:
        """Whether ``copy_async`` can stage this tile: each vector is 16 bytes that land
        unchanged and contiguous in a tile row (cp.async copies bytes; it neither converts
        nor scatters)."""
        return self.ok and self.vector_store and self.src_t == self.dst_t and self.vec * self.width == 16

    def copy_async(self, row0: ir.Value | int, col0: ir.Value | int, tile_row0: ir.Value | int = 0,
                   place: Callable[[list], list] | None = None) -> None:
        """Issue this thread's share of the tile at (row0, col0) as ``cp.async.cg`` copies
        of 16 bytes into the tile, its rows offset by ``tile_row0`` (a pipeline stage of a
        stacked tile). Vectors outside the argument copy 0 bytes, which zero-fills them,
        from a clamped in-bounds address. The caller commits and waits
        (``nvvm.cp.async.commit.group`` / ``wait.group``). ``place`` maps a vector's
        tile position to where it lands (a swizzle)."""
        from mlir.dialects import nvgpu

        g, d = self.g, self.direct
        for rr, cc, in_tile in self.slots:
            gr = g.add(rr, row0) if isinstance(row0, int) else arith.addi(row0, rr)
            gc = g.add(cc, col0) if isinstance(col0, int) else arith.addi(col0, cc)
            cond = g.all_of([g.lt(gr, self.n_rows), g.lt(gc, self.n_cols)])
            gr, gc = arith.select(cond, gr, g.c(0)), arith.select(cond, gc, g.c(0))
            n = arith.select(cond, g.c(self.vec), g.c(0))
            index = d.at(g, [gc, gr] if d.swapped else [gr, gc])
            at = [cc, rr] if self.transposed else [rr, cc]
            if place is not None:
                at = place(at)
            at[0] = g.add(at[0], tile_row0) if isinstance(tile_row0, int) else arith.addi(at[0], tile_row0)

            def copy(at=at, index=index, n=n):
                nvgpu.device_async_copy(self.tile, at, d.mem, index, ir.IntegerAttr.get(
                    ir.IndexType.get(), self.vec), src_elements=n, bypass_l1=True)

            g.when(in_tile, copy)

    def store(self, values: Sequence[ir.Value]) -> None:
        """Write what ``load`` returned into the tile (converted to its element type)."""
        from mlir.dialects import vector

        g = self.g
        for (rr, cc, in_tile), v in zip(self.slots, values):
            def write(v=v, rr=rr, cc=cc):
                if self.dst_t != self.src_t:
                    v = arith.extf(self.dst_t, v)
                at = [cc, rr] if self.transposed else [rr, cc]
                if self.vector_store:
                    vector.store(v, self.tile, at, alignment=16)
                    return
                for k in range(self.vec):
                    pos = list(at)
                    pos[self.moving] = g.add(pos[self.moving], k)
                    memref.store(vector.ExtractOp(v, [], [k]).result, self.tile, pos)

            g.when(in_tile, write)


def quad_reduce(x: ir.Value, combine) -> ir.Value:
    """Combine x over the 4 lanes of a quad (lanes 4 gid .. 4 gid + 3), with xor shuffles."""
    i32 = ir.IntegerType.get_signless(32)
    for off in (1, 2):
        y = gpu.shuffle(x, arith.constant(i32, off), arith.constant(i32, 32), gpu.ShuffleMode.XOR)[0]
        x = combine(x, y)
    return x


def linearize(g: GpuFunc, index: Sequence[ir.Value], strides: Sequence[ir.Value | int]) -> ir.Value:
    """The flat index of ``index`` under ``strides`` (ints or index values)."""
    out = None
    for i, st in zip(index, strides):
        term = g.mul(i, st) if isinstance(st, int) else arith.muli(i, st)
        out = term if out is None else arith.addi(out, term)
    return out if out is not None else g.c(0)


def store_value(v: ir.Value, mem: ir.Value, index: Sequence[ir.Value]) -> None:
    """Store a computed value, rounded once to the memref's element type (booleans as
    bytes where the target keeps them so)."""
    memref.store(emit_to_storage(v, ir.MemRefType(mem.type).element_type), mem, list(index))


def gpu_arg_types(view: KernelView, target: TargetInfo) -> list[ir.Type]:
    """The gpu.func argument types: inputs then outputs, in the target's storage types."""
    return [memref_type(s, target.name) for s in [*view.arg_specs, *view.result_specs]]


def unique_results(view: KernelView) -> None:
    seen = set()
    for r in view.results:
        if r in seen:
            raise NotApplicable("a value returned twice")
        if view.arg_index(r) is not None:
            raise NotApplicable("a kernel argument returned as a result")
        seen.add(r)


def contiguous_last(view: KernelView, v: ir.Value) -> bool:
    """Whether the last dim of v is the innermost dimension of the memory it is read
    from: false when v is a kf.transpose that swaps the last two dims of an argument."""
    op = defining(v)
    if op is not None and op.name == "kf.transpose":
        perm = op_attrs(op)["perm"]
        r = len(perm)
        return not (r >= 2 and perm[-1] == r - 2 and perm[-2] == r - 1)
    return True
