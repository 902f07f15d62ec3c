"""The matmul strategy's GEMM on Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a).

The workgroup is two warpgroups (256 threads) over a BLOCK_M = 128 row tile, each
warpgroup one m64nNk16 (k32 for fp8) accumulator of N = BLOCK_N columns in f32
registers (N/2 a thread: 128 at N = 256). A and B tiles of BLOCK_K = 128 bytes of K are
a cp.async pipeline of swizzled stages (``nvidia.wgmma.SwizzledTile``); ``wgmma.wait_group
1`` at the end of a step waits for the *previous* step's group only, so the tensor cores
are busy while the next step waits for its tiles, hence ``ahead = stages - 2`` blocks in
flight on the copy side. The epilogue is the matmul strategy's (``Pointwise`` over the
kernel's ops after the matmul, one rounding when stored).

Operand layouts: A must be k-contiguous in memory ("K-major"); B either k-contiguous
(``a @ b.t()``, nn.Linear weights) or n-contiguous (``a @ b``) -- wgmma transposes B
itself for 16-bit types (``imm-trans-b``); fp8 takes K-major B only. Anything else, and
targets that are not sm_90a, keep the mma.sync kernel.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith, gpu, llvm, nvvm

from ..base import EmittedKernel, NotApplicable, TargetInfo
from ..kernel_ir import GpuFunc, KernelView, Pointwise, direct_source, store_value
from ..nvidia.mma_sync import FP8_PTX
from .gemm import Gemm, RunTimeRows, gpu_arg_types_with_sizes, grouped_tiles, row_tiles, tail_guard
from ..nvidia.wgmma import (ATOM_BYTES, SWIZZLE_BYTES, WGMMA_TYPES, SwizzledTile, available, carve_aligned,
                            i64_const, wgmma_attrs)

def plan(gm: Gemm, target: TargetInfo, variant) -> dict | None:
    """The wgmma plan for a GEMM, or None where the mma.sync kernel stays: the target is
    not sm_90a, an operand is not an argument read as it lies, an operand is MN-major in
    fp8, or rows are not whole 16-byte pieces (cp.async copies 16 bytes). A MN-major A
    (``x^T @ dy``, a weight's gradient: x [tokens, in] read as it lies) is staged as B's
    MN-major tile is and read with imm-trans-a."""
    if not available(target):
        return None
    elem = spec_of(gm.mm.operands[0].type).elem
    if elem not in WGMMA_TYPES or spec_of(gm.mm.operands[1].type).elem != elem:
        return None
    esize = 1 if elem in FP8_PTX else 2
    b_mn_major = gm.b_n_contiguous
    a_mn_major = not gm.a_k_contiguous
    if not (gm.a_direct and gm.b_direct) or ((b_mn_major or a_mn_major) and esize == 1):
        return None
    if (gm.k * esize) % 16 or (b_mn_major and (gm.n * esize) % 16) or (a_mn_major and (gm.m * esize) % 16):
        return None
    batch = math.prod(gm.batch)
    bm, bn = 128, variant.max_block_n
    while bn > 64 and -(-gm.m // bm) * -(-gm.n // bn) * batch < 128:
        bn //= 2
    if a_mn_major and -(-gm.m // bm) * -(-gm.n // 128) * batch < 128:
        # a weight's gradient of a narrow layer (GPT-2's 768: 108 tiles of 128 x 128 over
        # 8192 tokens) kept mma.sync: with wgmma's narrower tiles the GPT-2 step took 40.7
        # ms against 33.6 on an H100 (bench/RESULTS.md)
        return None
    bk = SWIZZLE_BYTES // esize
    stage_bytes = (bm + bn) * SWIZZLE_BYTES
    stages, inflight = variant.stages, variant.inflight
    while stages > 2 + inflight and stages * stage_bytes + ATOM_BYTES > target.max_dynamic_shared_bytes:
        stages -= 1
    if stages < 2 + inflight or stages * stage_bytes + ATOM_BYTES > target.max_dynamic_shared_bytes:
        return None
    grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
    if grid[2] > 65535 or grid[1] > 65535:
        return None
    return {"block_m": bm, "block_n": bn, "block_k": bk, "threads": 256, "grid": grid, "m": gm.m, "n": gm.n,
            "k": gm.k, "batch": list(gm.batch), "mma": True, "wgmma": True, "stages": stages,
            "inflight": inflight, "shared_bytes": stages * stage_bytes + ATOM_BYTES,
            "dynamic_shared": True, "group_m": variant.group_m, "b_k_major": not b_mn_major,
            "a_k_major": not a_mn_major}


def emit(view: KernelView, gm: Gemm, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
         target: TargetInfo) -> EmittedKernel:
    """The wgmma GEMM kernel of a ``plan()`` plan (see the module docstring)."""
    bm, bn, bk, threads = plan["block_m"], plan["block_n"], plan["block_k"], plan["threads"]
    stages, inflight = plan["stages"], plan["inflight"]
    N = gm.n
    run_time = RunTimeRows.of(view, plan)
    elem = spec_of(gm.mm.operands[0].type).elem
    esize = 1 if elem in FP8_PTX else 2
    k_inst = 32 // esize  # k of one wgmma: 16 (16-bit types), 32 (fp8)
    b_mn_major = not plan["b_k_major"]
    a_mn_major = not plan.get("a_k_major", True)
    etype = ir.Type.parse(elem)
    acc_n = bn // 2  # f32 accumulators a thread: 64 x bn over 128 threads
    f32 = ir.F32Type.get()
    acc_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * acc_n) + ")>")
    ahead = stages - 1 - inflight
    with kernel.location:
        # (the shared window: carve_aligned)
        g = GpuFunc(gpu_module, view.name, gpu_arg_types_with_sizes(view, target, plan), [], (threads, 1, 1))
        n_in = len(view.args)
        pw = Pointwise(g, view, g.args[:n_in])
        a_val, b_val = gm.mm.operands
        with ir.InsertionPoint(g.entry):
            per_row = SWIZZLE_BYTES // esize
            b_rows = bn if not b_mn_major else bk * (bn * esize // SWIZZLE_BYTES)
            a_rows = bm if not a_mn_major else bk * (bm * esize // SWIZZLE_BYTES)
            As, Bs = carve_aligned(g, [(stages * a_rows, per_row, etype), (stages * b_rows, per_row, etype)])
            M = run_time.rows(g, gm) if run_time else gm.m
            K = run_time.depth(g, kernel, gm) if run_time else gm.k
            tid = g.tid()
            col_tile, row_tile = grouped_tiles(g, plan["grid"][0], row_tiles(g, M, plan), plan.get("group_m", 0))
            batch_idx = g.delinearize(g.bid("z"), gm.batch) if gm.batch else []
            m0, n0 = g.mul(row_tile, bm), g.mul(col_tile, bn)
            a_lead = pw.operand_index(spec_of(a_val.type).shape[:-2], batch_idx, len(gm.batch))
            b_lead = pw.operand_index(spec_of(b_val.type).shape[:-2], batch_idx, len(gm.batch))
            a_direct = direct_source(view, g.args[:n_in], a_val, a_lead, a_mn_major)
            b_direct = direct_source(view, g.args[:n_in], b_val, b_lead, not b_mn_major)
            if a_direct is None or b_direct is None:
                raise NotApplicable("the wgmma plan reads both operands straight from arguments")
            a_tile = SwizzledTile(g, tid, threads, As, a_direct, bm, bk, esize, M, K, a_mn_major)
            b_tile = SwizzledTile(g, tid, threads, Bs, b_direct, bn, bk, esize, N, K, b_mn_major)
            warp, lane = g.div(tid, 32), g.rem(tid, 32)
            wg = g.div(warp, 4)
            i64 = ir.IntegerType.get_signless(64)
            # this warpgroup's 64 rows of A: K-major, 64 rows of 128 bytes from the stage's
            # start; MN-major, its atom column of 64 m-elements (bk k-rows of 128 bytes)
            wg_rows = bk * (64 * esize // SWIZZLE_BYTES) if a_mn_major else 64
            a_desc0 = arith.addi(a_tile.descriptor_base(),
                                 arith.index_cast(i64, g.mul(wg, wg_rows * SWIZZLE_BYTES // 16)))
            b_desc0 = b_tile.descriptor_base()
            wg_attrs = wgmma_attrs(elem, bn, k_inst, b_mn_major, a_mn_major)

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
                    da = arith.addi(a_d, i64_const(a_tile.slice_offset(t, k_inst) // 16))
                    db = arith.addi(b_d, i64_const(b_tile.slice_offset(t, k_inst) // 16))
                    acc = nvvm.WgmmaMmaAsyncOp(acc_t, acc, da, db, *wg_attrs).result
                nvvm.wgmma_commit_group_sync_aligned()
                nvvm.wgmma_wait_group_sync_aligned(inflight)
                return [acc]

            zero = llvm.mlir_zero(acc_t)
            (acc,) = g.loop(0, K, bk, [zero], k_step)
            nvvm.wgmma_wait_group_sync_aligned(0)
            nvvm.cp_async_wait_group(0)  # nothing may still be landing in shared memory at exit

            outs = g.args[n_in:n_in + len(view.results)]
            gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
            row_base = arith.addi(m0, arith.addi(g.mul(wg, 64), arith.addi(g.mul(g.rem(warp, 4), 16), gid)))
            col_base = arith.addi(n0, tig2)
            for i in range(bn // 8):
                for h in range(2):
                    gr = g.add(row_base, 8 * h)
                    for e in range(2):
                        gc = g.add(col_base, 8 * i + e)
                        conds = [c for c in (tail_guard(g, gr, M, bm), tail_guard(g, gc, N, bn)) if c is not None]

                        def store(k=4 * i + 2 * h + e, gr=gr, gc=gc):
                            pw.reset()
                            pw.bind(gm.mm.result, llvm.extractvalue(f32, acc, [k]))
                            idx = list(batch_idx) + [gr, gc]
                            for r, o in zip(view.results, outs):
                                store_value(pw.eval(r, idx), o, idx)

                        g.when(g.all_of(conds), store)
        g.finish()
    inst = f"wgmma.m64n{bn}k{k_inst}.{WGMMA_TYPES[elem]}"
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                         {"strategy": "matmul", "tensor_cores": inst, "workgroup_bytes": plan["shared_bytes"],
                          "tile": [bm, bn, bk], "stages": stages}, **RunTimeRows.launch(run_time, plan))
