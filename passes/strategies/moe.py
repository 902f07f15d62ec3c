"""Strategies for the kernels kf-recognize-moe makes: ``moe_route``, ``moe_gemm`` and
``moe_combine`` (passes/recognize_moe.py says what each computes; its kernel functions'
bodies are the reference in kf ops, and their ``kf.moe`` attribute names the sizes and
options these strategies read).

- ``moe_route``: one workgroup does a stable counting sort of the N = T*K (token, slot)
  pairs by expert, so the result is deterministic without atomics. Thread i owns the
  contiguous slots [i*C, (i+1)*C). For each bucket b (experts 0..E-1, then E for
  out-of-range indices) every thread counts its slots of b, a Hillis-Steele scan over
  the threads' counts in workgroup memory gives each thread its first row in the
  bucket, and the thread writes ``slot_row`` / ``row_token`` for its slots in slot order.
  E+1 buckets cost (E+1) * (2C loads + log2(threads) barriers): microseconds at the
  benchmark's 16k slots, against GEMMs of milliseconds.
- ``moe_gemm``: a grouped GEMM. Workgroup (x, y) takes column tile x of row tile y of
  the concatenation of the buckets' row ranges, each bucket's range cut into BLOCK_M
  tiles of its own (so a tile never mixes experts): y is found by a scan over the
  E+1 offsets, and workgroups past the last tile return. The grid's y extent is the
  static bound ceil(N / BLOCK_M) + E + 1 on the number of such tiles. The K loop is the
  matmul strategy's: on CUDA with f16/bf16 its tensor-core loop (mma.sync m16n8k16,
  f32 accumulators, fragments by ldmatrix with the weights staged k-major as they lie;
  register prefetch of the next tiles where the cp.async pipeline does not apply),
  else its SIMT loop (f32
  accumulators in a THREAD_M x THREAD_N register tile); tiles go through workgroup
  memory, read with 128-bit loads on CUDA (``VectorStaging``). The B tile is read
  from the expert's slice of the stacked weights; for the first projection the A
  tile's rows are read from x through ``row_token`` while it is staged (one index load
  per row vector, no copy of x). Since a bucket's tiles start at any row, every A load
  is guarded by the row count even when it is a multiple of BLOCK_M. The epilogue
  applies the GELU, rounds once and stores the rows of the tile's bucket only. Bucket
  E rows (out-of-range indices) are computed with the last expert's weights, as the
  reference body says, and never read.
- ``moe_combine``: one thread per output element sums its token's K slots in f32:
  ``w[t,j] * y[slot_row[t*K+j], n]`` for the slots whose index is in range.

Not done: fusing the combine into the second GEMM's epilogue (it would need atomics,
or a second pass, to stay deterministic); wgmma/TMA; a persistent schedule of the
tiles (the grid's unused y tiles return at once, up to E + 1 of a column).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref

from . import emit as E
from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .kernel_ir import (
    Direct,
    GpuFunc,
    KernelView,
    VectorStaging,
    stage_tile,
    staging_vector_bytes,
    store_value,
    workgroup_memref,
)
from .matmul import MatmulStrategy
from .matmul.simt import simt_tile_products
from .nvidia.mma_sync import MmaSync, mma_k_loop, mma_pipelined_k_loop


def moe_attrs(kernel: ir.Operation) -> dict:
    """The kf.moe attribute of a kernel function as a Python dict."""
    d = ir.DictAttr(kernel.attributes["kf.moe"])
    out = {}
    for i in range(len(d)):
        a = d[i].attr
        if isinstance(a, ir.BoolAttr):
            out[d[i].name] = bool(a.value)
        elif isinstance(a, ir.IntegerAttr):
            out[d[i].name] = int(a.value)
        else:
            out[d[i].name] = ir.StringAttr(a).value
    return out


def _arg_types(view: KernelView, target: TargetInfo) -> list[ir.Type]:
    return [E.memref_type(s, target.name) for s in [*view.arg_specs, *view.result_specs]]


class _NoMemo:
    """stage_tile resets a Pointwise's memo before each element; these reads keep none."""

    def reset(self) -> None:
        pass


def _idx(v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), v)


def _i32(g: GpuFunc, v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IntegerType.get_signless(32), v)


def _routed_expert(g: GpuFunc, idx_mem: ir.Value, lead_shape, t: ir.Value, j: int | ir.Value,
                   n_experts: int) -> tuple[ir.Value, ir.Value]:
    """(valid, expert as index: E when invalid) of slot j of token t."""
    tix = g.delinearize(t, lead_shape) if lead_shape else []
    v = memref.load(idx_mem, tix + [g.c(j) if isinstance(j, int) else j])
    it = v.type
    lo = arith.cmpi(arith.CmpIPredicate.sge, v, scalar_math.const(it, 0))
    hi = arith.cmpi(arith.CmpIPredicate.slt, v, scalar_math.const(it, n_experts))
    valid = arith.andi(lo, hi)
    return valid, arith.select(valid, _idx(v), g.c(n_experts))


# --------------------------------------------------------------------------- routing


class MoeRouteStrategy(Strategy):
    KIND = "moe_route"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """One workgroup: 1024 threads on CUDA, 256 on SPIR-V, fewer for few slots."""
        info = moe_attrs(kernel)
        n = info["rows"]
        threads = min(1024 if target.name == "cuda" else target.max_threads, max(32, 1 << (n - 1).bit_length()))
        return {"threads": threads, "chunk": -(-n // threads), "grid": [1, 1, 1], "rows": n,
                "experts": info["experts"], "shared_bytes": 4 * threads}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        threads, C = plan["threads"], plan["chunk"]
        N, K, n_exp = info["rows"], info["top_k"], info["experts"]
        lead = view.arg_specs[0].shape[:-1]
        i32 = ir.IntegerType.get_signless(32)
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target), [workgroup_memref([threads], i32)],
                        (threads, 1, 1))
            idx, offsets, row_token, slot_row = g.args
            buf = g.shared[0]
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                first = g.mul(tid, C)
                zero32 = arith.constant(i32, 0)
                false = arith.constant(ir.IntegerType.get_signless(1), 0)

                def is_in(s: ir.Value, b: ir.Value) -> ir.Value:
                    """slot s (< N) is routed to bucket b."""
                    _, key = _routed_expert(g, idx, lead, g.div(s, K), g.rem(s, K), n_exp)
                    return arith.cmpi(arith.CmpIPredicate.eq, key, b)

                def in_range(s: ir.Value):
                    return g.lt(s, N) if threads * C != N else None

                def bucket(b: ir.Value, carried):
                    (base,) = carried

                    def count(i, acc):
                        s = arith.addi(first, i)
                        hit = g.guarded(in_range(s), [ir.IndexType.get()],
                                        lambda: [arith.select(is_in(s, b), g.c(1), g.c(0))], lambda: [g.c(0)])[0]
                        return [arith.addi(acc[0], hit)]

                    (cnt,) = g.loop(0, C, 1, [g.c(0)], count)
                    gpu.barrier()  # the previous bucket's reads of buf are done
                    memref.store(_i32(g, cnt), buf, [tid])
                    off = 1
                    while off < threads:  # inclusive scan of the threads' counts
                        gpu.barrier()
                        cur = memref.load(buf, [tid])
                        prev = g.guarded(arith.cmpi(arith.CmpIPredicate.uge, tid, g.c(off)), [i32],
                                         lambda o=off: [memref.load(buf, [arith.subi(tid, g.c(o))])],
                                         lambda: [zero32])[0]
                        gpu.barrier()
                        memref.store(arith.addi(cur, prev), buf, [tid])
                        off *= 2
                    gpu.barrier()
                    incl = _idx(memref.load(buf, [tid]))
                    total = _idx(memref.load(buf, [g.c(threads - 1)]))
                    g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)),
                           lambda: memref.store(_i32(g, base), offsets, [b]))

                    def place(i, pos):
                        s = arith.addi(first, i)
                        hit = g.guarded(in_range(s), [false.type], lambda: [is_in(s, b)], lambda: [false])[0]

                        def write():
                            memref.store(_i32(g, pos[0]), slot_row, [s])
                            memref.store(_i32(g, g.div(s, K)), row_token, [pos[0]])

                        g.when(hit, write)
                        return [arith.addi(pos[0], arith.select(hit, g.c(1), g.c(0)))]

                    g.loop(0, C, 1, [arith.addi(base, arith.subi(incl, cnt))], place)
                    return [arith.addi(base, total)]

                g.loop(0, n_exp + 1, 1, [g.c(0)], bucket)
                g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)),
                       lambda: memref.store(arith.constant(i32, N), offsets, [g.c(n_exp + 1)]))
            g.finish()
        return EmittedKernel(view.name, (1, 1, 1), (threads, 1, 1), 0,
                             {"strategy": self.KIND, "workgroup_bytes": plan["shared_bytes"]})


# --------------------------------------------------------------------------- grouped GEMM


class _GatherStaging(VectorStaging):
    """VectorStaging of the first projection's A tile, rows gathered: tile row r is
    ``x[row_token[row0 + r]]``, each vector a piece of that row. Every load is guarded by
    ``row < n_rows`` (a bucket's tiles start anywhere, so no row tail is ever known to
    be absent) and reads row_token only where it is in bounds."""

    def __init__(self, g: GpuFunc, tid: ir.Value, threads: int, tile: ir.Value, rows: int, cols: int,
                 n_rows: int, n_cols: int, transposed: bool, x: ir.Value, row_token: ir.Value, vector_bytes: int):
        super().__init__(g, tid, threads, tile, rows, cols, n_rows, n_cols, transposed, Direct(x, [], False),
                         vector_bytes)
        self.row_token = row_token
        self.token_shape = ir.MemRefType(x.type).shape[:-1]

    def load(self, row0: ir.Value | int, col0: ir.Value | int, guard_all: bool = True) -> list[ir.Value]:
        from mlir.dialects import vector

        g, d = self.g, self.direct
        zero = arith.constant(self.src_t, ir.DenseElementsAttr.get_splat(
            self.src_t, ir.FloatAttr.get(self.src_t.element_type, 0.0)))
        out = []
        for rr, cc, in_tile in self.slots:
            gr = arith.addi(row0, rr) if not isinstance(row0, int) else g.add(rr, row0)
            gc = arith.addi(col0, cc) if not isinstance(col0, int) else g.add(cc, col0)
            cond = g.all_of([c for c in (in_tile, g.lt(gr, self.n_rows), g.lt(gc, self.n_cols)) if c is not None])

            def load_row(gr=gr, gc=gc):
                tok = _idx(memref.load(self.row_token, [gr]))
                at = (g.delinearize(tok, self.token_shape) if self.token_shape else []) + [gc]
                return [vector.load(self.src_t, d.mem, at, alignment=self.vec * self.width)]

            out.append(g.guarded(cond, [self.src_t], load_row, lambda: [zero])[0])
        return out

    def copy_async(self, row0: ir.Value | int, col0: ir.Value | int, tile_row0: ir.Value | int = 0) -> None:
        """As VectorStaging.copy_async, each row read at its token's row of x: the token
        index is loaded at a clamped (in-bounds) row and the copy moves 0 bytes (zeros)
        outside the packed rows or past K."""
        from mlir.dialects import nvgpu

        g, d = self.g, self.direct
        for rr, cc, in_tile in self.slots:
            gr = arith.addi(row0, rr) if not isinstance(row0, int) else g.add(rr, row0)
            gc = arith.addi(col0, cc) if not isinstance(col0, int) else g.add(cc, col0)
            cond = g.all_of([g.lt(gr, self.n_rows), g.lt(gc, self.n_cols)])
            gr, gc = arith.select(cond, gr, g.c(0)), arith.select(cond, gc, g.c(0))
            n = arith.select(cond, g.c(self.vec), g.c(0))
            at = [g.add(rr, tile_row0) if isinstance(tile_row0, int) else arith.addi(rr, tile_row0), cc]

            def copy(gr=gr, gc=gc, n=n, at=at):
                tok = _idx(memref.load(self.row_token, [gr]))
                index = (g.delinearize(tok, self.token_shape) if self.token_shape else []) + [gc]
                nvgpu.device_async_copy(self.tile, at, d.mem, index, ir.IntegerAttr.get(ir.IndexType.get(), self.vec),
                                        src_elements=n, bypass_l1=True)

            g.when(in_tile, copy)


@dataclass(frozen=True)
class MoeGemmVariant:
    """The grouped GEMMs' variants (``kf-tile{moe_gemm.<field>=<value>}``)."""

    #: depth of the tensor-core kernel's cp.async pipeline (1: one staged tile, the next
    #: K step's prefetched into registers); fewer where shared memory is short
    stages: int = 4
    #: bytes a staging load moves: 0 the target's own (its widest access on CUDA, scalars
    #: on SPIR-V); 16 gives every target CUDA's 128-bit staging (kf-to-spirv splits the
    #: vectors into scalars), so that its index arithmetic runs on lavapipe too
    staging_bytes: int = 0


class MoeGemmStrategy(Strategy):
    KIND = "moe_gemm"
    VARIANT = MoeGemmVariant

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: MoeGemmVariant | None = None) -> dict:
        """Tensor cores (mma.sync m16n8k16, f32 accumulators) for f16/bf16 on CUDA with
        the matmul strategy's warp layout: 128x128 tiles of 8 warps when that gives
        about a wave of workgroups, else 64x64 of 4. Otherwise the SIMT matmul's tiles:
        128x128 with 8x8 a thread on CUDA when that gives a wave, else 64x64 with 4x4;
        BLOCK_K the largest of 32/16/8 that fits the shared memory. Tiles are counted on
        the packed rows, as if they were one matrix."""
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        n_rows, n_cols = view.result_specs[0].shape
        k = view.arg_specs[1].shape[1]
        elem = view.arg_specs[1].elem
        big = target.name == "cuda" and -(-n_rows // 128) * -(-n_cols // 128) >= 128
        v = variant or MoeGemmVariant()
        common = {"m": n_rows, "n": n_cols, "k": k, "experts": info["experts"],
                  "vector_bytes": v.staging_bytes or staging_vector_bytes(target)}
        if target.name == "cuda" and elem in ("f16", "bf16"):
            warps_m, warps_n, tiles_m, tiles_n = (2, 4, 4, 4) if big else (2, 2, 2, 4)
            bm, bn, bk = warps_m * 16 * tiles_m, warps_n * 8 * tiles_n, 32
            # with ldmatrix, B (the expert's [K, N] weights) is staged k-major as it lies
            ldm = True
            stage_bytes = 2 * (bm * (bk + 8) + (bk * (bn + 8) if ldm else bn * (bk + 8)))
            # the matmul strategy's cp.async pipeline where A's rows (K) and the weights'
            # rows (N) are whole 16-byte pieces and B is staged k-major as it lies
            stages = v.stages
            if not (stages >= 2 and ldm and k % 8 == 0 and n_cols % 8 == 0 and common["vector_bytes"] == 16):
                stages = 1
            while stages > 2 and stages * stage_bytes > target.max_dynamic_shared_bytes:
                stages -= 1
            shared = stages * stage_bytes
            if 32 * warps_m * warps_n <= target.max_threads and shared <= target.max_dynamic_shared_bytes:
                return {"block_m": bm, "block_n": bn, "block_k": bk, "warps_m": warps_m, "warps_n": warps_n,
                        "mma_tiles_m": tiles_m, "mma_tiles_n": tiles_n, "threads": 32 * warps_m * warps_n,
                        "grid": self._grid(n_rows, n_cols, bm, bn, info["experts"]), "shared_bytes": shared,
                        "mma": True, "prefetch": stages == 1, "ldmatrix": ldm,
                        "stages": stages, "dynamic_shared": shared > target.max_shared_bytes, **common}
        bm, bn, tm, tn = (128, 128, 8, 8) if big else (64, 64, 4, 4)
        while (bm // tm) * (bn // tn) > target.max_threads:
            bm, bn = bm // 2, bn // 2
        bk = next((c for c in (32, 16, 8) if MatmulStrategy._shared(bm, bn, c) <= target.max_shared_bytes), 8)
        return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm, "thread_n": tn,
                "threads": (bm // tm) * (bn // tn), "grid": self._grid(n_rows, n_cols, bm, bn, info["experts"]),
                "shared_bytes": MatmulStrategy._shared(bm, bn, bk), "mma": False, **common}

    @staticmethod
    def _grid(n_rows: int, n_cols: int, bm: int, bn: int, n_experts: int) -> list[int]:
        """Column tiles by row tiles: the buckets' tiles number at most ceil(N / BLOCK_M)
        + E + 1 (each of the E+1 buckets adds at most one partial tile)."""
        grid = [-(-n_cols // bn), -(-n_rows // bm) + n_experts + 1, 1]
        if grid[1] > 65535:
            raise ValueError(f"{n_rows} MoE rows need {grid[1]} row tiles, more than a grid's y extent")
        return grid

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
        mma = bool(plan.get("mma"))
        if mma and target.name != "cuda":
            raise ValueError("the tensor-core moe_gemm plan is for CUDA")
        elem = ir.Type.parse(view.arg_specs[1].elem) if mma else ir.F32Type.get()
        ldm = mma and bool(plan.get("ldmatrix"))
        stages = plan.get("stages", 1) if mma else 1
        shared = ([workgroup_memref([stages * bm, bk + 8], elem),
                   workgroup_memref([stages * bk, bn + 8] if ldm else [bn, bk + 8], elem)] if mma
                  else [workgroup_memref([bk, bm + 1]), workgroup_memref([bk, bn])])
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target), shared, (threads, 1, 1),
                        dynamic_shared=plan.get("dynamic_shared", False))
            with ir.InsertionPoint(g.entry):
                tile = g.bid("y")
                i1 = ir.IntegerType.get_signless(1)

                def scan(b, carried):
                    start, bucket, m0, m_end, found = carried
                    lo = _idx(memref.load(g.args[2], [b]))
                    hi = _idx(memref.load(g.args[2], [g.add(b, 1)]))
                    end = arith.addi(start, g.div(g.add(arith.subi(hi, lo), bm - 1), bm))
                    here = arith.andi(arith.cmpi(arith.CmpIPredicate.uge, tile, start),
                                      arith.cmpi(arith.CmpIPredicate.ult, tile, end))
                    row0 = arith.addi(lo, g.mul(arith.subi(tile, start), bm))
                    return [end, arith.select(here, b, bucket), arith.select(here, row0, m0),
                            arith.select(here, hi, m_end), arith.ori(found, here)]

                init = [g.c(0), g.c(0), g.c(0), g.c(0), arith.constant(i1, 0)]
                _, bucket, m0, m_end, found = g.loop(0, info["experts"] + 1, 1, init, scan)
                tile_of = _Tile(g, view, info, plan, target, bucket, m0, m_end)
                g.when(found, tile_of.mma if mma else tile_of.simt)
            g.finish()
        notes = {"strategy": self.KIND, "workgroup_bytes": plan["shared_bytes"], "tile": [bm, bn, bk],
                 "gather": info["gather"]}
        if mma:
            notes["tensor_cores"] = "mma.sync.m16n8k16"
            notes["stages"] = stages
        else:
            notes["thread_tile"] = [plan["thread_m"], plan["thread_n"]]
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes, notes)


class _Tile:
    """One workgroup's output tile of a grouped GEMM: rows m0 .. m_end (< m0 + BLOCK_M)
    of bucket ``bucket``, columns of block x; ``simt`` and ``mma`` write its body."""

    def __init__(self, g: GpuFunc, view: KernelView, info: dict, plan: dict, target: TargetInfo,
                 bucket: ir.Value, m0: ir.Value, m_end: ir.Value):
        self.g, self.info, self.plan, self.target = g, info, plan, target
        self.bucket, self.m0, self.m_end = bucket, m0, m_end
        self.a_mem, self.w_mem = g.args[0], g.args[1]
        self.row_token = g.args[3] if info["gather"] else None
        self.out = g.args[-1]
        self.token_shape = view.arg_specs[0].shape[:-1]
        self.M, self.N, self.K = plan["m"], plan["n"], plan["k"]

    def _setup(self):
        g = self.g
        # Bucket E (out-of-range indices) is computed with the last expert and never read.
        self.expert = arith.minui(self.bucket, g.c(self.info["experts"] - 1))
        self.n0 = g.mul(g.bid("x"), self.plan["block_n"])
        self.tid = g.tid()

    def read_a(self, r: ir.Value, c: ir.Value) -> ir.Value:
        """A[r, c] in f32, zero past the packed rows: a bucket's tiles start anywhere, so
        a tile can reach past row M even when M is a multiple of BLOCK_M."""
        g = self.g
        f32 = ir.F32Type.get()

        def value():
            if self.row_token is not None:
                tok = _idx(memref.load(self.row_token, [r]))
                at = (g.delinearize(tok, self.token_shape) if self.token_shape else []) + [c]
            else:
                at = [r, c]
            return [scalar_math.convert(memref.load(self.a_mem, at), f32)]

        return g.guarded(g.lt(r, self.M), [f32], value, lambda: [g.fconst(0.0)])[0]

    def read_b(self, r: ir.Value, c: ir.Value) -> ir.Value:
        return scalar_math.convert(memref.load(self.w_mem, [self.expert, r, c]), ir.F32Type.get())

    def a_staging(self, tile: ir.Value, rows: int, cols: int, transposed: bool) -> VectorStaging:
        vb = self.plan.get("vector_bytes", 0)
        if self.row_token is not None:
            return _GatherStaging(self.g, self.tid, self.plan["threads"], tile, rows, cols, self.M, self.K,
                                  transposed, self.a_mem, self.row_token, vb)
        return VectorStaging(self.g, self.tid, self.plan["threads"], tile, rows, cols, self.M, self.K, transposed,
                             Direct(self.a_mem, [], False), vb)

    def store(self, v: ir.Value, gr: ir.Value, gc: ir.Value) -> None:
        """Guarded by the bucket's end and the column tail: the activation, one rounding."""
        g = self.g
        conds = [arith.cmpi(arith.CmpIPredicate.ult, gr, self.m_end)]
        if self.N % self.plan["block_n"]:
            conds.append(g.lt(gc, self.N))

        def write():
            x = v
            if self.info["activation"] == "gelu":
                x = scalar_math.emit("gelu", [x], {"approximate": self.info["approximate"]})
            store_value(x, self.out, [gr, gc])

        g.when(g.all_of(conds), write)

    def simt(self) -> None:
        """The SIMT matmul's K loop (see matmul.py): A staged k-major, B n-major."""
        g, p = self.g, self.plan
        self._setup()
        As, Bs = g.shared
        bm, bn, bk, tm, tn, threads = p["block_m"], p["block_n"], p["block_k"], p["thread_m"], p["thread_n"], \
            p["threads"]
        cols = bn // tn
        tr, tc = g.div(self.tid, cols), g.rem(self.tid, cols)
        vb = p.get("vector_bytes", 0)
        a_stage = self.a_staging(As, bm, bk, True)
        b_direct = Direct(self.w_mem, [self.expert], False)
        row_of = [g.add(tr, i * (bm // tm)) for i in range(tm)]
        col_of = [g.add(tc, j * cols) for j in range(tn)]

        def k_step(k0, acc):
            gpu.barrier()
            if a_stage.ok:
                a_stage.store(a_stage.load(self.m0, k0, True))
            else:
                stage_tile(g, _NoMemo(), self.tid, threads, As, bm, bk, True, self.m0, self.M, k0, self.K,
                           self.read_a, transposed=True)
            stage_tile(g, _NoMemo(), self.tid, threads, Bs, bk, bn, True, k0, self.K, self.n0, self.N, self.read_b,
                       direct=b_direct, vector_bytes=vb)
            gpu.barrier()
            return simt_tile_products(g, As, Bs, row_of, col_of, bk, tn, acc)

        acc = g.loop(0, self.K, bk, [g.fconst(0.0)] * (tm * tn), k_step)
        for i in range(tm):
            gr = arith.addi(self.m0, row_of[i])
            for j in range(tn):
                self.store(acc[i * tn + j], gr, g.add(self.n0, col_of[j]))

    def mma(self) -> None:
        """The matmul strategy's tensor-core K loop (matmul/mma.py): A staged
        m-major and B n-major in the input type, each warp's fragments from them, 4 f32
        accumulators per 16x8 tile; the next K step's tiles are prefetched into
        registers when both stagings take vectors."""
        g, p = self.g, self.plan
        self._setup()
        As, Bs = g.shared
        bm, bn, bk, threads = p["block_m"], p["block_n"], p["block_k"], p["threads"]
        wn, tms, tns = p["warps_n"], p["mma_tiles_m"], p["mma_tiles_n"]
        tc = MmaSync(str(ir.MemRefType(As.type).element_type))
        tid = self.tid
        warp, lane = g.div(tid, 32), g.rem(tid, 32)
        wm0 = g.mul(g.div(warp, wn), 16 * tms)
        wn0 = g.mul(g.rem(warp, wn), 8 * tns)
        gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
        a_rows = [arith.addi(wm0, g.add(gid, 16 * i)) for i in range(tms)]
        b_cols = [arith.addi(wn0, g.add(gid, 8 * j)) for j in range(tns)]
        vb = p.get("vector_bytes", 0)
        ldm = bool(p.get("ldmatrix"))  # fragments by ldmatrix, B k-major ([K, N] as the weights lie)
        lt = tc.lane_terms(g, lane) if ldm else None
        b_direct = Direct(self.w_mem, [self.expert], False)
        a_stage = self.a_staging(As, bm, bk, False)
        b_stage = VectorStaging(g, tid, threads, Bs, bk, bn, self.K, self.N, not ldm, b_direct, vb)
        # Register prefetch where the plan says so (one staged tile); without
        # it the gathered A rows are still staged with vectors.
        prefetch = bool(p.get("prefetch")) and a_stage.ok and b_stage.ok

        def stage(k0):
            if a_stage.ok and self.row_token is not None:
                a_stage.store(a_stage.load(self.m0, k0, True))
            else:
                stage_tile(g, _NoMemo(), tid, threads, As, bm, bk, True, self.m0, self.M, k0, self.K, self.read_a)
            stage_tile(g, _NoMemo(), tid, threads, Bs, bk, bn, True, k0, self.K, self.n0, self.N, self.read_b,
                       transposed=not ldm, direct=b_direct, vector_bytes=vb)

        stages = p.get("stages", 1)
        if stages > 1:
            if not (a_stage.copies_async and b_stage.copies_async):
                raise NotApplicable(f"the plan's {stages}-stage cp.async pipeline needs both tiles staged as "
                                    "16-byte copies")
            acc = mma_pipelined_k_loop(
                g, self.K, bk, 4 * tms * tns, stages, a_stage, b_stage, self.m0, self.n0, bm, bk,
                lambda acc, a0, b0: tc.block_products(g, As, Bs, bk, tms, tns, acc, lt, wm0, wn0, True, a_rows,
                                                      b_cols, tig2, a0, b0))
        else:
            acc = mma_k_loop(
                g, self.K, bk, 4 * tms * tns, a_stage, b_stage, prefetch, self.m0, self.n0, stage,
                lambda acc: tc.block_products(g, As, Bs, bk, tms, tns, acc, lt, wm0, wn0, True, a_rows, b_cols,
                                              tig2))
        for i in range(tms):
            for h in range(2):
                gr = arith.addi(self.m0, g.add(arith.addi(wm0, gid), 16 * i + 8 * h))
                for j in range(tns):
                    for e in range(2):
                        gc = arith.addi(self.n0, g.add(arith.addi(wn0, tig2), 8 * j + e))
                        self.store(acc[4 * (i * tns + j) + 2 * h + e], gr, gc)


# --------------------------------------------------------------------------- combine


class MoeCombineStrategy(Strategy):
    KIND = "moe_combine"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        view = KernelView(kernel)
        total = math.prod(view.result_specs[0].shape)
        block = min(256, target.max_threads)
        grid, stride = E.launch_geometry(total, block, E.max_grid_x(target.name))
        return {"block": block, "numel": total, "grid": [grid, 1, 1], "grid_stride": stride}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        K, n_exp = info["top_k"], info["experts"]
        out_shape = view.result_specs[0].shape
        lead, G = out_shape[:-1], out_shape[-1]
        block, total = plan["block"], plan["numel"]
        f32 = ir.F32Type.get()
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target), [], (block, 1, 1))
            y, slot_row, wt, idx, out = g.args
            with ir.InsertionPoint(g.entry):
                kb = E.IndexBuilder(g.entry)

                def one(lin: ir.Value) -> None:
                    t, n = g.div(lin, G), g.rem(lin, G)
                    tix = g.delinearize(t, lead) if lead else []
                    acc = g.fconst(0.0)
                    for j in range(K):
                        valid, _ = _routed_expert(g, idx, lead, t, j, n_exp)
                        r = _idx(memref.load(slot_row, [g.add(g.mul(t, K), j)]))
                        w = scalar_math.convert(memref.load(wt, tix + [g.c(j)]), f32)
                        v = scalar_math.convert(memref.load(y, [r, n]), f32)
                        acc = arith.addf(acc, arith.select(valid, arith.mulf(w, v), g.fconst(0.0)))
                    store_value(acc, out, tix + [n])

                E.for_each_thread_item(kb, total, block, plan["grid"][0], bool(plan["grid_stride"]), one)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (block, 1, 1), 0, {"strategy": self.KIND})


register(MoeRouteStrategy())
register(MoeGemmStrategy())
register(MoeCombineStrategy())
