"""The matmul strategy's GEMM on cooperative matrices (SPIR-V, VK_KHR_cooperative_matrix):
the Vulkan counterpart of the tensor cores, for f16 operands with f32 accumulators, on a
device that lists the shape (``plan.coopmat_plan``; bf16 stays on the SIMT kernel, see
``plan.COOPMAT_ELEMS``).

The kernel is written with MLIR's ``gpu.subgroup_mma_*`` ops (``subgroup_mma.py``), which
kf-to-spirv lowers through upstream ``convert-gpu-to-spirv`` to
``spirv.KHR.CooperativeMatrix{Load,MulAdd,Store}`` (declaring the capability and
extension, and the Vulkan memory model they need); no SPIR-V is written by hand. A plan
with ``emulated`` computes the products with the subgroups' invocations instead, so that
kf's tests run the kernel's dataflow on lavapipe.

- One workgroup computes a BLOCK_M x BLOCK_N tile of one batch element with 2 x 2
  subgroups, each owning tiles_m x tiles_n cooperative-matrix tiles (16 x 16 on NVIDIA)
  of f32 accumulators, carried through the K loop.
- Per K step the workgroup stages an A tile (BLOCK_M x BLOCK_K) and a B tile (BLOCK_K x
  BLOCK_N) in workgroup memory in the operand type, between two barriers, through
  ``stage_tile`` (so transposed and broadcast operands, and a cast before the matmul,
  are read as they lie); elements past M, N or K are staged as zero, so tails need no
  other care. Each subgroup loads its A and B matrices from the tiles (rows padded to
  16 bytes) and multiplies.
- The accumulators' layout in a subgroup is the driver's own, so the epilogue goes
  through workgroup memory: each subgroup stores its tiles into an f32 C tile, and after
  a barrier the workgroup's threads walk it element by element (consecutive threads
  along a row: coalesced stores), apply the fused elementwise chain (``Pointwise``) and
  store what is inside M and N, rounded once to the output type.

SPIRV-Cross and Metal (checked with the SPIRV-Cross of Debian 12, 2021.01.15): its MSL
back end throws on this SPIR-V ("Currently no block to insert opcode": it does not know
OpTypeCooperativeMatrixKHR), so the Metal target keeps the SIMT kernel (kf's Metal
limits list no cooperative matrices). SPIRV-Cross added cooperative matrices to MSL in
2026 as ``simdgroup_matrix``, at subgroup scope and 8 x 8 only: a 16 x 16 shape would
still be refused there, and Metal's matrices would need a plan of 8 x 8 tiles.
"""

from __future__ import annotations

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, memref

from ..base import EmittedKernel, TargetInfo
from ..kernel_ir import (GpuFunc, KernelView, Pointwise, _passes, direct_source, gpu_arg_types, stage_tile,
                         store_value, workgroup_memref)
from ..subgroup_mma import SubgroupMma
from .gemm import Gemm


def emit(view: KernelView, gm: Gemm, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
         target: TargetInfo) -> EmittedKernel:
    """The cooperative-matrix GEMM of a plan (``plan.coopmat_plan``)."""
    bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
    wn, tms, tns = plan["warps_n"], plan["coopmat_tiles_m"], plan["coopmat_tiles_n"]
    cm, cn, ck = plan["coopmat_shape"]
    a_ld, b_ld, c_ld = plan["lead"]  # the tiles' rows, padded
    M, N, K = gm.m, gm.n, gm.k
    elem = ir.Type.parse(spec_of(gm.mm.operands[0].type).elem)
    with kernel.location:
        g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target),
                    [workgroup_memref([bm, a_ld], elem), workgroup_memref([bk, b_ld], elem),
                     workgroup_memref([bm, c_ld])], (threads, 1, 1))
        As, Bs, Cs = g.shared
        n_in = len(view.args)
        pw = Pointwise(g, view, g.args[:n_in])
        a_val, b_val = gm.mm.operands
        with ir.InsertionPoint(g.entry):
            tid = g.tid()
            mma = SubgroupMma(g, (cm, cn, ck), elem, plan["subgroup_size"], plan.get("emulated", False))
            col_tile, row_tile = g.bid("x"), g.bid("y")
            batch_idx = g.delinearize(g.bid("z"), gm.batch) if gm.batch else []
            m0, n0 = g.mul(row_tile, bm), g.mul(col_tile, bn)
            sub = g.div(tid, plan["subgroup_size"])  # the workgroup is whole subgroups, in order
            wm0 = g.mul(g.div(sub, wn), cm * tms)  # the subgroup's first row and column in the tile
            wn0 = g.mul(g.rem(sub, wn), cn * tns)
            a_lead = pw.operand_index(spec_of(a_val.type).shape[:-2], batch_idx, len(gm.batch))
            b_lead = pw.operand_index(spec_of(b_val.type).shape[:-2], batch_idx, len(gm.batch))
            a_direct = direct_source(view, g.args[:n_in], a_val, a_lead, False)
            b_direct = direct_source(view, g.args[:n_in], b_val, b_lead, False)

            def k_step(k0, acc):
                gpu.barrier()
                stage_tile(g, pw, tid, threads, As, bm, bk, gm.a_k_contiguous, m0, M, k0, K,
                           lambda r, c: pw.eval(a_val, a_lead + [r, c]), direct=a_direct)
                stage_tile(g, pw, tid, threads, Bs, bk, bn, gm.b_n_contiguous, k0, K, n0, N,
                           lambda r, c: pw.eval(b_val, b_lead + [r, c]), direct=b_direct)
                gpu.barrier()
                n = mma.acc_count
                tiles = [acc[t * n:(t + 1) * n] for t in range(tms * tns)]
                for kk in range(0, bk, ck):
                    tiles = [mma.mma(tiles[i * tns + j], As, [g.add(wm0, cm * i), g.c(kk)],
                                     Bs, [g.c(kk), g.add(wn0, cn * j)]) for i in range(tms) for j in range(tns)]
                return [v for t in tiles for v in t]

            acc = g.loop(0, K, bk, mma.zero() * (tms * tns), k_step)
            n = mma.acc_count
            for i in range(tms):
                for j in range(tns):
                    mma.store(acc[(i * tns + j) * n:(i * tns + j + 1) * n], Cs,
                              [g.add(wm0, cm * i), g.add(wn0, cn * j)])
            gpu.barrier()

            outs = g.args[n_in:]

            def one(lin):
                r, c = g.div(lin, bn), g.rem(lin, bn)
                gr, gc = arith.addi(m0, r), arith.addi(n0, c)
                conds = [x for x in (g.lt(gr, M) if M % bm else None, g.lt(gc, N) if N % bn else None)
                         if x is not None]

                def store():
                    pw.reset()
                    pw.bind(gm.mm.result, memref.load(Cs, [r, c]))
                    idx = list(batch_idx) + [gr, gc]
                    for res, o in zip(view.results, outs):
                        store_value(pw.eval(res, idx), o, idx)

                g.when(g.all_of(conds), store)

            _passes(g, tid, threads, bm * bn, one)
        g.finish()
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0,
                         {"strategy": "matmul", "cooperative_matrix": f"{cm}x{cn}x{ck}.{elem}",
                          "workgroup_bytes": plan["shared_bytes"], "tile": [bm, bn, bk]})

