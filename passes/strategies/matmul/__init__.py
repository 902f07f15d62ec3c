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

The kernel-building toolkit (``GpuFunc``, ``Pointwise``, tile staging) is ``kernel_ir.py``;
mma.sync and its K loops are ``nvidia/mma_sync.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from ..base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from ..kernel_ir import (GpuFunc, KernelView, Pointwise, VectorStaging, direct_source, gpu_arg_types, stage_tile,
                         staging_vector_bytes, store_value, workgroup_memref)
from ..nvidia.mma_sync import FP8_PTX, MMA_ELEMS, MmaSync, mma_k_loop, mma_pipelined_k_loop
from .gemm import Gemm, analyze, grouped_tiles

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


class MatmulStrategy(Strategy):
    KIND = "matmul"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """Tiles from the problem size and the target: 128x128 tiles with 8x8 per thread
        on CUDA when both M and N fill them, else 64x64 with 4x4 (256 threads either way,
        within Vulkan's guaranteed limit only for the smaller thread count: the plan
        shrinks the tile until threads and shared memory fit the target). BLOCK_K is
        the largest of 32/16/8 whose two staged tiles fit the shared-memory budget."""
        _, gm = analyze(kernel)
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

    def _mma_plan(self, gm: Gemm, target: TargetInfo) -> dict | None:
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

    def _emit_mma(self, view: KernelView, gm: Gemm, kernel: ir.Operation, plan: dict,
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
        view, gm = analyze(kernel)
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
