"""The ``matmul`` strategy: a batched ``kf.matmul`` and the elementwise ops that consume
its result (bias add, GELU, scale, cast), as one tiled GEMM kernel.

What the kernel does, and why:

- One workgroup computes a BLOCK_M x BLOCK_N tile of one batch element (grid x: column
  tiles, y: row tiles, z: the flattened broadcast batch). Each thread owns a
  THREAD_M x THREAD_N register tile of f32 accumulators, whatever the element type
  (kf's precision policy: low-precision inputs, f32 accumulation, one rounding when stored).
- The K loop stages an A tile (BLOCK_K x BLOCK_M, stored k-major with one word of row
  padding so the transposing stores do not all land in one bank) and a B tile
  (BLOCK_K x BLOCK_N) in workgroup memory, with a barrier before the loads (the previous
  step's readers are done) and one after (the tile is complete). Out-of-range elements
  are loaded as zero, so the K tail needs no special inner loop.
- A thread's rows and columns are strided (row ``tr + i * BLOCK_M / THREAD_M``), so a warp
  reads consecutive B words (no bank conflicts), broadcasts A words, and stores
  consecutive output columns (coalesced).
- The epilogue is evaluated per output element by ``Pointwise`` over the kernel
  function's own ops (scalar_math gives each op's arithmetic), so any elementwise chain
  kf-fuse puts after the matmul -- with operands that broadcast to the output, such as a
  bias row -- is computed in registers and only the final values are stored; every
  output row/column is guarded for the M and N tails.

The operands of the matmul are also evaluated through ``Pointwise`` while the tiles are
loaded, so ``x @ w.T`` (a kf.transpose of an argument) and broadcast batch dims read the
arguments directly; no transposed copy is made. Tiles read straight from an argument
are loaded with 128-bit vectors on CUDA when the rows allow it (``VectorStaging``).

On CUDA with f16/bf16 operands the plan takes the tensor cores instead
(``_emit_mma``): mma.sync m16n8k16 from A/B tiles kept in the input type, the same
epilogue on the f32 accumulators. Measured on an H200 (2026-12-02, 4096^3 with
bias + GELU): 76 TFLOP/s against cuBLAS + two torch kernels at 560 (the SIMT f32 GEMM:
36 against 50); at 257x65x129 the one fused kernel takes 10 us, torch's three 40-50 us.
Since then: fragments by ldmatrix with B staged as it lies in memory (the transposed B
stores had been 16-way bank conflicts) and a register prefetch of the next K tiles
(``MMA_PREFETCH``): 8192^3 bf16 went from 14.3 ms to 4.05 ms (271 TFLOP/s, 0.35x
cuBLAS; bench/variants.py). Then a multi-stage cp.async pipeline and 64x64 warp
tiles (3.38 ms, 0.45x), and on sm_90a Hopper's wgmma (``wgmma.py``, which ``_mma_plan``
asks first): 8192^3 bf16 1.65-1.69 ms, 0.87x cuBLAS (nn) and 1.03x (B transposed), fp8
0.99 ms (2026-12-03). mma.sync stays for sm_80/sm_89/sm_90 and where wgmma's layouts do
not apply. Not used: TMA (the tiles come by cp.async).

This module also holds the IR-building helpers that the attention strategy shares and
that ``emit.py`` (the shared helpers, which this imports its types from) does not offer:
a gpu.func with workgroup attributions and scf loops/ifs with carried values
(``GpuFunc``), the evaluation of a kernel function's elementwise ops at one index
(``Pointwise``), tile staging (``stage_tile``, ``VectorStaging``) and the mma.sync
operand packing (``MmaSync``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kf.dialects import BY_NAME, KfTypeError, spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import defining, swaps_last_two
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref, scf
from mlir.dialects import math as mmath

from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .emit import compute_type, memref_type
from .emit import to_storage as emit_to_storage
from .emit import widen as emit_widen

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
                offset += -(-math.prod(mt.shape) * _elem_bytes(mt.element_type) // 128) * 128
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
        key = (str(t), float(value) if not math.isnan(value) else "nan")
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

    def lt(self, a: ir.Value, b: int) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ult, a, self.c(b))

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

    def loop(self, lb: int, ub: int, step: int, init: Sequence[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
        """scf.for with iter_args; body(iv, carried) returns the next carried values."""
        op = scf.ForOp(self.c(lb), self.c(ub), self.c(step), list(init))
        with ir.InsertionPoint(op.body):
            scf.yield_(body(op.induction_variable, list(op.inner_iter_args)))
        return list(op.results)

    def finish(self) -> None:
        with ir.InsertionPoint(self.entry):
            gpu.return_([])


def _elem_bytes(t: ir.Type) -> int:
    return {"i64": 8, "f32": 4, "i32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1, "i8": 1}[str(t)]


def workgroup_memref(shape: Sequence[int], elem: ir.Type | None = None) -> ir.MemRefType:
    return ir.MemRefType.get(list(shape), elem or ir.F32Type.get(), memory_space=ir.Attribute.parse(WORKGROUP))


# --------------------------------------------------------------------------- pointwise values


#: kf ops Pointwise evaluates from their operands at one index: the elementwise ops of
#: scalar_math and the index-only layout ops.
_LAYOUT = {"kf.transpose", "kf.broadcast_to"}


def _is_pointwise(op: ir.Operation) -> bool:
    spec = BY_NAME.get(op.name)
    return op.name in _LAYOUT or op.name == "kf.fill" or (spec is not None and spec.category == "elementwise")


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
    v). Kernel arguments are loaded from their memrefs; ``kf.fill`` is a constant;
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
        #: argument index -> (workgroup tile, place): that argument's element at an
        #: index is read from ``tile[place(index)]`` (staged by the kernel: an attention
        #: mask's block) instead of from global memory.
        self.tiles: dict = {}
        #: argument index -> its value, loaded once (``hoist_scalars``)
        self.scalars: dict = {}

    def hoist_scalars(self) -> None:
        """Load every rank-0 argument (a scale, an fp8 dequantization factor) here, at
        the insertion point (a kernel's entry), instead of once per use: attention's
        score chain used it per score, a load each in the softmax's dependency chain."""
        for i, spec in enumerate(self.view.arg_specs):
            if not spec.shape and i not in self.tiles:
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
        if i in self.tiles:
            tile, place = self.tiles[i]
            v = memref.load(tile, place(index))
        else:
            v = memref.load(self.memrefs[i], list(index) if spec.shape else [])
        if spec.elem == "i1" and v.type != ir.IntegerType.get_signless(1):  # a boolean stored as a byte
            return arith.cmpi(arith.CmpIPredicate.ne, v, scalar_math.const(v.type, 0))
        if spec.elem in FP8_PTX:  # NVVM lowers no fp8 extf: decode the byte (exact)
            return emit_widen(v)
        return scalar_math.convert(v, compute_type(spec.elem))

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
                if spec.elem in FP8_PTX:  # through the byte: SPIR-V has no fp8 values
                    from .emit import round_to

                    return scalar_math.convert(round_to(src, spec.elem), ct)
                return scalar_math.convert(scalar_math.convert(src, ir.Type.parse(spec.elem)), ct)
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
            c = _float_constant(args[1])
            if c:
                return arith.mulf(args[0], self.g.fconst(1.0 / c, args[1].type))
        try:
            return scalar_math.emit(name, args, attrs)
        except ValueError as e:
            raise NotApplicable(str(e)) from None


def _float_constant(v: ir.Value) -> float | None:
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

    @property
    def contiguous(self) -> int:
        """Which tile coordinate (0: r, 1: c) walks the argument's contiguous last dim."""
        return 0 if self.swapped else 1

    @property
    def extent(self) -> int:
        return ir.MemRefType(self.mem.type).shape[-1]


def direct_source(view: KernelView, memrefs: Sequence[ir.Value], value: ir.Value, lead: list,
                  tile_swapped: bool) -> Direct | None:
    """The Direct source of a tile whose element (r, c) is ``value[lead + (r, c)]`` (or
    ``(c, r)`` with tile_swapped), when value is an argument or an argument with its last
    two dims swapped by a kf.transpose; else None."""
    swapped = tile_swapped
    op = defining(value)
    if op is not None and op.name == "kf.transpose":
        if not swaps_last_two(op_attrs(op)["perm"]):
            return None
        value, swapped = op.operands[0], not swapped
    i = view.arg_index(value)
    if i is None or view.arg_specs[i].rank < 2:
        return None
    return Direct(memrefs[i], list(lead), swapped)


def stage_tile(g: GpuFunc, pw: Pointwise, tid: ir.Value, threads: int, tile: ir.Value, rows: int, cols: int,
               fast_is_col: bool, row0: ir.Value | int, n_rows: int, col0: ir.Value | int, n_cols: int,
               read: Callable[[ir.Value, ir.Value], ir.Value], transposed: bool = False,
               direct: Direct | None = None, vector_bytes: int = 0) -> None:
    """Copy a rows x cols block of a value into workgroup memory, converted to the
    tile's element type (f32 for the SIMT kernels, f16/bf16 for tensor-core operands):
    ``tile[r][c] = read(row0 + r, col0 + c)`` (``tile[c][r]`` when transposed), zero where
    the row or column is at or past n_rows / n_cols (the tails).

    The threads walk the block linearly, consecutive threads along the columns when
    the source is contiguous along them (``fast_is_col``), else along the rows, so the
    global reads coalesce. Whole passes of all threads run in an scf.for; a last partial
    pass is guarded by the thread's position."""
    staging = VectorStaging(g, tid, threads, tile, rows, cols, n_rows, n_cols, transposed, direct, vector_bytes)
    if staging.ok:
        staging.store(staging.load(row0, col0))
        return
    total = rows * cols
    elem = ir.MemRefType(tile.type).element_type
    if str(elem) in FP8_PTX:  # fp8 tiles (tensor-core operands): rounded and zeroed through bytes
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
        cond = g.all_of([c for c in (g.lt(gr, n_rows) if n_rows % rows or rows > n_rows else None,
                                     g.lt(gc, n_cols) if n_cols % cols or cols > n_cols else None) if c is not None])

        def value():
            pw.reset()
            v = read(gr, gc)
            return [emit_to_storage(v, elem) if str(elem) in FP8_PTX else scalar_math.convert(v, elem)]

        val = g.guarded(cond, [elem], value, lambda: [zero])[0]
        memref.store(val, tile, [cc, rr] if transposed else [rr, cc])

    _passes(g, tid, threads, total, one)

#: Whether tensor-core GEMM plans prefetch the next tiles into registers across the loop.
#: Measured on the H200 (bench/variants.py, 2026-12-02, bf16 8192^3 with ldmatrix):
#: 4.05 ms with it, 4.89 ms without; the CUDA tests run both.
MMA_PREFETCH = True

#: Whether tensor-core GEMM plans read their fragments with ldmatrix (and stage B as it
#: lies in memory) rather than with one 32-bit shared load per register.
MMA_LDMATRIX = True

#: Bytes of K per row of a staged tensor-core GEMM tile; 0 picks by B's layout (64 when
#: B's rows run along n, 128 when they run along k: measured on the H200,
#: bench/results/variants-gemm-kbytes-2026-12-02.json).
MMA_K_BYTES = 0

#: Depth of the cp.async pipeline of tensor-core GEMM tiles (1: one staged tile, with
#: the register prefetch of MMA_PREFETCH). With MMA_WARP_TILES (4, 8), measured on the
#: H200 at 8192^3 (bench/results/variants-gemm-pipeline-2026-12-02.json): nn 4.10 ms with
#: one tile and prefetch -> 3.38 ms with 4 stages, nt 3.74 -> 3.32, fp8 4.47 -> 3.50.
MMA_STAGES = 4

#: mma tiles (16 x 8 each) of a warp in the largest GEMM plan: (4, 8) is a 64 x 64 warp
#: tile and a 128 x 256 workgroup tile, used where it still gives a wave of workgroups;
#: else (4, 4): 64 x 32 and 128 x 128.
MMA_WARP_TILES = (4, 8)

#: Workgroups are ordered in groups of this many tile rows, so that the workgroups
#: running at once share A and B tiles in L2 (0: row by row, the grid's own order).
MMA_GROUP_M = 8


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
    contiguous along the same dim and 16-byte aligned."""

    def __init__(self, g: GpuFunc, tid: ir.Value, threads: int, tile: ir.Value, rows: int, cols: int,
                 n_rows: int, n_cols: int, transposed: bool, direct: Direct | None, vector_bytes: int):
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
                (str(src_elem) in FP8_PTX and src_elem != dst_elem):  # fp8 widens through integers only
            return
        self.width = widths[str(src_elem)]
        vec = vector_bytes // self.width
        along = cols if direct.contiguous == 1 else rows
        total = rows * cols // max(vec, 1)
        full, rest = divmod(total, threads)
        if vec < 2 or direct.extent % vec or along % vec or full + bool(rest) > UNROLL_STAGING:
            return
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
            row_tail = guard_all or self.n_rows % self.rows or self.rows > self.n_rows
            col_tail = guard_all or self.n_cols % self.cols or self.cols > self.n_cols
            cond = g.all_of([c for c in (in_tile, g.lt(gr, self.n_rows) if row_tail else None,
                                         g.lt(gc, self.n_cols) if col_tail else None) if c is not None])
            index = d.lead + ([gc, gr] if d.swapped else [gr, gc])
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
            index = d.lead + ([gc, gr] if d.swapped else [gr, gc])
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


#: PTX names of the fp8 element types, and the operand types kf's tensor cores take.
FP8_PTX = {"f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}
MMA_ELEMS = ("f16", "bf16", *FP8_PTX)


class MmaSync:
    """``mma.sync.aligned`` with f32 accumulators (CUDA) and the register packing it needs:
    ``m16n8k16.row.col`` on f16 or bf16 operands (sm_80 and later) or ``m16n8k32.row.col``
    on fp8 operands, e4m3 or e5m2 (sm_89 and later).

    Fragment layout (PTX ISA), for lane = 4 gid + tig, with E the elements a register
    holds (2 for 16-bit types, 4 for fp8) and K the instruction's k (16 or 32): A (16 x K)
    registers a0..a3 hold (row gid | gid + 8, cols E tig .. E tig + E - 1 | + K/2) in the
    order (gid, lo), (gid + 8, lo), (gid, hi), (gid + 8, hi); B (K x 8) registers b0, b1
    hold (k rows E tig .. | + K/2, col gid); the accumulator c0..c3 holds (row gid, cols
    2 tig, 2 tig + 1) then (row gid + 8, same cols) for every operand type. An operand
    register is vector<2xf16> for f16 and an i32 otherwise.

    MLIR 22's ``nvvm.mma.sync`` verifier refuses the fp8 types, so for them the
    instruction is inline PTX (which needs PTX ISA 8.4: kf-to-cuda raises the version
    when it finds one)."""

    def __init__(self, elem: str):
        if elem not in MMA_ELEMS:
            raise NotApplicable(f"mma.sync takes f16, bf16 or fp8 (e4m3, e5m2) operands, not {elem}")
        self.elem = elem
        self.type = ir.Type.parse(elem)
        self.fp8 = elem in FP8_PTX
        self.per_register = 4 if self.fp8 else 2
        self.esize = 1 if self.fp8 else 2  # bytes per element
        self.k = 32 if self.fp8 else 16
        self.group = ir.VectorType.get([self.per_register], self.type)
        self.i32 = ir.IntegerType.get_signless(32)
        self._struct = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
        if not self.fp8:
            self._shape = ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 16>")
            self._row, self._col = ir.Attribute.parse("#nvvm.mma_layout<row>"), ir.Attribute.parse("#nvvm.mma_layout<col>")
            self._ptx = ir.Attribute.parse(f"#nvvm.mma_type<{elem}>")

    def register(self, group: ir.Value) -> ir.Value:
        """A vector of one register's elements as the operand register the op takes."""
        if self.elem == "f16":
            return group
        from mlir.dialects import vector

        return vector.ExtractOp(vector.bitcast(ir.VectorType.get([1], self.i32), group), [], [0]).result

    def pack(self, x: ir.Value, y: ir.Value) -> ir.Value:
        """Two scalars (any float type: rounded to elem) as one operand register (16-bit types)."""
        from mlir.dialects import vector

        if self.fp8:
            raise NotApplicable("fp8 operand registers hold four values; pack() makes pairs")
        return self.register(vector.from_elements(self.group, [scalar_math.convert(x, self.type),
                                                               scalar_math.convert(y, self.type)]))

    def load_pair(self, mem: ir.Value, index: Sequence[ir.Value]) -> ir.Value:
        """One register's consecutive elements of a memref row (2 or 4) as an operand register."""
        from mlir.dialects import vector

        return self.register(vector.load(self.group, mem, list(index)))

    def tile_products(self, g: "GpuFunc", As: ir.Value, Bs: ir.Value, a_rows: Sequence[ir.Value],
                      b_cols: Sequence[ir.Value], tig2: ir.Value, bk: int, tms: int, tns: int,
                      acc: list[ir.Value]) -> list[ir.Value]:
        """One K block of a warp's register tile: for each k step of the instruction, the
        A fragments of ``a_rows`` (16-row groups of ``As``, [rows, k]) and the B fragments
        of ``b_cols`` (8-column groups of ``Bs``, stored [cols, k]) multiplied into the
        ``tms`` x ``tns`` accumulator quads of ``acc``; ``tig2`` is 2 * (lane % 4).
        Returns the new ``acc``."""
        acc = list(acc)
        first = tig2 if self.per_register == 2 else g.add(tig2, tig2)
        for t in range(bk // self.k):
            lo, hi = g.add(first, self.k * t), g.add(first, self.k * t + self.k // 2)
            a = [[self.load_pair(As, [r, lo]), self.load_pair(As, [g.add(r, 8), lo]),
                  self.load_pair(As, [r, hi]), self.load_pair(As, [g.add(r, 8), hi])] for r in a_rows]
            b = [[self.load_pair(Bs, [c, lo]), self.load_pair(Bs, [c, hi])] for c in b_cols]
            for i in range(tms):
                for j in range(tns):
                    q = 4 * (i * tns + j)
                    acc[q:q + 4] = self(a[i], b[j], acc[q:q + 4])
        return acc

    # ----------------------------------------------------------------- ldmatrix
    #
    # ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`` loads four 8x8 matrices of
    # 16-bit elements (8 rows of 16 bytes; for fp8, 8 x 16 bytes) from workgroup memory in
    # one instruction: lane L gives the address of row L % 8 of matrix L // 8 and receives
    # one register of each, in exactly the A / B fragment layouts above (``.trans`` gives
    # them from a tile stored the other way round, 16-bit types only). Four registers
    # per instruction instead of one 32-bit ld.shared (or two 16-bit ones) per register.

    def lane_terms(self, g: "GpuFunc", lane: ir.Value) -> dict:
        """The lane-dependent offsets of ldmatrix addresses, computed once per kernel."""
        k8 = 16 // self.esize  # elements in 16 bytes: a matrix row
        row8, quad = g.rem(lane, 8), g.div(lane, 8)
        return {"a_row": arith.addi(row8, g.mul(g.rem(quad, 2), 8)), "a_col": g.mul(g.div(quad, 2), k8),
                "b_n": arith.addi(row8, g.mul(g.div(quad, 2), 8)), "b_k": g.mul(g.rem(quad, 2), k8),
                "bt_k": arith.addi(row8, g.mul(g.rem(quad, 2), 8)), "bt_n": g.mul(g.div(quad, 2), 8)}

    def ldmatrix(self, g: "GpuFunc", mem: ir.Value, row: ir.Value, col: ir.Value, trans: bool = False) -> list[ir.Value]:
        """The four registers of ldmatrix.x4 with this lane's address at mem[row, col]."""
        from mlir.dialects import llvm, nvvm

        if trans and self.fp8:
            raise NotApplicable("ldmatrix transposes 16-bit elements only")
        mt = ir.MemRefType(mem.type)
        i64 = ir.IntegerType.get_signless(64)
        base = memref.extract_aligned_pointer_as_index(mem)
        offset = arith.addi(g.mul(row, mt.shape[-1] * self.esize), g.mul(col, self.esize))
        ptr = llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), arith.index_cast(i64, arith.addi(base, offset)))
        struct = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
        layout = ir.Attribute.parse(f"#nvvm.mma_layout<{'col' if trans else 'row'}>")
        r = nvvm.LdMatrixOp(struct, ptr, 4, layout, ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m = 8, n = 8>"),
                            ir.Attribute.parse("#nvvm.ld_st_matrix_elt_type<b16>")).result
        regs = [llvm.extractvalue(self.i32, r, [k]) for k in range(4)]
        if self.elem == "f16":  # the NVVM op takes f16 operands as vector<2xf16>
            regs = [llvm.bitcast(self.group, x) for x in regs]
        return regs

    def warp_tile_products(self, g: "GpuFunc", As: ir.Value, Bs: ir.Value, lt: dict, wm0: ir.Value, wn0: ir.Value,
                           bk: int, tms: int, tns: int, acc: list[ir.Value], b_k_major: bool,
                           b_k_row0: ir.Value | None = None) -> list[ir.Value]:
        """One K block of a warp's tms x tns register tile of mma tiles with ldmatrix
        fragments: ``As`` is [rows, k]; ``Bs`` is [cols, k] or, with ``b_k_major``,
        [k, cols] (read with .trans; its K block starts at row ``b_k_row0``). ``wm0`` /
        ``wn0`` are the warp's first row and column in the tile, ``lt`` what
        ``lane_terms`` gave. tns must be even."""
        acc = list(acc)
        b_k0 = lt["bt_k"] if b_k_row0 is None else arith.addi(lt["bt_k"], b_k_row0)
        for t in range(bk // self.k):
            k0 = self.k * t
            a = [self.ldmatrix(g, As, arith.addi(g.add(wm0, 16 * i), lt["a_row"]), g.add(lt["a_col"], k0))
                 for i in range(tms)]
            b = []
            for j in range(0, tns, 2):
                if b_k_major:
                    r = self.ldmatrix(g, Bs, g.add(b_k0, k0), arith.addi(g.add(wn0, 8 * j), lt["bt_n"]), True)
                else:
                    r = self.ldmatrix(g, Bs, arith.addi(g.add(wn0, 8 * j), lt["b_n"]), g.add(lt["b_k"], k0))
                b += [r[0:2], r[2:4]]
            for i in range(tms):
                for j in range(tns):
                    q = 4 * (i * tns + j)
                    acc[q:q + 4] = self(a[i], b[j], acc[q:q + 4])
        return acc

    def block_products(self, g: "GpuFunc", As: ir.Value, Bs: ir.Value, bk: int, tms: int, tns: int,
                       acc: list[ir.Value], lanes: dict | None, wm0: ir.Value, wn0: ir.Value, b_k_major: bool,
                       a_rows: Sequence[ir.Value], b_cols: Sequence[ir.Value], tig2: ir.Value,
                       a_row0: ir.Value | None = None, b_row0: ir.Value | None = None) -> list[ir.Value]:
        """One K block of a warp's register tile with ldmatrix fragments (``lanes``, what
        ``lane_terms`` gave) or, without, with one shared load per register. ``a_row0`` /
        ``b_row0`` are the rows where the block starts in stacked (pipelined) tiles."""
        if a_row0 is not None:
            wm0, a_rows = arith.addi(wm0, a_row0), [arith.addi(r, a_row0) for r in a_rows]
        b_k_row0 = None
        if b_row0 is not None:
            if b_k_major:
                b_k_row0 = b_row0
            else:
                wn0, b_cols = arith.addi(wn0, b_row0), [arith.addi(c, b_row0) for c in b_cols]
        if lanes is not None:
            return self.warp_tile_products(g, As, Bs, lanes, wm0, wn0, bk, tms, tns, acc, b_k_major, b_k_row0)
        return self.tile_products(g, As, Bs, a_rows, b_cols, tig2, bk, tms, tns, acc)

    def __call__(self, a: Sequence[ir.Value], b: Sequence[ir.Value], c: Sequence[ir.Value]) -> list[ir.Value]:
        from mlir.dialects import llvm, nvvm

        if self.fp8:
            t = FP8_PTX[self.elem]
            r = llvm.InlineAsmOp(
                self._struct, [*a, *b, *c],
                f"mma.sync.aligned.m16n8k32.row.col.f32.{t}.{t}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, "
                "{$8, $9}, {$10, $11, $12, $13};",
                "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3").res
        else:
            # The operand types are given: the Python builder, unlike the parser, does not
            # infer them (and the verifier asserts on their absence).
            r = nvvm.MmaOp(self._struct, self._shape, self._row, self._col, list(a), list(b), list(c),
                           multiplicandAPtxType=self._ptx, multiplicandBPtxType=self._ptx).result
        return [llvm.extractvalue(ir.F32Type.get(), r, [k]) for k in range(4)]


def mma_k_loop(g: GpuFunc, K: int, bk: int, n_acc: int, a_stage: "VectorStaging", b_stage: "VectorStaging",
               prefetch: bool, m0: ir.Value, n0: ir.Value, stage: Callable[[ir.Value], None],
               products: Callable[[list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """The tensor-core K loop of the GEMM kernels (matmul, MoE): per K step a barrier, the
    A and B tiles staged, a barrier, the products into ``n_acc`` f32 accumulators. With
    ``prefetch`` the tiles come from registers that the previous step loaded (the first
    before the loop), and each step loads the next step's before its products, so their
    latency hides behind the tensor cores; without, ``stage(k0)`` stages them. Returns
    the accumulators."""
    n_a = len(a_stage.slots) if prefetch else 0
    first = a_stage.load(m0, 0, True) + b_stage.load(0, n0, True) if prefetch else []

    def k_step(k0, carried):
        acc, staged = list(carried[:n_acc]), carried[n_acc:]
        gpu.barrier()
        if prefetch:
            a_stage.store(staged[:n_a])
            b_stage.store(staged[n_a:])
        else:
            stage(k0)
        gpu.barrier()
        upcoming = []
        if prefetch:
            k1 = g.add(k0, bk)
            upcoming = a_stage.load(m0, k1, True) + b_stage.load(k1, n0, True)
        return products(acc) + upcoming

    return g.loop(0, K, bk, [g.fconst(0.0)] * n_acc + first, k_step)[:n_acc]


def mma_pipelined_k_loop(g: GpuFunc, K: int, bk: int, n_acc: int, stages: int, a_stage: "VectorStaging",
                         b_stage: "VectorStaging", m0: ir.Value, n0: ir.Value, a_rows: int, b_rows: int,
                         products: Callable[[list[ir.Value], ir.Value, ir.Value], list[ir.Value]]) -> list[ir.Value]:
    """The tensor-core K loop as a ``stages``-deep cp.async pipeline: the A and B tiles
    are stacked ``stages`` times in workgroup memory (``a_rows`` / ``b_rows`` rows a
    stage), the first ``stages - 1`` K blocks are in flight before the loop, and each
    step waits for its own block (``cp.async.wait_group stages - 2``), passes one barrier
    (which also frees the stage the previous step read), issues the block ``stages - 1``
    ahead into that stage and multiplies its own. The copies go global -> shared without
    registers, so the loop carries only the accumulators. ``products(acc, a_row0,
    b_row0)`` multiplies the stage whose tiles start at those rows."""
    from mlir.dialects import nvvm

    ahead = stages - 1
    for s in range(ahead):
        a_stage.copy_async(m0, s * bk, s * a_rows)
        b_stage.copy_async(s * bk, n0, s * b_rows)
        nvvm.cp_async_commit_group()

    def k_step(k0, acc):
        step = g.div(k0, bk)
        nvvm.cp_async_wait_group(stages - 2)
        gpu.barrier()
        nxt = g.rem(g.add(step, ahead), stages)
        k1 = g.add(k0, ahead * bk)
        a_stage.copy_async(m0, k1, g.mul(nxt, a_rows))
        b_stage.copy_async(k1, n0, g.mul(nxt, b_rows))
        nvvm.cp_async_commit_group()
        cur = g.rem(step, stages)
        return products(acc, g.mul(cur, a_rows), g.mul(cur, b_rows))

    acc = g.loop(0, K, bk, [g.fconst(0.0)] * n_acc, k_step)
    nvvm.cp_async_wait_group(0)  # nothing may still be landing in shared memory at exit
    return acc


def grouped_tiles(g: GpuFunc, tiles_n: int, tiles_m: int, group_m: int) -> tuple[ir.Value, ir.Value]:
    """(column tile, row tile) of this workgroup. Without ``group_m``, block ids x and y.
    With it, the linear block id walks groups of ``group_m`` tile rows column by column,
    so the workgroups resident at once cover a near-square patch of the output and read
    the same A rows and B columns from L2 instead of sweeping all of B per tile row."""
    bx, by = g.bid("x"), g.bid("y")
    if group_m <= 1 or tiles_m <= group_m or tiles_n == 1:
        return bx, by
    pid = arith.addi(g.mul(by, tiles_n), bx)
    per_group = group_m * tiles_n
    first_m = g.mul(g.div(pid, per_group), group_m)
    in_group = g.rem(pid, per_group)
    if tiles_m % group_m:
        size = arith.minui(arith.subi(g.c(tiles_m), first_m), g.c(group_m))
        return arith.divui(in_group, size), arith.addi(first_m, arith.remui(in_group, size))
    return g.div(in_group, group_m), arith.addi(first_m, g.rem(in_group, group_m))


def simt_tile_products(g: GpuFunc, As: ir.Value, Bs: ir.Value, row_of: Sequence[ir.Value],
                       col_of: Sequence[ir.Value], bk: int, tn: int, acc: list[ir.Value]) -> list[ir.Value]:
    """One K block of a thread's register tile without tensor cores: ``As`` and ``Bs``
    hold the block k-major ([bk, rows], [bk, cols]); ``acc`` is the len(row_of) x tn
    tile of f32 accumulators, row-major. Returns the new accumulators."""
    def inner(kk, acc):
        a = [memref.load(As, [kk, r]) for r in row_of]
        b = [memref.load(Bs, [kk, c]) for c in col_of]
        return [mmath.fma(a[i], b[j], acc[i * tn + j]) for i in range(len(row_of)) for j in range(tn)]

    return g.loop(0, bk, 1, acc, inner)


def quad_reduce(x: ir.Value, combine) -> ir.Value:
    """Combine x over the 4 lanes of a quad (lanes 4 gid .. 4 gid + 3), with xor shuffles."""
    i32 = ir.IntegerType.get_signless(32)
    for off in (1, 2):
        y = gpu.shuffle(x, arith.constant(i32, off), arith.constant(i32, 32), gpu.ShuffleMode.XOR)[0]
        x = combine(x, y)
    return x


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


# --------------------------------------------------------------------------- matmul


@dataclass
class _Gemm:
    mm: ir.Operation
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a_k_contiguous: bool  # A's innermost memory dimension is k (else m: a transposed argument)
    b_n_contiguous: bool
    a_direct: bool = False  # A is an argument read as it is (or with its last two dims swapped)
    b_direct: bool = False


def _contiguous_last(view: KernelView, v: ir.Value) -> bool:
    """Whether the last dim of v is the innermost dimension of the memory it is read
    from: false when v is a kf.transpose that swaps the last two dims of an argument."""
    op = defining(v)
    if op is not None and op.name == "kf.transpose":
        perm = op_attrs(op)["perm"]
        r = len(perm)
        return not (r >= 2 and perm[-1] == r - 2 and perm[-2] == r - 1)
    return True


def _analyze(kernel: ir.Operation) -> tuple[KernelView, _Gemm]:
    view = KernelView(kernel)
    mms = [op for op in view.ops if op.name == "kf.matmul"]
    if len(mms) != 1:
        raise NotApplicable(f"@{view.name} has {len(mms)} matmuls; the matmul strategy takes one")
    mm = mms[0]
    unique_results(view)
    a, b = mm.operands
    pointwise_closure(view, [a, b], [])
    pointwise_closure(view, view.results, [mm.result])
    # The matmul result must reach the outputs only through ops over the output shape.
    out = spec_of(mm.result.type)
    for r, s in zip(view.results, view.result_specs):
        if s.shape != out.shape:
            raise NotApplicable(f"result of shape {list(s.shape)} differs from the matmul's {list(out.shape)}")
    for op in view.ops:
        if op == mm or op.name == "kf.fill":
            continue
        if _depends_on(op, mm.result) and spec_of(op.results[0].type).shape != out.shape:
            raise NotApplicable(f"{op.name} after the matmul changes the shape")
    sa, sb = spec_of(a.type), spec_of(b.type)
    return view, _Gemm(mm, out.shape[:-2], sa.shape[-2], sb.shape[-1], sa.shape[-1],
                       _contiguous_last(view, a), _contiguous_last(view, b), _reads_argument(view, a),
                       _reads_argument(view, b))


def _reads_argument(view: KernelView, v: ir.Value) -> bool:
    """Whether v is a kernel argument of rank >= 2, maybe with its last two dims swapped
    (what ``direct_source`` takes)."""
    op = defining(v)
    if op is not None and op.name == "kf.transpose":
        if not swaps_last_two(op_attrs(op)["perm"]):
            return False
        v = op.operands[0]
    i = view.arg_index(v)
    return i is not None and view.arg_specs[i].rank >= 2


def _depends_on(op: ir.Operation, v: ir.Value) -> bool:
    stack = list(op.operands)
    seen = set()
    while stack:
        x = stack.pop()
        if x == v:
            return True
        if x in seen:
            continue
        seen.add(x)
        d = defining(x)
        if d is not None:
            stack.extend(d.operands)
    return False


class MatmulStrategy(Strategy):
    KIND = "matmul"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """Tiles from the problem size and the target: 128x128 tiles with 8x8 per thread
        on CUDA when both M and N fill them, else 64x64 with 4x4 (256 threads either way,
        within Vulkan's guaranteed limit only for the smaller thread count: the plan
        shrinks the tile until threads and shared memory fit the target). BLOCK_K is
        the largest of 32/16/8 whose two staged tiles fit the shared-memory budget."""
        _, gm = _analyze(kernel)
        mma = self._mma_plan(gm, target)
        if mma is not None:
            return mma
        # 128x128 tiles only when they still give about one wave of workgroups (132 SMs
        # on an H200): a small problem keeps more, smaller workgroups busy.
        big = target.name == "cuda" and -(-gm.m // 128) * -(-gm.n // 128) * math.prod(gm.batch) >= 128
        bm, bn, tm, tn = (128, 128, 8, 8) if big else (64, 64, 4, 4)
        while (bm // tm) * (bn // tn) > target.max_threads:
            bm, bn = bm // 2, bn // 2
        threads = (bm // tm) * (bn // tn)
        bk = 8
        for cand in (32, 16, 8):
            if self._shared(bm, bn, cand) <= target.max_shared_bytes and cand <= max(8, _pow2_ceil(gm.k)):
                bk = cand
                break
        if self._shared(bm, bn, bk) > target.max_shared_bytes:
            raise NotApplicable(f"tiles {bm}x{bn}x{bk} do not fit {target.max_shared_bytes} bytes of shared memory")
        batch = math.prod(gm.batch)
        grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
        if grid[2] > 65535 or grid[1] > 65535:
            raise NotApplicable(f"grid {grid} exceeds the y/z limit")
        return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm, "thread_n": tn, "threads": threads,
                "grid": grid, "shared_bytes": self._shared(bm, bn, bk), "m": gm.m, "n": gm.n, "k": gm.k,
                "batch": list(gm.batch), "mma": False, "vector_bytes": staging_vector_bytes(target)}

    def _mma_plan(self, gm: _Gemm, target: TargetInfo) -> dict | None:
        """Tensor cores (CUDA, f16/bf16/fp8 operands): tiles of 8 warps (2 x 4, each
        16 MMA_WARP_TILES[0] x 8 MMA_WARP_TILES[1]: 64 x 32 by default, 64 accumulators a
        thread) when they give about a wave of workgroups, else 64x64 of 4 warps (2 x 2,
        each 32 x 32). K per staged tile: MMA_K_BYTES of each row. A and B tiles in the
        input type, rows padded by 16 bytes (the fragment loads of a warp hit 32 distinct
        banks). With MMA_STAGES >= 2 and both operands arguments whose staged rows are
        whole 16-byte pieces, the tiles are a cp.async pipeline of that many stages, in
        dynamic shared memory past 48 KiB."""
        elem = spec_of(gm.mm.operands[0].type).elem
        if target.name != "cuda" or elem not in MMA_ELEMS:
            return None
        if elem in FP8_PTX and _sm(target) < 89:
            raise NotApplicable(f"fp8 tensor cores need sm_89 or later; the target is {target.chip}")
        from . import wgmma

        hopper = wgmma.plan(gm, target)
        if hopper is not None:
            return hopper
        batch = math.prod(gm.batch)
        # the largest workgroup tile that still gives about a wave of workgroups
        warps_m, warps_n, tiles_m, tiles_n = 2, 2, 2, 4
        for wtm, wtn in dict.fromkeys([tuple(MMA_WARP_TILES), (4, 4)]):
            if -(-gm.m // (32 * wtm)) * -(-gm.n // (32 * wtn)) * batch >= 128:
                warps_m, warps_n, tiles_m, tiles_n = 2, 4, wtm, wtn
                break
        esize = 1 if elem in FP8_PTX else 2
        # B is staged as it lies in memory: k-major ([k, n], read with ldmatrix.trans) when
        # its rows run along n, else n-major ([n, k]); fp8 has no transposing ldmatrix.
        b_k_major = gm.b_n_contiguous and elem not in FP8_PTX and MMA_LDMATRIX
        # 64 bytes of K when B is k-major; 128 when B's rows run along k, so that they are
        # read in whole 128-byte lines (bench/variants.py: nt 5.57 -> 3.79 ms, fp8 5.83 ->
        # 4.48 ms; nn 3.97 -> 4.12 ms, so nn keeps 64).
        k_bytes = MMA_K_BYTES or (64 if b_k_major else 128)
        bm, bn, bk = warps_m * 16 * tiles_m, warps_n * 8 * tiles_n, k_bytes // esize
        threads = 32 * warps_m * warps_n
        pad = 16 // esize
        stage_bytes = esize * (bm * (bk + pad) + (bk * (bn + 8) if b_k_major else bn * (bk + pad)))
        vb = staging_vector_bytes(target)
        a_async = gm.a_direct and gm.a_k_contiguous and (gm.k * esize) % 16 == 0
        b_async = gm.b_direct and (gm.b_n_contiguous == b_k_major) and \
            ((gm.n if b_k_major else gm.k) * esize) % 16 == 0
        stages = MMA_STAGES if MMA_STAGES >= 2 and vb == 16 and a_async and b_async else 1
        while stages > 2 and stages * stage_bytes > target.max_dynamic_shared_bytes:
            stages -= 1
        shared = stages * stage_bytes
        if threads > target.max_threads or shared > (target.max_dynamic_shared_bytes if stages > 1
                                                       else target.max_shared_bytes):
            return None
        grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
        if grid[2] > 65535 or grid[1] > 65535:
            return None
        return {"block_m": bm, "block_n": bn, "block_k": bk, "warps_m": warps_m, "warps_n": warps_n,
                "mma_tiles_m": tiles_m, "mma_tiles_n": tiles_n, "threads": threads, "grid": grid,
                "shared_bytes": shared, "m": gm.m, "n": gm.n, "k": gm.k, "batch": list(gm.batch), "mma": True,
                "vector_bytes": vb, "prefetch": MMA_PREFETCH and stages == 1, "stages": stages,
                "dynamic_shared": shared > target.max_shared_bytes, "group_m": MMA_GROUP_M,
                "ldmatrix": MMA_LDMATRIX, "b_k_major": b_k_major}

    def _emit_mma(self, view: KernelView, gm: _Gemm, kernel: ir.Operation, plan: dict,
                  gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        """The tensor-core GEMM: per K step the workgroup stages A (m-major) and B
        (n-major) tiles between two barriers; each warp loads its A and B fragments
        from them and issues tiles_m x tiles_n mma.sync per 16 of K into f32
        accumulators, which the epilogue finishes in the accumulator layout."""
        bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
        wn, tms, tns = plan["warps_n"], plan["mma_tiles_m"], plan["mma_tiles_n"]
        M, N, K = gm.m, gm.n, gm.k
        tc = MmaSync(spec_of(gm.mm.operands[0].type).elem)
        b_k_major, use_ldm = plan.get("b_k_major", False), plan.get("ldmatrix", False)
        pad = 16 // tc.esize  # 16 bytes a row: ldmatrix's and the fragment loads' rows hit distinct banks
        stages = plan.get("stages", 1)
        a_rows_s, b_rows_s = bm, (bk if b_k_major else bn)  # rows of one stage of each tile
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target),
                        [workgroup_memref([stages * bm, bk + pad], tc.type),
                         workgroup_memref([stages * bk, bn + pad] if b_k_major else [stages * bn, bk + pad], tc.type)],
                        (threads, 1, 1), dynamic_shared=plan.get("dynamic_shared", False))
            As, Bs = g.shared
            n_in = len(view.args)
            pw = Pointwise(g, view, g.args[:n_in])
            a_val, b_val = gm.mm.operands
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                col_tile, row_tile = grouped_tiles(g, plan["grid"][0], plan["grid"][1], plan.get("group_m", 0))
                batch_idx = g.delinearize(g.bid("z"), gm.batch) if gm.batch else []
                m0, n0 = g.mul(row_tile, bm), g.mul(col_tile, bn)
                warp, lane = g.div(tid, 32), g.rem(tid, 32)
                wm0 = g.mul(g.div(warp, wn), 16 * tms)  # the warp's first row and column in the tile
                wn0 = g.mul(g.rem(warp, wn), 8 * tns)
                gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
                a_rows = [arith.addi(wm0, g.add(gid, 16 * i)) for i in range(tms)]
                b_cols = [arith.addi(wn0, g.add(gid, 8 * j)) for j in range(tns)]
                a_lead = pw.operand_index(spec_of(a_val.type).shape[:-2], batch_idx, len(gm.batch))
                b_lead = pw.operand_index(spec_of(b_val.type).shape[:-2], batch_idx, len(gm.batch))

                a_direct = direct_source(view, g.args[:n_in], a_val, a_lead, False)
                b_direct = direct_source(view, g.args[:n_in], b_val, b_lead, False)
                vb = plan.get("vector_bytes", 0)
                a_stage = VectorStaging(g, tid, threads, As, bm, bk, M, K, False, a_direct, vb)
                b_stage = VectorStaging(g, tid, threads, Bs, bk, bn, K, N, not b_k_major, b_direct, vb)
                lt = tc.lane_terms(g, lane) if use_ldm else None
                prefetch = plan.get("prefetch", False) and a_stage.ok and b_stage.ok

                def stage(k0):
                    stage_tile(g, pw, tid, threads, As, bm, bk, gm.a_k_contiguous, m0, M, k0, K,
                               lambda r, c: pw.eval(a_val, a_lead + [r, c]), direct=a_direct, vector_bytes=vb)
                    stage_tile(g, pw, tid, threads, Bs, bk, bn, gm.b_n_contiguous, k0, K, n0, N,
                               lambda r, c: pw.eval(b_val, b_lead + [r, c]), transposed=not b_k_major,
                               direct=b_direct, vector_bytes=vb)

                if stages > 1:
                    if not (a_stage.copies_async and b_stage.copies_async):
                        raise NotApplicable(f"the plan's {stages}-stage cp.async pipeline needs both tiles "
                                            "staged as 16-byte copies")
                    acc = mma_pipelined_k_loop(
                        g, K, bk, 4 * tms * tns, stages, a_stage, b_stage, m0, n0, a_rows_s, b_rows_s,
                        lambda acc, a0, b0: tc.block_products(g, As, Bs, bk, tms, tns, acc, lt, wm0, wn0, b_k_major,
                                                              a_rows, b_cols, tig2, a0, b0))
                else:
                    acc = mma_k_loop(g, K, bk, 4 * tms * tns, a_stage, b_stage, prefetch, m0, n0, stage,
                                     lambda acc: tc.block_products(g, As, Bs, bk, tms, tns, acc, lt, wm0, wn0,
                                                                   b_k_major, a_rows, b_cols, tig2))
                outs = g.args[n_in:]
                for i in range(tms):
                    for h in range(2):
                        gr = arith.addi(m0, g.add(arith.addi(wm0, gid), 16 * i + 8 * h))
                        for j in range(tns):
                            for e in range(2):
                                gc = arith.addi(n0, g.add(arith.addi(wn0, tig2), 8 * j + e))
                                conds = [c for c in (g.lt(gr, M) if M % bm else None,
                                                     g.lt(gc, N) if N % bn else None) if c is not None]

                                def store(v=acc[4 * (i * tns + j) + 2 * h + e], gr=gr, gc=gc):
                                    pw.reset()
                                    pw.bind(gm.mm.result, v)
                                    idx = list(batch_idx) + [gr, gc]
                                    for r, o in zip(view.results, outs):
                                        store_value(pw.eval(r, idx), o, idx)

                                g.when(g.all_of(conds), store)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                             {"strategy": "matmul", "tensor_cores": f"mma.sync.m16n8k{tc.k}" + (
                                 f".{FP8_PTX[tc.elem]}" if tc.fp8 else ""),
                              "workgroup_bytes": plan["shared_bytes"], "tile": [bm, bn, bk],
                              "stages": stages})

    @staticmethod
    def _shared(bm: int, bn: int, bk: int) -> int:
        return (bk * (bm + 1) + bk * bn) * 4

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view, gm = _analyze(kernel)
        if plan.get("mma"):
            if target.name != "cuda":
                raise NotApplicable("the tensor-core matmul plan is for CUDA")
            if plan.get("wgmma"):
                from . import wgmma

                return wgmma.emit(view, gm, kernel, plan, gpu_module, target)
            return self._emit_mma(view, gm, kernel, plan, gpu_module, target)
        bm, bn, bk = plan["block_m"], plan["block_n"], plan["block_k"]
        tm, tn, threads = plan["thread_m"], plan["thread_n"], plan["threads"]
        M, N, K = gm.m, gm.n, gm.k
        a_sh, b_sh = workgroup_memref([bk, bm + 1]), workgroup_memref([bk, bn])
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target), [a_sh, b_sh], (threads, 1, 1))
            As, Bs = g.shared
            n_in = len(view.args)
            pw = Pointwise(g, view, g.args[:n_in])
            a_val, b_val = gm.mm.operands
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                col_tile, row_tile = g.bid("x"), g.bid("y")
                batch_idx = g.delinearize(g.bid("z"), gm.batch) if gm.batch else []
                m0, n0 = g.mul(row_tile, bm), g.mul(col_tile, bn)
                cols = bn // tn
                tr, tc = g.div(tid, cols), g.rem(tid, cols)
                zero = g.fconst(0.0)

                a_lead = pw.operand_index(spec_of(a_val.type).shape[:-2], batch_idx, len(gm.batch))
                b_lead = pw.operand_index(spec_of(b_val.type).shape[:-2], batch_idx, len(gm.batch))

                a_direct = direct_source(view, g.args[:n_in], a_val, a_lead, False)
                b_direct = direct_source(view, g.args[:n_in], b_val, b_lead, False)
                vbytes = plan.get("vector_bytes", 0)

                def load_a(k0):  # As[k][m] = A[m0 + m, k0 + k]
                    stage_tile(g, pw, tid, threads, As, bm, bk, gm.a_k_contiguous, m0, M, k0, K,
                               lambda r, c: pw.eval(a_val, a_lead + [r, c]), transposed=True,
                               direct=a_direct, vector_bytes=vbytes)

                def load_b(k0):  # Bs[k][n] = B[k0 + k, n0 + n]
                    stage_tile(g, pw, tid, threads, Bs, bk, bn, gm.b_n_contiguous, k0, K, n0, N,
                               lambda r, c: pw.eval(b_val, b_lead + [r, c]), direct=b_direct, vector_bytes=vbytes)

                row_of = [g.add(tr, i * (bm // tm)) for i in range(tm)]
                col_of = [g.add(tc, j * cols) for j in range(tn)]

                def k_step(k0, acc):
                    gpu.barrier()
                    load_a(k0)
                    load_b(k0)
                    gpu.barrier()
                    return simt_tile_products(g, As, Bs, row_of, col_of, bk, tn, acc)

                acc = g.loop(0, K, bk, [zero] * (tm * tn), k_step)

                outs = g.args[n_in:]
                for i in range(tm):
                    gr = g.add(m0, row_of[i])
                    for j in range(tn):
                        gc = g.add(n0, col_of[j])
                        conds = [c for c in (g.lt(gr, M) if M % bm else None, g.lt(gc, N) if N % bn else None)
                                 if c is not None]

                        def store(i=i, j=j, gr=gr, gc=gc):
                            pw.reset()
                            pw.bind(gm.mm.result, acc[i * tn + j])
                            idx = list(batch_idx) + [gr, gc]
                            for r, o in zip(view.results, outs):
                                store_value(pw.eval(r, idx), o, idx)

                        g.when(g.all_of(conds), store)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0,
                             {"strategy": "matmul", "workgroup_bytes": plan["shared_bytes"],
                              "tile": [bm, bn, bk], "thread_tile": [tm, tn]})


def _sm(target: TargetInfo) -> int:
    """The compute capability of a CUDA target as a number (sm_90 -> 90)."""
    digits = "".join(ch for ch in target.chip if ch.isdigit())
    return int(digits) if digits else 0


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


register(MatmulStrategy())
