"""NVIDIA's warp-level tensor-core instruction, ``mma.sync``, and the K loops of the
GEMM kernels built on it (matmul, MoE).

``MmaSync`` is the instruction with f32 accumulators and the register packing its
fragments need (ldmatrix included); ``mma_k_loop`` stages the A and B tiles a K step at a
time (with a register prefetch of the next step's), ``mma_pipelined_k_loop`` keeps them
in a cp.async pipeline of several stages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref

from ..base import NotApplicable
from ..kernel_ir import GpuFunc, VectorStaging

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
