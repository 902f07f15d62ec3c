"""The matmul strategy's GEMM on mma.sync (``nvidia/mma_sync.py``): CUDA tensor cores
from sm_80, f16/bf16 operands (fp8 from sm_89), f32 accumulators.

Warps of a 2 x 2 or 2 x 4 layout each own a register tile of mma tiles (16 x 8); the A
and B tiles are staged in the input type, rows padded by 16 bytes (the fragment loads of
a warp hit 32 distinct banks), B as it lies in memory (k-major when its rows run along
n, read with ldmatrix.trans), either as a cp.async pipeline of several stages
(``mma_pipelined_k_loop``) or one staged tile with the next K step's tiles prefetched
into registers (``mma_k_loop``). The epilogue runs on the f32 accumulators in their
fragment layout.
"""

from __future__ import annotations

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith

from ..base import EmittedKernel, NotApplicable, TargetInfo
from ..kernel_ir import (GpuFunc, KernelView, Pointwise, VectorStaging, direct_source, stage_tile,
                         store_value, workgroup_memref)
from ..nvidia.mma_sync import FP8_PTX, MmaSync, mma_k_loop, mma_pipelined_k_loop
from .gemm import Gemm, RunTimeRows, gpu_arg_types_with_sizes, grouped_tiles, row_tiles, tail_guard

def emit(view: KernelView, gm: Gemm, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
         target: TargetInfo) -> EmittedKernel:
    """The tensor-core GEMM: per K step the workgroup stages A (m-major) and B
    (n-major) tiles between two barriers; each warp loads its A and B fragments
    from them and issues tiles_m x tiles_n mma.sync per 16 of K into f32
    accumulators, which the epilogue finishes in the accumulator layout."""
    bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
    wn, tms, tns = plan["warps_n"], plan["mma_tiles_m"], plan["mma_tiles_n"]
    N = gm.n
    run_time = RunTimeRows.of(view, plan)
    tc = MmaSync(spec_of(gm.mm.operands[0].type).elem)
    b_k_major, use_ldm = plan.get("b_k_major", False), plan.get("ldmatrix", False)
    pad = 16 // tc.esize  # 16 bytes a row: ldmatrix's and the fragment loads' rows hit distinct banks
    stages = plan.get("stages", 1)
    a_rows_s, b_rows_s = bm, (bk if b_k_major else bn)  # rows of one stage of each tile
    with kernel.location:
        g = GpuFunc(gpu_module, view.name, gpu_arg_types_with_sizes(view, target, plan),
                    [workgroup_memref([stages * bm, bk + pad], tc.type),
                     workgroup_memref([stages * bk, bn + pad] if b_k_major else [stages * bn, bk + pad], tc.type)],
                    (threads, 1, 1), dynamic_shared=plan.get("dynamic_shared", False))
        As, Bs = g.shared
        n_in = len(view.args)
        pw = Pointwise(g, view, g.args[:n_in])
        a_val, b_val = gm.mm.operands
        with ir.InsertionPoint(g.entry):
            M = run_time.rows(g, gm) if run_time else gm.m
            K = run_time.depth(g, kernel, gm) if run_time else gm.k
            tid = g.tid()
            col_tile, row_tile = grouped_tiles(g, plan["grid"][0], row_tiles(g, M, plan), plan.get("group_m", 0))
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
            outs = g.args[n_in:n_in + len(view.results)]
            for i in range(tms):
                for h in range(2):
                    gr = arith.addi(m0, g.add(arith.addi(wm0, gid), 16 * i + 8 * h))
                    for j in range(tns):
                        for e in range(2):
                            gc = arith.addi(n0, g.add(arith.addi(wn0, tig2), 8 * j + e))
                            conds = [c for c in (tail_guard(g, gr, M, bm), tail_guard(g, gc, N, bn)) if c is not None]

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
                          "stages": stages}, **RunTimeRows.launch(run_time, plan))
