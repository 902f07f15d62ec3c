"""Hopper's warpgroup MMA, ``wgmma.mma_async`` (sm_90a), as kf's kernels use it.

mma.sync keeps a Hopper SM's tensor cores at about half their rate; wgmma is the
instruction that reaches the rest. It differs from mma.sync in three ways, and this
module is those three things:

- **Operands come from shared memory through descriptors.** A 64-bit *matrix
  descriptor* names a tile's start address, the byte strides between its 8-row core
  matrix groups, and its swizzle. kf stages every operand tile in the *128-byte swizzle*
  layout (``SwizzledTile``): rows of 128 bytes (64 bf16 or 128 fp8 elements of K, or,
  for a B that lies k-by-n in memory, 64 n-elements of one k), and the 16-byte chunk
  ``c`` of row ``r`` stored at chunk ``c ^ (r % 8)``, in 1024-byte aligned atoms of 8
  rows (``carve_aligned``). That is the layout the hardware reads without bank
  conflicts, and the one cp.async can write: each 16-byte copy lands whole in its
  swizzled place. ``wgmma_attrs`` are the descriptor form's attributes;
  ``register_a_wgmma`` is the form with A from registers (inline PTX: MLIR's op takes
  descriptors only).
- **It is asynchronous.** A warpgroup (4 warps, 128 threads) issues the instructions of
  one K block, commits them as a group and goes on; ``wgmma.wait_group`` waits for all
  but the newest groups, so the tensor cores run while the warpgroup does other work.
  A stage is refilled only when no group in flight reads it.
- **Shared memory written by threads is in the generic proxy; wgmma reads through the
  async proxy.** Each thread fences its landed copies (``fence.proxy.async.shared::cta``)
  before the barrier that publishes a stage.

The accumulator fragment of warp w of a warpgroup is mma.sync's C layout repeated over
N/8 column groups: value 4i + 2h + e at row 16w + lane/4 + 8h, column 8i + 2(lane%4) + e.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm

from ..base import NotApplicable, TargetInfo
from ..kernel_ir import WORKGROUP, Direct, GpuFunc
from ..kernel_ir import elem_bytes as _elem_bytes
from ..run_time_sizes import ragged
from .mma_sync import FP8_PTX

SWIZZLE_BYTES = 128  # one swizzled row

ATOM_BYTES = 1024  # 8 rows: the swizzle pattern's period, and the descriptors' alignment

WGMMA_TYPES = {"bf16": "bf16", "f16": "f16", "f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}


def available(target: TargetInfo) -> bool:
    """wgmma is an sm_90a instruction (the ``a`` features: not portable to later chips)."""
    return target.name == "cuda" and target.chip == "sm_90a"


class SwizzledTile:
    """One operand's stacked pipeline stages in 128-byte swizzled rows, and the
    per-thread cp.async copies that fill a stage.

    K-major (``mn_major=False``): the stage is ``rows`` rows (M or N) of ``width``
    elements of K, split into atom columns of 128 bytes (one for the GEMM's 128-byte K
    block; two for attention's head dim 128 in bf16), each column ``rows`` rows of 128
    bytes; element (r, k) is at row ``(k / C) * rows + r`` of the stage, chunk
    ``((k % C) / V) ^ (r % 8)``, with C the elements of 128 bytes and V of 16.
    MN-major (B as it lies k-by-n): the stage is ``rows / C`` atom columns of ``bk``
    k-rows of C n-elements each; element (k, n) is at row ``(n / C) * bk + k`` of the
    stage, chunk ``((n % C) / V) ^ (k % 8)``.

    ``mem`` is a [stages * rows_per_stage, 128 bytes] view at a 1024-byte aligned
    address; the global source is ``direct`` ([.., R, K] for K-major, [.., K, N] for
    MN-major, with its lead indices; flat with run-time strides, or not), ``n_rows`` by
    ``n_k`` elements, either of them a run-time size (an index value: every copy then
    tests it). ``lean``: whether the copies may take per-thread
    addresses computed once (``_lean_addresses``; they stay in registers through the
    loop): a block of copies is then one uniform offset and one test, where each 16-byte
    copy computed its indices, clamped them at the edges and linearized them (about 8
    instructions a copy); a block outside the source is 16-byte copies of 0 bytes from a
    valid address, straight code that ptxas may interleave with what follows. ``producer``: the tile of
    a producer warpgroup (attention.hopper.producer), whose copies are its only work:
    lean copies also with 8 rows between a thread's slots and in blocks across the
    source's edge (each slot then tests its coordinates). ``row_perm`` (K-major only): a function of the
    stage row giving the source row it holds, relative to ``row0`` (attention's fp8
    kernel permutes keys within groups of 32 so that its score accumulators are
    wgmma's fp8 A fragment, see attention.hopper.mma.fp8_key_order)."""

    def __init__(self, g: GpuFunc, tid: ir.Value, threads: int, mem: ir.Value, direct: Direct, rows: int,
                 bk: int, esize: int, n_rows: int | ir.Value, n_k: int | ir.Value, mn_major: bool,
                 width: int | None = None, row_perm=None, lean: bool = True, producer: bool = False):
        self.g, self.mem, self.direct, self.rows, self.bk, self.esize = g, mem, direct, rows, bk, esize
        self.n_rows, self.n_k, self.mn_major = n_rows, n_k, mn_major
        self.vec = 16 // esize
        self.width = width or bk  # K elements a stage holds (K-major)
        extent = rows if mn_major else self.width  # elements along the contiguous dim
        if (extent * esize) % SWIZZLE_BYTES:
            raise NotApplicable(f"{extent} elements are not whole 128-byte swizzled rows")
        self.columns = extent * esize // SWIZZLE_BYTES  # atom columns
        self.stage_rows = (bk if mn_major else rows) * self.columns
        self.stage_bytes = self.stage_rows * SWIZZLE_BYTES
        chunks = self.stage_bytes // 16
        per_row = SWIZZLE_BYTES // 16  # 8 chunks of a swizzled row
        n_chunks = extent * esize // 16  # chunks along the contiguous dim of one source row
        self.slots = []
        for e in range(-(-chunks // threads)):
            lin = g.add(tid, e * threads)
            # consecutive threads along a source row: whole 128-byte lines
            r, c = g.div(lin, n_chunks), g.rem(lin, n_chunks)
            col, cc = g.div(c, per_row), g.rem(c, per_row)
            # K-major: r is the row (of M/N), c the chunk along k; MN-major: r is k, c along n
            dst_row = arith.addi(g.mul(col, bk if mn_major else rows), r)
            swz = arith.xori(cc, g.rem(r, 8))
            in_share = g.lt(lin, chunks) if (e + 1) * threads > chunks else None
            # row_perm (K-major): stage row r holds source row row0 + row_perm(r)
            src_r = row_perm(r) if row_perm is not None and not mn_major else r
            self.slots.append((dst_row, g.mul(swz, self.vec), (src_r, g.mul(c, self.vec)), in_share))
        self.producer = producer
        self.lean = self._lean_addresses(tid, threads, n_chunks, chunks, row_perm) if lean else None

    def _lean_addresses(self, tid: ir.Value, threads: int, n_chunks: int, chunks: int, row_perm):
        """Lean copies: where every thread copies whole slots and the slots of a thread
        are the same chunk ``step`` source rows apart (step a multiple of 16, so the
        swizzle, ``row % 8``, and fp8's key order, within 16, are the same in each; of
        8 for a producer's tiles without a row permutation),
        the thread's source and destination byte addresses of its first slot, computed
        once (i64): a block's copies are then one uniform offset, and each slot a
        constant one that ptxas folds into the instruction. None elsewhere."""
        g, d = self.g, self.direct
        step = threads // n_chunks if threads % n_chunks == 0 else 0
        # 8 rows keep the swizzle; the GEMM and attention kernels were tuned
        # with 16 (GEMM nn's B, 8 rows a step at 256 threads, keeps per-copy addresses)
        least = 16 if row_perm is not None or not self.producer else 8
        if not step or step % least or chunks % threads:
            return None
        # a 16-byte copy runs along the source's last dim, which the tile's second
        # coordinate (K-major: k, MN-major: n) must walk; static strides of the last two
        # dims, no offset. A flat argument (run-time sizes) only for a producer's tiles:
        # its lead strides may be run-time ones
        strides, offset = ir.MemRefType(d.mem.type).get_strides_and_offset()
        dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
        if d.strides is not None:  # a flat argument: its declared strides
            if not self.producer or offset != 0 or not all(isinstance(x, int) for x in d.strides[-2:]):
                return None
            strides = list(d.strides)
        elif offset != 0 or dynamic in strides:
            return None
        if d.swapped or strides[-1] != 1:
            return None
        s_first, s_second = strides[-2], strides[-1]
        i64 = ir.IntegerType.get_signless(64)
        r0, c = g.div(tid, n_chunks), g.rem(tid, n_chunks)
        col, cc = g.div(c, SWIZZLE_BYTES // 16), g.rem(c, SWIZZLE_BYTES // 16)
        dst_row = arith.addi(g.mul(col, self.bk if self.mn_major else self.rows), r0)
        dst = arith.addi(g.mul(dst_row, SWIZZLE_BYTES), g.mul(arith.xori(cc, g.rem(r0, 8)), 16))
        src_r = row_perm(r0) if row_perm is not None and not self.mn_major else r0
        elems = arith.addi(g.mul(src_r, s_first), g.mul(g.mul(c, self.vec), s_second))
        for i, x in enumerate(d.lead):
            elems = arith.addi(elems, g.mul(x, strides[i]) if isinstance(strides[i], int) else
                               arith.muli(x, strides[i]))
        base = memref.extract_aligned_pointer_as_index(d.mem)
        src = arith.addi(base, g.mul(elems, self.esize))
        dst = arith.addi(memref.extract_aligned_pointer_as_index(self.mem), dst)
        # the first slot's (first, second) source coordinates, for blocks across an edge
        coords = (src_r, g.mul(c, self.vec)) if not self.mn_major else (r0, g.mul(c, self.vec))
        return (arith.index_cast(i64, src), arith.index_cast(i64, dst), step, chunks // threads,
                (s_first * self.esize, s_second * self.esize), coords, arith.index_cast(i64, base))

    def copy_async(self, row0: ir.Value | int, k0: ir.Value | int, stage: ir.Value | int) -> None:
        """This thread's cp.async copies of the block at (row0 of M/N, k0) into ``stage``.
        Chunks past the argument's edge copy 0 bytes from a clamped address, which
        zero-fills them (K tails multiply as zeros)."""
        from mlir.dialects import nvgpu

        g, d = self.g, self.direct
        first, second = (k0, row0) if self.mn_major else (row0, k0)
        n_first, n_second = (self.n_k, self.n_rows) if self.mn_major else (self.n_rows, self.n_k)
        e_first, e_second = (self.bk, self.rows) if self.mn_major else (self.rows, self.width)
        # whole: block starts are multiples of the tile's extents, a block is all in or all out
        whole = not ragged(n_first, e_first) and not ragged(n_second, e_second)
        if self.lean and (whole or self.producer):
            self._lean_copy(first, second, n_first, n_second, stage, whole)
            return
        srow = g.mul(stage, self.stage_rows) if not isinstance(stage, int) else g.c(stage * self.stage_rows)
        for dst_row, dst_col, (a, b), in_share in self.slots:
            if not self.mn_major:
                gr, gk = _plus(g, a, row0), _plus(g, b, k0)
            else:
                gk, gr = _plus(g, a, k0), _plus(g, b, row0)
            inside = g.all_of([g.lt(gr, self.n_rows), g.lt(gk, self.n_k)])
            gr, gk = arith.select(inside, gr, g.c(0)), arith.select(inside, gk, g.c(0))
            n = arith.select(inside, g.c(self.vec), g.c(0))
            idx = [gk, gr] if self.mn_major else [gr, gk]
            index = d.at(g, idx[::-1] if d.swapped else idx)

            def copy(dst_row=dst_row, dst_col=dst_col, index=index, n=n):
                nvgpu.device_async_copy(self.mem, [arith.addi(srow, dst_row), dst_col], d.mem, index,
                                        ir.IntegerAttr.get(ir.IndexType.get(), self.vec), src_elements=n,
                                        bypass_l1=True)

            g.when(in_share, copy)

    def _lean_copy(self, first, second, n_first: int, n_second: int, stage, whole: bool) -> None:
        """``copy_async`` by ``_lean_addresses``. ``whole``: one uniform test for the block,
        which makes its copies 0 bytes where it lies outside. Else each slot tests its own
        coordinates, and one outside copies 0 bytes from the source's base address."""
        g = self.g
        src0, dst0, step, slots, (b_first, b_second), (f0, s0), base = self.lean
        i64 = ir.IntegerType.get_signless(64)

        def index(v):
            return g.c(v) if isinstance(v, int) else v

        block = arith.addi(g.mul(index(first), b_first), g.mul(index(second), b_second))
        src = arith.addi(src0, arith.index_cast(i64, block))
        dst = arith.addi(dst0, arith.index_cast(i64, g.mul(index(stage), self.stage_bytes)))
        cg = ir.Attribute.parse("#nvvm<load_cache_modifier cg>")
        i8 = ir.IntegerType.get_signless(8)

        def pointers(src):
            return [llvm.inttoptr(ir.Type.parse(f"!llvm.ptr<{space}>"), x) for space, x in ((1, src), (3, dst))]

        def slot(ptrs, e):
            """Slot e's (source, destination): a constant byte offset of the block's
            pointers (getelementptr), which becomes the immediate of the cp.async."""
            return (p if not off else llvm.getelementptr(p.type, p, [], [off], i8, None)
                    for p, off in zip(ptrs, (e * step * b_first, e * step * SWIZZLE_BYTES)))

        if not whole:
            i32 = ir.IntegerType.get_signless(32)
            ptrs = pointers(src)
            at_second = g.lt(_plus(g, s0, second), n_second)
            row = _plus(g, f0, first)
            for e in range(slots):
                inside = arith.andi(g.lt(g.add(row, e * step), n_first), at_second)
                s, t = slot(ptrs, e)
                s = llvm.inttoptr(s.type, arith.select(inside, llvm.ptrtoint(base.type, s), base))
                size = arith.select(inside, arith.constant(i32, 16), arith.constant(i32, 0))
                nvvm.CpAsyncOp(t, s, 16, cg, cpSize=size)
            return
        inside = g.all_of([g.lt(index(x), n) for x, n in ((first, n_first), (second, n_second))
                           if not (isinstance(x, int) and x < n)])
        size = None
        if inside is not None:
            # a block outside copies 0 bytes (zero-fill) from the thread's first slot
            src = arith.select(inside, src, src0)
            i32 = ir.IntegerType.get_signless(32)
            size = arith.select(inside, arith.constant(i32, 16), arith.constant(i32, 0))
        ptrs = pointers(src)
        for e in range(slots):
            s, t = slot(ptrs, e)
            nvvm.CpAsyncOp(t, s, 16, cg, cpSize=size)

    def descriptor_base(self) -> ir.Value:
        """The matrix descriptor of stage 0, row 0 (i64): address / 16 in bits 0-13, the
        leading byte offset / 16 in 16-29, the stride byte offset / 16 in 32-45, and
        the 128-byte swizzle mode (1) in 62-63. K-major: the stride (SBO) between 8-row
        groups is 1024 bytes; the leading offset is unused (1). MN-major: SBO 1024 between
        groups of 8 k-rows, and LBO one atom column (bk rows of 128 bytes) between
        64-column atoms (checked on the H200: the two swapped fault)."""
        i64 = ir.IntegerType.get_signless(64)
        addr = arith.index_cast(i64, memref.extract_aligned_pointer_as_index(self.mem))
        lbo, sbo = 16, ATOM_BYTES
        if self.mn_major:
            lbo = self.bk * SWIZZLE_BYTES
        const = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)
        low = arith.andi(arith.shrui(addr, i64_const(4)), i64_const(0x3FFF))
        return arith.ori(low, i64_const(const))

    def slice_offset(self, t: int, k_inst: int) -> int:
        """Bytes from a stage's start to the t-th k slice of k_inst elements (K-major:
        its atom column, then along the swizzled row, which the hardware swizzles by
        address; MN-major: whole k-rows down)."""
        if self.mn_major:
            return t * k_inst * SWIZZLE_BYTES
        col, within = divmod(t * k_inst * self.esize, SWIZZLE_BYTES)
        return col * self.rows * SWIZZLE_BYTES + within


def _plus(g: GpuFunc, a: ir.Value, b: ir.Value | int) -> ir.Value:
    return g.add(a, b) if isinstance(b, int) else arith.addi(a, b)


def i64_const(v: int) -> ir.Value:
    i64 = ir.IntegerType.get_signless(64)
    return arith.constant(i64, v)


def carve_aligned(g: GpuFunc, sizes: Sequence[tuple[int, int, ir.Type]]) -> list[ir.Value]:
    """[rows, cols] views of dynamic shared memory, each at a 1024-byte aligned address
    (the swizzle atom; the window itself is only 16-byte aligned): the window is asked
    for 1 KiB more, and the views start at the first aligned address in it. Each view
    takes whole 1024-byte units."""
    with ir.InsertionPoint(g.entry):
        window = gpu.dynamic_shared_memory(ir.MemRefType.get(
            [ir.ShapedType.get_dynamic_size()], ir.IntegerType.get_signless(8),
            memory_space=ir.Attribute.parse(WORKGROUP)))
        base = memref.extract_aligned_pointer_as_index(window)
        pad = g.rem(arith.subi(g.c(ATOM_BYTES), g.rem(base, ATOM_BYTES)), ATOM_BYTES)
        views, offset = [], 0
        for rows, cols, elem in sizes:
            t = ir.MemRefType.get([rows, cols], elem, memory_space=ir.Attribute.parse(WORKGROUP))
            views.append(memref.view(t, window, g.add(pad, offset), []))
            offset += -(-rows * cols * _elem_bytes(elem) // ATOM_BYTES) * ATOM_BYTES
    g.dynamic_shared_bytes = offset + ATOM_BYTES
    return views


def wgmma_attrs(elem: str, n: int, k: int, b_mn_major: bool, a_mn_major: bool = False) -> list[ir.Attribute]:
    """shape, typeA, typeB, typeD, scaleD, scaleA, scaleB, layoutA, layoutB of
    nvvm.wgmma.mma_async: A K-major is ``row``, MN-major ``col`` (imm-trans-a = 1; 16-bit
    types only); B K-major is ``col``, MN-major ``row`` (which MLIR prints as
    imm-trans-b = 1)."""
    t = WGMMA_TYPES[elem]
    p = ir.Attribute.parse
    return [p(f"#nvvm.shape<m = 64, n = {n}, k = {k}>"), p(f"#nvvm.wgmma_type<{t}>"), p(f"#nvvm.wgmma_type<{t}>"),
            p("#nvvm.wgmma_type<f32>"), p("#nvvm.wgmma_scale_out<one>"), p("#nvvm.wgmma_scale_in<one>"),
            p("#nvvm.wgmma_scale_in<one>"), p(f"#nvvm.mma_layout<{'col' if a_mn_major else 'row'}>"),
            p(f"#nvvm.mma_layout<{'row' if b_mn_major else 'col'}>")]


def descriptor(mem: ir.Value, leading_bytes: int) -> ir.Value:
    """The matrix descriptor (i64) of a 128-byte swizzled tile at ``mem`` (a view of
    shared memory, 1024-byte aligned): as ``SwizzledTile.descriptor_base`` gives it, with
    the leading byte offset ``leading_bytes`` (an MN-major operand's stride between its
    64-element atom columns; a K-major one's is unused: 16). One tile in the K-major
    layout of rows by k is also the MN-major layout of the same rows as k by n, so the
    two descriptors of one tile read it both ways."""
    i64 = ir.IntegerType.get_signless(64)
    addr = arith.index_cast(i64, memref.extract_aligned_pointer_as_index(mem))
    const = ((leading_bytes >> 4) << 16) | ((ATOM_BYTES >> 4) << 32) | (1 << 62)
    low = arith.andi(arith.shrui(addr, i64_const(4)), i64_const(0x3FFF))
    return arith.ori(low, i64_const(const))


def opaque(x: ir.Value) -> ir.Value:
    """x (an i64) through an inline-PTX move with side effects: what is computed from it
    is computed where it is used. A loop's descriptors are loop-invariant sums of a base
    and a slice's offset, which LLVM hoists and keeps in registers through the loop (two
    a descriptor, dozens in a backward step); from an opaque base each is one add by the
    wgmma that reads it."""
    i64 = ir.IntegerType.get_signless(64)
    return llvm.InlineAsmOp(i64, [x], "mov.b64 $0, $1;", "=l,l", has_side_effects=True).res


def red_add_f32x2(address: ir.Value, a: ir.Value, b: ir.Value) -> None:
    """``red.global.add.v2.f32``: two f32 added to global memory at an 8-byte aligned
    ``address`` (i64), the reduction done in L2 (sm_90: vector reductions of f32)."""
    llvm.InlineAsmOp(None, [address, a, b], "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
                     has_side_effects=True)


def register_a_wgmma(acc: ir.Value, n: int, elem: str, a: list[ir.Value], b_desc: ir.Value) -> ir.Value:
    """``wgmma.mma_async m64n{n}k16`` with A from registers (4 x b32 of the m64 x k16 A
    tile in mma.sync's fragment layout) and B, transposed (MN-major), by descriptor;
    for fp8 ``m64n{n}k32``, A 4 x b32 of m64 x k32 bytes and B K-major: inline PTX,
    accumulators tied in and out (``acc``: a struct of n / 2 f32)."""
    n_acc = n // 2
    out = ",".join(f"${i}" for i in range(n_acc))
    if elem in FP8_PTX:  # k32, and no transpose immediates (fp8 B is K-major only)
        t = FP8_PTX[elem]
        shape, types, tail = f"m64n{n}k32", f"f32.{t}.{t}", "p, 1, 1"
    else:
        shape, types, tail = f"m64n{n}k16", f"f32.{elem}.{elem}", "p, 1, 1, 1"
    asm = ("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
           f"wgmma.mma_async.sync.aligned.{shape}.{types} {{{out}}}, "
           f"{{${n_acc}, ${n_acc + 1}, ${n_acc + 2}, ${n_acc + 3}}}, ${n_acc + 4}, {tail};\n}}")
    cons = ",".join(["=f"] * n_acc + ["r"] * 4 + ["l"] + [str(i) for i in range(n_acc)])
    f32 = ir.F32Type.get()
    accs = [llvm.extractvalue(f32, acc, [i]) for i in range(n_acc)]
    return llvm.InlineAsmOp(acc.type, [*a, b_desc, *accs], asm, cons, has_side_effects=True).res
