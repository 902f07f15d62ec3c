"""The matmul strategy's SIMT GEMM: every target, f32 and where no tensor-core kernel
applies (see the package's docstring for its shape)."""

from __future__ import annotations

from collections.abc import Sequence

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import gpu, memref
from mlir.dialects import math as mmath

from ..base import EmittedKernel, TargetInfo
from ..kernel_ir import (GpuFunc, KernelView, Pointwise, direct_source, stage_tile, store_value,
                         workgroup_memref)
from .gemm import Gemm, RunTimeRows, gpu_arg_types_with_sizes, tail_guard


def emit(view: KernelView, gm: Gemm, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
         target: TargetInfo) -> EmittedKernel:
    """The SIMT GEMM kernel of a plan (``plan.plan``); with run-time sizes
    (``RunTimeRows``) M or the batch is read from the size slots."""
    bm, bn, bk = plan["block_m"], plan["block_n"], plan["block_k"]
    tm, tn, threads = plan["thread_m"], plan["thread_n"], plan["threads"]
    N = gm.n
    run_time = RunTimeRows.of(view, plan)
    a_sh, b_sh = workgroup_memref([bk, bm + 1]), workgroup_memref([bk, bn])
    with kernel.location:
        g = GpuFunc(gpu_module, view.name, gpu_arg_types_with_sizes(view, target, plan), [a_sh, b_sh],
                    (threads, 1, 1))
        As, Bs = g.shared
        n_in = len(view.args)
        pw = Pointwise(g, view, g.args[:n_in])
        a_val, b_val = gm.mm.operands
        M = run_time.rows(g, gm) if run_time else gm.m
        K = run_time.depth(g, kernel, gm) if run_time else gm.k
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

            outs = g.args[n_in:n_in + len(view.results)]
            for i in range(tm):
                gr = g.add(m0, row_of[i])
                for j in range(tn):
                    gc = g.add(n0, col_of[j])
                    conds = [c for c in (tail_guard(g, gr, M, bm), tail_guard(g, gc, N, bn)) if c is not None]

                    def store(i=i, j=j, gr=gr, gc=gc):
                        pw.reset()
                        pw.bind(gm.mm.result, acc[i * tn + j])
                        idx = list(batch_idx) + [gr, gc]
                        for r, o in zip(view.results, outs):
                            store_value(pw.eval(r, idx), o, idx)

                    g.when(g.all_of(conds), store)
        g.finish()
    notes = {"strategy": "matmul", "workgroup_bytes": plan["shared_bytes"], "tile": [bm, bn, bk],
             "thread_tile": [tm, tn]}
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0, notes,
                         **RunTimeRows.launch(run_time, plan))


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
