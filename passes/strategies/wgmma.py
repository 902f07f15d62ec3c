"""Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a) for the matmul strategy's GEMM.

mma.sync keeps a Hopper SM's tensor cores at about half their rate (kf's mma.sync GEMM:
0.45x cuBLAS at 8192^3 on the H200); wgmma is the instruction that reaches the rest.
It differs from mma.sync in three ways, and this module is those three things:

- **Operands come from shared memory through descriptors.** A 64-bit *matrix
  descriptor* names a tile's start address, the byte strides between its 8-row core
  matrix groups, and its swizzle. kf stages every operand tile in the *128-byte swizzle*
  layout (``SwizzledTile``): rows of 128 bytes (64 bf16 or 128 fp8 elements of K, or,
  for a B that lies k-by-n in memory, 64 n-elements of one k), and the 16-byte chunk
  ``c`` of row ``r`` stored at chunk ``c ^ (r % 8)``, in 1024-byte aligned atoms of 8
  rows. That is the layout the hardware reads without bank conflicts, and the one
  cp.async can write: each 16-byte copy lands whole in its swizzled place.
- **It is asynchronous.** A warpgroup (4 warps, 128 threads) issues the instructions of
  one K block, commits them as a group and goes on; ``wgmma.wait_group 1`` at the end of
  a step waits for the *previous* step's group only, so the tensor cores are busy while
  the next step waits for its tiles. A stage is refilled only when no group in flight
  reads it, hence ``ahead = stages - 2`` blocks in flight on the copy side.
- **Shared memory written by threads is in the generic proxy; wgmma reads through the
  async proxy.** Each thread fences its landed copies (``fence.proxy.async.shared::cta``)
  before the barrier that publishes a stage.

The workgroup is two warpgroups (256 threads) over a BLOCK_M = 128 row tile, each
warpgroup one m64nNk16 (k32 for fp8) accumulator of N = BLOCK_N columns in f32
registers (N/2 a thread: 128 at N = 256). The accumulator fragment of warp w of a
warpgroup is mma.sync's C layout repeated over N/8 column groups: value 4i + 2h + e at
row 16w + lane/4 + 8h, column 8i + 2(lane%4) + e. The epilogue is the matmul strategy's
(``Pointwise`` over the kernel's ops after the matmul, one rounding when stored).

Operand layouts: A must be k-contiguous in memory ("K-major"); B either k-contiguous
(``a @ b.t()``, nn.Linear weights) or n-contiguous (``a @ b``) -- wgmma transposes B
itself for 16-bit types (``imm-trans-b``); fp8 takes K-major B only. Anything else, and
targets that are not sm_90a, keep the mma.sync kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm

from .base import EmittedKernel, NotApplicable, TargetInfo
from .kernel_ir import WORKGROUP, Direct, GpuFunc, KernelView, Pointwise, direct_source, gpu_arg_types, store_value
from .kernel_ir import elem_bytes as _elem_bytes
from .matmul import _Gemm, grouped_tiles
from .nvidia.mma_sync import FP8_PTX

#: Whether sm_90a GEMMs take wgmma (else mma.sync, as on sm_80/sm_89).
WGMMA = True

#: Depth of the cp.async pipeline of the wgmma GEMM (stages of BLOCK_K = 128 bytes of K).
WGMMA_STAGES = 4

#: wgmma groups left in flight at the end of a K step (0 or 1): with 1 the tensor cores
#: run while the next step waits for its tiles; one more stage is then kept out of the
#: copies' reach.
WGMMA_INFLIGHT = 1

#: The widest BLOCK_N (columns of one wgmma) a plan takes, narrowed while the grid
#: would be less than a wave of workgroups.
WGMMA_MAX_N = 256

SWIZZLE_BYTES = 128  # one swizzled row

#: Whether SwizzledTile copies blocks that are all inside or all outside the source
#: (extents multiples of the tile's) from per-thread addresses computed once
#: (``_lean_addresses``): a block is then a uniform offset and one test, where each
#: 16-byte copy computed its indices, clamped them at the edges and linearized them
#: (about 8 instructions a copy, 130 of the 585 in bf16 attention's key loop). A block
#: outside the source is 16-byte copies of 0 bytes from a valid address: straight code
#: that ptxas may interleave with what follows. A branch around them instead was slower
#: (H200, bf16 attention 4x32x2048x128: 0.656 against 0.617 ms; 2x32x4096x128: 1.184
#: against 1.088; bench/results/variants-attention-session9-2026-12-04.json).
LEAN_COPIES = True
ATOM_BYTES = 1024  # 8 rows: the swizzle pattern's period, and the descriptors' alignment

_WGMMA_TYPES = {"bf16": "bf16", "f16": "f16", "f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}


def available(target: TargetInfo) -> bool:
    """wgmma is an sm_90a instruction (the ``a`` features: not portable to later chips)."""
    return WGMMA and target.name == "cuda" and target.chip == "sm_90a"


def plan(gm: _Gemm, target: TargetInfo) -> dict | None:
    """The wgmma plan for a GEMM, or None where the mma.sync kernel stays: the target is
    not sm_90a, an operand is not an argument read as it lies, A is not K-major, B is
    MN-major in fp8, or rows are not whole 16-byte pieces (cp.async copies 16 bytes)."""
    if not available(target):
        return None
    elem = spec_of(gm.mm.operands[0].type).elem
    if elem not in _WGMMA_TYPES or spec_of(gm.mm.operands[1].type).elem != elem:
        return None
    esize = 1 if elem in FP8_PTX else 2
    b_mn_major = gm.b_n_contiguous
    if not (gm.a_direct and gm.b_direct and gm.a_k_contiguous) or (b_mn_major and esize == 1):
        return None
    if (gm.k * esize) % 16 or (b_mn_major and (gm.n * esize) % 16):
        return None
    batch = math.prod(gm.batch)
    bm, bn = 128, WGMMA_MAX_N
    while bn > 64 and -(-gm.m // bm) * -(-gm.n // bn) * batch < 128:
        bn //= 2
    bk = SWIZZLE_BYTES // esize
    stage_bytes = (bm + bn) * SWIZZLE_BYTES
    stages = WGMMA_STAGES
    while stages > 2 + WGMMA_INFLIGHT and stages * stage_bytes + ATOM_BYTES > target.max_dynamic_shared_bytes:
        stages -= 1
    if stages < 2 + WGMMA_INFLIGHT or stages * stage_bytes + ATOM_BYTES > target.max_dynamic_shared_bytes:
        return None
    grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
    if grid[2] > 65535 or grid[1] > 65535:
        return None
    from . import matmul

    return {"block_m": bm, "block_n": bn, "block_k": bk, "threads": 256, "grid": grid, "m": gm.m, "n": gm.n,
            "k": gm.k, "batch": list(gm.batch), "mma": True, "wgmma": True, "stages": stages,
            "inflight": WGMMA_INFLIGHT, "shared_bytes": stages * stage_bytes + ATOM_BYTES,
            "dynamic_shared": True, "group_m": matmul.MMA_GROUP_M, "b_k_major": not b_mn_major}


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
    MN-major, with its lead indices). ``lean``: whether ``LEAN_COPIES`` may apply (its
    per-thread addresses stay in registers through the loop). ``producer``: the tile of
    a producer warpgroup (attention's WARP_SPECIALIZED), whose copies are its only work:
    lean copies also with 8 rows between a thread's slots and in blocks across the
    source's edge (each slot then tests its coordinates). ``row_perm`` (K-major only): a function of the
    stage row giving the source row it holds, relative to ``row0`` (attention's fp8
    kernel permutes keys within groups of 32 so that its score accumulators are
    wgmma's fp8 A fragment, see attention_wgmma.fp8_key_order)."""

    def __init__(self, g: GpuFunc, tid: ir.Value, threads: int, mem: ir.Value, direct: Direct, rows: int,
                 bk: int, esize: int, n_rows: int, n_k: int, mn_major: bool, width: int | None = None,
                 row_perm=None, lean: bool = True, producer: bool = False):
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
        self.lean = self._lean_addresses(tid, threads, n_chunks, chunks, row_perm) if LEAN_COPIES and lean else None

    def _lean_addresses(self, tid: ir.Value, threads: int, n_chunks: int, chunks: int, row_perm):
        """``LEAN_COPIES``: where every thread copies whole slots and the slots of a thread
        are the same chunk ``step`` source rows apart (step a multiple of 16, so the
        swizzle, ``row % 8``, and fp8's key order, within 16, are the same in each; of
        8 for a producer's tiles without a row permutation),
        the thread's source and destination byte addresses of its first slot, computed
        once (i64): a block's copies are then one uniform offset, and each slot a
        constant one that ptxas folds into the instruction. None elsewhere."""
        g, d = self.g, self.direct
        step = threads // n_chunks if threads % n_chunks == 0 else 0
        # 8 rows keep the swizzle; the measured GEMM and attention kernels were tuned
        # with 16 (GEMM nn's B, 8 rows a step at 256 threads, keeps per-copy addresses)
        least = 16 if row_perm is not None or not self.producer else 8
        if not step or step % least or chunks % threads:
            return None
        # a 16-byte copy runs along the source's last dim, which the tile's second
        # coordinate (K-major: k, MN-major: n) must walk; static strides, no offset
        strides, offset = ir.MemRefType(d.mem.type).get_strides_and_offset()
        dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
        if d.swapped or offset != 0 or dynamic in strides or strides[-1] != 1:
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
            elems = arith.addi(elems, g.mul(x, strides[i]))
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
        whole = n_first % e_first == 0 and n_second % e_second == 0
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
            index = d.lead + (idx[::-1] if d.swapped else idx)

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
        low = arith.andi(arith.shrui(addr, _i64(4)), _i64(0x3FFF))
        return arith.ori(low, _i64(const))

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


def _i64(v: int) -> ir.Value:
    i64 = ir.IntegerType.get_signless(64)
    return arith.constant(i64, v)


def _carve_aligned(g: GpuFunc, sizes: Sequence[tuple[int, int, ir.Type]]) -> list[ir.Value]:
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


def emit(view: KernelView, gm: _Gemm, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
         target: TargetInfo) -> EmittedKernel:
    """The wgmma GEMM kernel of a ``plan()`` plan (see the module docstring)."""
    bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
    stages, inflight = plan["stages"], plan["inflight"]
    M, N, K = gm.m, gm.n, gm.k
    elem = spec_of(gm.mm.operands[0].type).elem
    esize = 1 if elem in FP8_PTX else 2
    k_inst = 32 // esize  # k of one wgmma: 16 (16-bit types), 32 (fp8)
    b_mn_major = not plan["b_k_major"]
    etype = ir.Type.parse(elem)
    acc_n = bn // 2  # f32 accumulators a thread: 64 x bn over 128 threads
    f32 = ir.F32Type.get()
    acc_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * acc_n) + ")>")
    ahead = stages - 1 - inflight
    with kernel.location:
        g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target), [], (threads, 1, 1))  # window: _carve_aligned
        n_in = len(view.args)
        pw = Pointwise(g, view, g.args[:n_in])
        a_val, b_val = gm.mm.operands
        with ir.InsertionPoint(g.entry):
            per_row = SWIZZLE_BYTES // esize
            b_rows = bn if not b_mn_major else bk * (bn * esize // SWIZZLE_BYTES)
            As, Bs = _carve_aligned(g, [(stages * bm, per_row, etype), (stages * b_rows, per_row, etype)])
            tid = g.tid()
            col_tile, row_tile = grouped_tiles(g, plan["grid"][0], plan["grid"][1], plan.get("group_m", 0))
            batch_idx = g.delinearize(g.bid("z"), gm.batch) if gm.batch else []
            m0, n0 = g.mul(row_tile, bm), g.mul(col_tile, bn)
            a_lead = pw.operand_index(spec_of(a_val.type).shape[:-2], batch_idx, len(gm.batch))
            b_lead = pw.operand_index(spec_of(b_val.type).shape[:-2], batch_idx, len(gm.batch))
            a_direct = direct_source(view, g.args[:n_in], a_val, a_lead, False)
            b_direct = direct_source(view, g.args[:n_in], b_val, b_lead, not b_mn_major)
            if a_direct is None or b_direct is None:
                raise NotApplicable("the wgmma plan reads both operands straight from arguments")
            a_tile = SwizzledTile(g, tid, threads, As, a_direct, bm, bk, esize, M, K, False)
            b_tile = SwizzledTile(g, tid, threads, Bs, b_direct, bn, bk, esize, N, K, b_mn_major)
            warp, lane = g.div(tid, 32), g.rem(tid, 32)
            wg = g.div(warp, 4)
            i64 = ir.IntegerType.get_signless(64)
            # this warpgroup's 64 rows of A: 64 rows of 128 bytes from the stage's start
            a_desc0 = arith.addi(a_tile.descriptor_base(),
                                 arith.index_cast(i64, g.mul(wg, 64 * SWIZZLE_BYTES // 16)))
            b_desc0 = b_tile.descriptor_base()
            wg_attrs = _wgmma_attrs(elem, bn, k_inst, b_mn_major)

            def issue(kb: ir.Value | int, stage: ir.Value | int) -> None:
                a_tile.copy_async(m0, kb, stage)
                b_tile.copy_async(n0, kb, stage)
                nvvm.cp_async_commit_group()

            for s in range(ahead):
                issue(s * bk, s)

            def k_step(k0, carried):
                (acc,) = carried
                step = g.div(k0, bk)
                nvvm.cp_async_wait_group(ahead - 1)
                # this thread's landed copies, visible to the async proxy wgmma reads through
                nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                                  space=ir.Attribute.parse("#nvvm.shared_space<cta>"))
                gpu.barrier()
                issue(g.add(k0, ahead * bk), g.rem(g.add(step, ahead), stages))
                cur = g.rem(step, stages)
                a_stage = arith.index_cast(i64, g.mul(cur, a_tile.stage_bytes // 16))
                b_stage = arith.index_cast(i64, g.mul(cur, b_tile.stage_bytes // 16))
                a_d, b_d = arith.addi(a_desc0, a_stage), arith.addi(b_desc0, b_stage)
                nvvm.wgmma_fence_aligned()
                for t in range(bk // k_inst):
                    da = arith.addi(a_d, _i64(a_tile.slice_offset(t, k_inst) // 16))
                    db = arith.addi(b_d, _i64(b_tile.slice_offset(t, k_inst) // 16))
                    acc = nvvm.WgmmaMmaAsyncOp(acc_t, acc, da, db, *wg_attrs).result
                nvvm.wgmma_commit_group_sync_aligned()
                nvvm.wgmma_wait_group_sync_aligned(inflight)
                return [acc]

            zero = llvm.mlir_zero(acc_t)
            (acc,) = g.loop(0, K, bk, [zero], k_step)
            nvvm.wgmma_wait_group_sync_aligned(0)
            nvvm.cp_async_wait_group(0)  # nothing may still be landing in shared memory at exit

            outs = g.args[n_in:]
            gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
            row_base = arith.addi(m0, arith.addi(g.mul(wg, 64), arith.addi(g.mul(g.rem(warp, 4), 16), gid)))
            col_base = arith.addi(n0, tig2)
            for i in range(bn // 8):
                for h in range(2):
                    gr = g.add(row_base, 8 * h)
                    for e in range(2):
                        gc = g.add(col_base, 8 * i + e)
                        conds = [c for c in (g.lt(gr, M) if M % bm else None, g.lt(gc, N) if N % bn else None)
                                 if c is not None]

                        def store(k=4 * i + 2 * h + e, gr=gr, gc=gc):
                            pw.reset()
                            pw.bind(gm.mm.result, llvm.extractvalue(f32, acc, [k]))
                            idx = list(batch_idx) + [gr, gc]
                            for r, o in zip(view.results, outs):
                                store_value(pw.eval(r, idx), o, idx)

                        g.when(g.all_of(conds), store)
        g.finish()
    inst = f"wgmma.m64n{bn}k{k_inst}.{_WGMMA_TYPES[elem]}"
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                         {"strategy": "matmul", "tensor_cores": inst, "workgroup_bytes": plan["shared_bytes"],
                          "tile": [bm, bn, bk], "stages": stages})


def _wgmma_attrs(elem: str, n: int, k: int, b_mn_major: bool) -> list[ir.Attribute]:
    """shape, typeA, typeB, typeD, scaleD, scaleA, scaleB, layoutA, layoutB of
    nvvm.wgmma.mma_async: A K-major (``row``); B K-major is ``col``, MN-major ``row``
    (which MLIR prints as imm-trans-b = 1)."""
    t = _WGMMA_TYPES[elem]
    p = ir.Attribute.parse
    return [p(f"#nvvm.shape<m = 64, n = {n}, k = {k}>"), p(f"#nvvm.wgmma_type<{t}>"), p(f"#nvvm.wgmma_type<{t}>"),
            p("#nvvm.wgmma_type<f32>"), p("#nvvm.wgmma_scale_out<one>"), p("#nvvm.wgmma_scale_in<one>"),
            p("#nvvm.wgmma_scale_in<one>"), p("#nvvm.mma_layout<row>"),
            p(f"#nvvm.mma_layout<{'row' if b_mn_major else 'col'}>")]
