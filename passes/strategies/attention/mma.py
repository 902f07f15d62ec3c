"""The attention strategy's CUDA tensor-core kernel: FlashAttention-2's register dataflow
on ``mma.sync.m16n8k16`` (f16 or bf16 operands, f32 accumulators), for CUDA chips where
the Hopper kernel (``hopper/``) does not apply.

Each warp owns 16 query rows; its Q fragments (A operands) are read from global memory
once and stay in registers. Per key block the workgroup stages K and V (input type,
padded rows) between two barriers; S = Q K^T comes out in the accumulator layout
(thread: rows gid and gid + 8, columns 2 tig and 2 tig + 1 of each 8-key tile), where
scale, mask and tails are applied per element like the SIMT kernel; row maxima and sums
are reduced over the 4 threads of a quad with xor shuffles. That layout is also the
A-operand layout of the next product, so P goes from registers straight into P @ V
(rounded to the input type, as FlashAttention does), with V's B fragments read from
workgroup memory. Key blocks a mask masks entirely are skipped (``skipping.py``);
without a mask K and V may be double-buffered by cp.async (``pipelined_key_loop``).
Where the kernel function returns the scores' row logsumexp (``Chain.lse_pos``), the
first thread of each quad writes its two rows' ``m + log(l)``."""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from ..base import EmittedKernel, NotApplicable, TargetInfo
from ..kernel_ir import (
    GpuFunc,
    Pointwise,
    VectorStaging,
    direct_source,
    quad_reduce,
    stage_tile,
    store_value,
    workgroup_memref,
)
from ..kernel_ir import contiguous_last as _contiguous_last
from ..nvidia.mma_sync import MmaSync
from ..run_time_sizes import ragged
from . import run_time
from .chain import Chain, apply_epilogue, apply_p_chain, lse_index, row_lse
from .run_time import lse_position, out_position
from .skipping import skipping_loop
from .softmax import online_softmax


def pipelined_key_loop(g: GpuFunc, Sk: int | ir.Value, bn: int, k_stage: VectorStaging, v_stage: VectorStaging,
                       init: list[ir.Value], key_block) -> list[ir.Value]:
    """The key loop with K and V double-buffered by cp.async: block 0 is in flight before
    the loop; each step waits for its block, passes one barrier (which also frees the
    other buffer, read by the previous step), issues the next block's copies into that
    buffer and computes on its own, so the copies overlap the products."""
    from mlir.dialects import nvvm

    k_stage.copy_async(0, 0, 0)
    v_stage.copy_async(0, 0, 0)
    nvvm.cp_async_commit_group()

    def step(n0, carried):
        j = g.div(n0, bn)
        nvvm.cp_async_wait_group(0)
        gpu.barrier()
        nxt = g.mul(g.rem(g.add(j, 1), 2), bn)
        n1 = g.add(n0, bn)
        k_stage.copy_async(n1, 0, nxt)
        v_stage.copy_async(n1, 0, nxt)
        nvvm.cp_async_commit_group()
        return key_block(n0, carried, g.mul(g.rem(j, 2), bn))

    final = g.loop(0, Sk, bn, init, step)
    nvvm.cp_async_wait_group(0)
    return final


def _q_fragments(g: GpuFunc, pw: Pointwise, tc: MmaSync, ch: Chain, rows: list, tig2, q_lead: list, et: ir.Type,
                 zero_e: ir.Value, guard_rows: bool) -> list:
    """The warp's Q fragments, read once: for k step t, columns 16t + 2tig (+1) and
    16t + 2tig + 8 (+9) of its two rows (rows past seq_q, with guard_rows, read zero_e)."""
    D, Sq = ch.head_dim, ch.seq_q
    q_cols = [16 * t + dc for t in range(D // 16) for dc in (0, 1, 8, 9)]
    q_vals = []
    for r in rows:
        def read_row(r=r):
            pw.reset()
            return [scalar_math.convert(pw.eval(ch.q, q_lead + [r, g.add(tig2, c)]), et) for c in q_cols]

        q_vals.append(g.guarded(g.lt(r, Sq) if guard_rows else None, [et] * len(q_cols),
                                read_row, lambda: [zero_e] * len(q_cols)))
    return [[tc.pack(q_vals[0][4 * t], q_vals[0][4 * t + 1]), tc.pack(q_vals[1][4 * t], q_vals[1][4 * t + 1]),
             tc.pack(q_vals[0][4 * t + 2], q_vals[0][4 * t + 3]),
             tc.pack(q_vals[1][4 * t + 2], q_vals[1][4 * t + 3])] for t in range(D // 16)]


def _scores(g: GpuFunc, tc: MmaSync, Ks, q_frag: list, lt: dict | None, k_row, gid, tig2, D: int, bn: int) -> list:
    """S = Q K^T of one key block, one accumulator tile (4 values) for each 8 keys: K's B
    fragments by ldmatrix.x4 (two 8-key tiles each) where the plan has ldmatrix, else by
    pairs of loads."""
    zero = g.fconst(0.0)
    s = []
    if lt is not None:
        s = [[zero] * 4 for _ in range(bn // 8)]
        for t in range(D // 16):
            for j in range(0, bn // 8, 2):
                r = tc.ldmatrix(g, Ks, g.add(k_row, 8 * j), g.add(lt["b_k"], 16 * t))
                s[j] = tc(q_frag[t], r[0:2], s[j])
                s[j + 1] = tc(q_frag[t], r[2:4], s[j + 1])
    for j in range(bn // 8 if lt is None else 0):
        acc = [zero] * 4
        key = g.add(gid, 8 * j)
        for t in range(D // 16):
            b = [tc.load_pair(Ks, [key, g.add(tig2, 16 * t + h)]) for h in (0, 8)]
            acc = tc(q_frag[t], b, acc)
        s.append(acc)
    return s


def _pv(g: GpuFunc, tc: MmaSync, Vs, pe: list, o: list, lt: dict | None, v_row, gid, tig2, bn: int, n_o: int) -> list:
    """o += P V for one key block (P in the input type, in the A-operand layout): V's B
    fragments by ldmatrix.trans (V is [key, d], two d tiles each) where the plan has
    ldmatrix, else by pairs of loads."""
    for kk in range(bn // 16):
        a = [tc.pack(pe[2 * kk][0], pe[2 * kk][1]), tc.pack(pe[2 * kk][2], pe[2 * kk][3]),
             tc.pack(pe[2 * kk + 1][0], pe[2 * kk + 1][1]), tc.pack(pe[2 * kk + 1][2], pe[2 * kk + 1][3])]
        if lt is not None:
            for n in range(0, n_o, 2):
                r = tc.ldmatrix(g, Vs, g.add(v_row, 16 * kk), g.add(lt["bt_n"], 8 * n), True)
                o[4 * n:4 * n + 4] = tc(a, r[0:2], o[4 * n:4 * n + 4])
                o[4 * n + 4:4 * n + 8] = tc(a, r[2:4], o[4 * n + 4:4 * n + 8])
            continue
        kr = g.add(tig2, 16 * kk)
        for n in range(n_o):
            col = g.add(gid, 8 * n)
            b = [tc.pack(memref.load(Vs, [g.add(kr, dk), col]), memref.load(Vs, [g.add(kr, dk + 1), col]))
                 for dk in (0, 8)]
            o[4 * n:4 * n + 4] = tc(a, b, o[4 * n:4 * n + 4])
    return o


def emit(ch: Chain, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
    """The tensor-core kernel of the attention chain ``ch`` as the plan says (block sizes,
    ldmatrix, cp.async stages, block skipping)."""
    view = ch.view
    bm, bn, threads = plan["block_m"], plan["block_n"], plan["threads"]
    D, Dv = ch.head_dim, ch.head_dim_v
    elem = spec_of(ch.q.type).elem
    et = ir.Type.parse(elem)
    stages = plan.get("stages", 1)
    slots = [tuple(s) for s in plan.get("sizes", [])]
    with kernel.location:
        arg_types, strided = run_time.arg_types(view, target, slots)
        g = GpuFunc(gpu_module, view.name, arg_types,
                    [workgroup_memref([stages * bn, D + 8], et), workgroup_memref([stages * bn, Dv + 8], et)],
                    (threads, 1, 1), dynamic_shared=plan.get("dynamic_shared", False))
        Ks, Vs = g.shared
        # run-time sizes: the sequences' lengths from here on are the run-time ones
        seq = run_time.SeqLengths(g, ch, slots, strided) if slots else None
        flat = seq.flat_inputs if seq is not None else None
        Sq, Sk = ch.seq_q, ch.seq_k
        if ch.lse_pos is not None:
            # The logsumexp's pointer is live from the entry (where parameters load) through
            # the key loop; at head dim 64 and 2048 keys ptxas then held the kernel to 128
            # registers and spilled 4 bytes. A .maxnreg of 255 lets it take the few more.
            g.op.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 255)
        n_in = len(view.args)
        out_mem = g.args[n_in + ch.out_pos]
        pw = Pointwise(g, view, g.args[:n_in])
        if seq is not None:
            pw.flat = flat
        zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
        zero_e = g.fconst(0.0, et)
        tc = MmaSync(elem)
        nb = len(ch.batch)
        with ir.InsertionPoint(g.entry):
            pw.hoist_scalars()
            tid = g.tid()
            qblock = g.bid("x")
            batch_idx = g.delinearize(g.bid("y"), ch.batch) if ch.batch else []
            warp, lane = g.div(tid, 32), g.rem(tid, 32)
            gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
            lt = tc.lane_terms(g, lane) if plan.get("ldmatrix") else None
            pw.reciprocal_of_constants = True
            r0 = arith.addi(g.mul(qblock, bm), arith.addi(g.mul(warp, 16), gid))
            rows = [r0, g.add(r0, 8)]

            def lead(value):
                return pw.operand_index(spec_of(value.type).shape[:-2], batch_idx, nb)

            q_frag = _q_fragments(g, pw, tc, ch, rows, tig2, lead(ch.q), et, zero_e, ragged(Sq, bm))
            k_lead, v_lead = lead(ch.kt), lead(ch.v)
            k_direct = direct_source(view, g.args[:n_in], ch.kt, k_lead, True, flat)
            v_direct = direct_source(view, g.args[:n_in], ch.v, v_lead, False, flat)
            s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
            n_o = Dv // 8

            vb = plan.get("vector_bytes", 0)
            k_stage = VectorStaging(g, tid, threads, Ks, bn, D, Sk, D, False, k_direct, vb)
            v_stage = VectorStaging(g, tid, threads, Vs, bn, Dv, Sk, Dv, False, v_direct, vb)

            log2e = g.fconst(math.log2(math.e))

            def exp(x):
                # e^x as 2^(x log2 e): ex2.approx, one instruction (2 ulp), where
                # libdevice's expf takes about ten; -inf still gives 0.
                return mmath.exp2(arith.mulf(x, log2e))

            def key_block(n0, carried, kv_row0=None):
                """One key block; ``kv_row0``: the block is already staged (the
                pipeline), at that row of the stacked K and V tiles."""
                m, l, o = carried[0:2], carried[2:4], carried[4:]
                if kv_row0 is None:
                    gpu.barrier()  # the previous block's fragment reads are done
                    stage_tile(g, pw, tid, threads, Ks, bn, D, ch.k_d_contiguous, n0, Sk, 0, D,
                               lambda r, c: pw.eval(ch.kt, k_lead + [c, r]), direct=k_direct, vector_bytes=vb,
                               run_time_vectors=True)
                    stage_tile(g, pw, tid, threads, Vs, bn, Dv, _contiguous_last(view, ch.v), n0, Sk, 0, Dv,
                               lambda r, c: pw.eval(ch.v, v_lead + [r, c]), direct=v_direct, vector_bytes=vb,
                               run_time_vectors=True)
                    gpu.barrier()
                k_row = v_row = None
                if lt is not None:
                    k_row = lt["b_n"] if kv_row0 is None else arith.addi(lt["b_n"], kv_row0)
                    v_row = lt["bt_k"] if kv_row0 is None else arith.addi(lt["bt_k"], kv_row0)
                s = _scores(g, tc, Ks, q_frag, lt, k_row, gid, tig2, D, bn)
                m_new, l_new, alpha, p = online_softmax(g, pw, ch, s, m, l, rows, tig2, n0, bm, bn, s_lead, exp)
                o = [arith.mulf(o[4 * n + k], alpha[k // 2]) for n in range(n_o) for k in range(4)]
                # P for the product: the P chain on the unnormalized p (bf16's cast of the
                # probabilities: the rounding to et, which the mma needs anyway), in et
                if ch.p_value != ch.sm.result:
                    p = [[apply_p_chain(pw, ch, p[j][k], s_lead + [rows[k // 2], arith.addi(n0, g.add(
                        tig2, 8 * j + k % 2))]) for k in range(4)] for j in range(bn // 8)]
                pe = [[scalar_math.convert(v, et) for v in pj] for pj in p]
                o = _pv(g, tc, Vs, pe, o, lt, v_row, gid, tig2, bn, n_o)
                return m_new + l_new + o

            init = [neg_inf, neg_inf, zero, zero] + [zero] * (4 * n_o)
            if ch.mask_cond is not None and plan.get("skip_masked_blocks", False):
                final = skipping_loop(g, pw, ch, key_block, init, rows, tig2, bm, bn, s_lead)
            elif stages > 1:
                if not (k_stage.copies_async and v_stage.copies_async and lt is not None):
                    raise NotApplicable("the plan's cp.async K/V pipeline needs both tiles staged as 16-byte "
                                        "copies and ldmatrix fragments")
                final = pipelined_key_loop(g, Sk, bn, k_stage, v_stage, init, key_block)
            else:
                final = g.loop(0, Sk, bn, init, key_block)
            totals = [quad_reduce(final[2 + h], arith.addf) for h in range(2)]
            o = final[4:4 + 4 * n_o]
            # run-time sizes: the queries' length and the flat results' strides, computed here
            ep = seq.epilogue() if seq is not None else None
            if ep is not None:
                Sq = ep.seq_q
            for h in range(2):
                def store(h=h):
                    for n in range(n_o):
                        for k in (2 * h, 2 * h + 1):
                            col = g.add(tig2, 8 * n + k % 2)
                            idx = list(batch_idx) + [rows[h], col]
                            store_value(apply_epilogue(pw, ch, arith.divf(o[4 * n + k], totals[h]), idx),
                                        out_mem, idx if ep is None else ep.at(out_position(ch), idx))
                    if ch.lse_pos is not None:  # the row's logsumexp, by the quad's first thread
                        at = lse_index(ch, batch_idx, rows[h], g.c(0))
                        g.when(arith.cmpi(arith.CmpIPredicate.eq, tig2, g.c(0)), lambda: store_value(
                            row_lse(final[h], totals[h]), g.args[n_in + ch.lse_pos],
                            at if ep is None else ep.at(lse_position(ch), at)))

                g.when(g.lt(rows[h], Sq) if ragged(Sq, bm) else None, store)
        g.finish()
    run_time_grid = {} if seq is None else {"sizes": tuple(slots), "grid_sizes": seq.grid(bm, plan["grid"][1])}
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                         {"strategy": "attention", "tensor_cores": "mma.sync.m16n8k16",
                          "workgroup_bytes": plan["shared_bytes"], "block_m": bm, "block_n": bn,
                          "stages": stages}, **run_time_grid)
