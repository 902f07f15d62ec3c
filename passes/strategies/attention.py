"""The ``attention`` strategy: ``softmax(f(q @ k^T)) @ v`` as one flash-attention kernel,
so the score matrix never reaches global memory.

The kernel function kf-fuse makes from the seed's ``fused_attention`` is
``matmul(q, transpose(k))`` -> scale (``div``/``mul`` by a rank-0 fill) -> optional
``masked_fill(scores, cmp(mask, 0, "eq"), -1e9)`` -> ``softmax(dim=-1)`` ->
``matmul(attn, v)``. What is recognized is more general and no harder to emit: any
chain of elementwise ops between the two matmuls (``f`` above: a scale, a mask of any
shape that broadcasts to the scores, an additive bias, a select) is evaluated per score
in registers by ``Pointwise``, and q, k, v may themselves be elementwise functions or
transposes of the arguments (``k`` is read through its ``kf.transpose`` without a copy).

The kernel (SIMT; correct on Vulkan and CUDA):

- one workgroup per (flattened batch element, block of BLOCK_M query rows); each query
  row is owned by TPR = threads / BLOCK_M consecutive threads ("lanes");
- the Q tile is staged once in workgroup memory; the key loop walks blocks of BLOCK_N
  keys, staging the K tile, then the V tile, in one shared buffer (rows padded by one
  word so the strided reads do not conflict on banks);
- a lane computes the scores of keys ``l, l + TPR, ...`` of its row (full dot products
  over the head dim, in f32), applies ``f``, and the row's block maximum is exchanged
  through a small workgroup array; online softmax: the running max m and the lane's
  partial row sum are rescaled by ``exp(m_old - m_new)`` with the accumulator;
- P (BLOCK_M x BLOCK_N, f32) goes through workgroup memory for P @ V, where a lane owns
  output columns ``l, l + TPR, ...`` (consecutive lanes, consecutive columns: coalesced
  stores at the end);
- at the end the lanes' partial sums are added through workgroup memory and the
  accumulator divided once.

Tails: keys past seq_k score -inf (their p is exactly 0, and the V rows loaded for them
are zeros), query rows past seq_q compute on zeros and are not stored. Statistics,
scores and the accumulator are f32 for every input type.

Barriers per key block: five (before K is overwritten, after K, after the row maxima,
before V overwrites K, after V). A CUDA tensor-core variant is future work (see the
report in the commit history); the plan is shared by both targets.
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from kf.dialects import spec_of
from kf.dialects.types import broadcast_shapes
from kf.dialects.attrs import op_attrs
from kf.passes import scalar_math

from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .matmul import (GpuFunc, KernelView, Pointwise, _contiguous_last, defining, gpu_arg_types,
                     pointwise_closure, stage_tile, store_value, workgroup_memref)


class _Chain:
    """The recognized parts of an attention kernel function."""

    def __init__(self, kernel: ir.Operation):
        view = KernelView(kernel)
        self.view = view
        if len(view.results) != 1:
            raise NotApplicable(f"@{view.name} returns {len(view.results)} values; attention returns one")
        mm2 = defining(view.results[0])
        if mm2 is None or mm2.name != "kf.matmul":
            raise NotApplicable("the result is not matmul(softmax(...), v)")
        sm = defining(mm2.operands[0])
        if sm is None or sm.name != "kf.softmax":
            raise NotApplicable("the first operand of the last matmul is not a softmax")
        s_spec = spec_of(sm.result.type)
        if op_attrs(sm)["dim"] % s_spec.rank != s_spec.rank - 1:
            raise NotApplicable("softmax is not over the last dimension")
        if any(u.owner != mm2 for u in sm.result.uses):
            raise NotApplicable("the softmax is used outside the last matmul")
        # The one matmul below the softmax through elementwise ops is q @ k^T.
        mm1s, stack, seen = [], [sm.operands[0]], set()
        while stack:
            v = stack.pop()
            if v in seen or view.arg_index(v) is not None:
                continue
            seen.add(v)
            op = defining(v)
            if op.name == "kf.matmul":
                mm1s.append(op)
                continue
            stack.extend(op.operands)
        if len(mm1s) != 1:
            raise NotApplicable(f"{len(mm1s)} matmuls feed the softmax; attention needs exactly q @ k^T")
        mm1 = mm1s[0]
        pointwise_closure(view, [sm.operands[0]], [mm1.result])
        scores = spec_of(mm1.result.type)
        for v in seen:
            if broadcast_shapes(spec_of(v.type).shape, scores.shape) != scores.shape:
                raise NotApplicable(f"{v.type} between the matmuls does not broadcast to the scores")
        q, kt = mm1.operands
        vv = mm2.operands[1]
        pointwise_closure(view, [q, kt, vv], [])
        self.mm1, self.sm, self.mm2 = mm1, sm, mm2
        self.q, self.kt, self.v = q, kt, vv
        self.scores = scores
        self.out = view.result_specs[0]
        qs, ks, vs = spec_of(q.type), spec_of(kt.type), spec_of(vv.type)
        self.seq_q, self.head_dim = qs.shape[-2], qs.shape[-1]
        self.seq_k = ks.shape[-1]
        self.head_dim_v = vs.shape[-1]
        self.batch = self.out.shape[:-2]
        self.k_d_contiguous = not _contiguous_last(view, kt)  # k^T read through a transpose of k


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _shared_bytes(bm: int, bn: int, d: int, dv: int, tpr: int) -> int:
    return 4 * (bm * (d + 1) + bn * (max(d, dv) + 1) + bm * (bn + 1) + bm * tpr)


class AttentionStrategy(Strategy):
    KIND = "attention"

    #: per-thread f32 registers of scores plus accumulators that the plan allows: above
    #: this ptxas starts to spill at 128 threads (checked at head_dim 128).
    MAX_REGISTER_TILE = 64

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """Block sizes: the largest BLOCK_M x BLOCK_N tile (then the larger BLOCK_M, which
        loads K and V fewer times) whose Q, K/V, P and row-exchange buffers fit the
        shared-memory budget, with 128 threads (TPR = 128 / BLOCK_M lanes per row)
        dividing the head dims and BLOCK_N, and at most MAX_REGISTER_TILE scores plus
        accumulators per thread. Blocks larger than the sequences are not considered."""
        ch = _Chain(kernel)
        d, dv = ch.head_dim, ch.head_dim_v
        threads = min(128, target.max_threads)
        best = None
        for bm in (64, 32, 16, 8, 4):
            if bm > max(4, _pow2_ceil(ch.seq_q)) or threads % bm:
                continue
            tpr = threads // bm
            if tpr > 32 or d % tpr or dv % tpr:
                continue
            for bn in (64, 32, 16, 8, 4):
                if bn % tpr or bn > max(4, _pow2_ceil(ch.seq_k)):
                    continue
                if bn // tpr + dv // tpr > self.MAX_REGISTER_TILE:
                    continue
                shared = _shared_bytes(bm, bn, d, dv, tpr)
                if shared > target.max_shared_bytes:
                    continue
                key = (bm * bn, bm)
                if best is None or key > best[0]:
                    best = (key, bm, bn, tpr, shared)
        if best is None:
            raise NotApplicable(f"no attention tiling of head dims {d}/{dv} fits {target.max_shared_bytes} bytes "
                                f"of shared memory with {threads} threads")
        _, bm, bn, tpr, shared = best
        batch = math.prod(ch.batch)
        grid = [-(-ch.seq_q // bm), batch, 1]
        if batch > 65535:
            raise NotApplicable(f"{batch} batch elements exceed the grid's y limit")
        return {"block_m": bm, "block_n": bn, "threads": threads, "lanes_per_row": tpr, "grid": grid,
                "shared_bytes": shared, "seq_q": ch.seq_q, "seq_k": ch.seq_k, "head_dim": d, "head_dim_v": dv,
                "batch": list(ch.batch), "unroll": 4 if d % 4 == 0 and bn % 4 == 0 else 1}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        ch = _Chain(kernel)
        view = ch.view
        bm, bn, threads, tpr = plan["block_m"], plan["block_n"], plan["threads"], plan["lanes_per_row"]
        unroll = plan["unroll"]
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
        if (D, Dv, Sq, Sk) != (plan["head_dim"], plan["head_dim_v"], plan["seq_q"], plan["seq_k"]):
            raise NotApplicable("the plan was made for another kernel")
        dkv = max(D, Dv)
        n_s, n_acc = bn // tpr, Dv // tpr
        shared_types = [workgroup_memref([bm, D + 1]), workgroup_memref([bn, dkv + 1]),
                        workgroup_memref([bm, bn + 1]), workgroup_memref([bm, tpr])]
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target), shared_types, (threads, 1, 1))
            Qs, KVs, Ps, Red = g.shared
            n_in = len(view.args)
            out_mem = g.args[n_in]
            pw = Pointwise(g, view, g.args[:n_in])
            f32 = g.f32
            zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
            nb = len(ch.batch)
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                qblock = g.bid("x")
                batch_idx = g.delinearize(g.bid("y"), ch.batch) if ch.batch else []
                row, lane = g.div(tid, tpr), g.rem(tid, tpr)
                i0 = g.mul(qblock, bm)
                gi = g.add(i0, row)

                def lead(value):
                    return pw.operand_index(spec_of(value.type).shape[:-2], batch_idx, nb)

                def stage(tile, rows, cols, fast_is_col, row0, n_rows, read):
                    stage_tile(g, pw, tid, threads, tile, rows, cols, fast_is_col, row0, n_rows, 0, cols, read)

                q_lead, k_lead, v_lead = lead(ch.q), lead(ch.kt), lead(ch.v)
                s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
                stage(Qs, bm, D, _contiguous_last(view, ch.q), i0, Sq,
                      lambda r, c: pw.eval(ch.q, q_lead + [r, c]))

                lane_cols = [g.add(lane, tpr * c) for c in range(n_s)]  # keys of this lane in a block
                out_cols = [g.add(lane, tpr * c) for c in range(n_acc)]  # output columns of this lane
                score_in = ch.sm.operands[0]

                def key_block(n0, carried):
                    m_old, l_old, acc = carried[0], carried[1], carried[2:]
                    gpu.barrier()  # the previous block's readers of KVs and Ps are done
                    stage(KVs, bn, D, ch.k_d_contiguous, n0, Sk, lambda r, c: pw.eval(ch.kt, k_lead + [c, r]))
                    gpu.barrier()

                    def dot(d0, s):
                        s = list(s)
                        for u in range(unroll):
                            d = g.add(d0, u)
                            qd = memref.load(Qs, [row, d])
                            for c in range(n_s):
                                s[c] = mmath.fma(qd, memref.load(KVs, [lane_cols[c], d]), s[c])
                        return s

                    dots = g.loop(0, D, unroll, [zero] * n_s, dot)
                    xs = []
                    for c in range(n_s):
                        gj = arith.addi(n0, lane_cols[c])

                        def score(c=c, gj=gj):
                            def real():
                                pw.reset()
                                pw.bind(ch.mm1.result, dots[c])
                                return [scalar_math.convert(pw.eval(score_in, s_lead + [gi, gj]), f32)]

                            # rows past seq_q score 0: finite, so their (unstored) softmax stays NaN-free
                            return g.guarded(g.lt(gi, Sq) if Sq % bm else None, [f32], real, lambda: [zero])

                        xs.append(g.guarded(g.lt(gj, Sk) if Sk % bn else None, [f32], score,
                                            lambda: [neg_inf])[0])
                    m_loc = xs[0]
                    for x in xs[1:]:
                        m_loc = arith.maximumf(m_loc, x)
                    memref.store(m_loc, Red, [row, lane])
                    gpu.barrier()
                    m_blk = memref.load(Red, [row, g.c(0)])
                    for t in range(1, tpr):
                        m_blk = arith.maximumf(m_blk, memref.load(Red, [row, g.c(t)]))
                    m_new = arith.maximumf(m_old, m_blk)
                    alpha = mmath.exp(arith.subf(m_old, m_new))
                    l_new = arith.mulf(l_old, alpha)
                    for c in range(n_s):
                        p = mmath.exp(arith.subf(xs[c], m_new))
                        memref.store(p, Ps, [row, lane_cols[c]])
                        l_new = arith.addf(l_new, p)
                    acc = [arith.mulf(a, alpha) for a in acc]
                    gpu.barrier()  # K reads and P writes are done
                    stage(KVs, bn, Dv, _contiguous_last(view, ch.v), n0, Sk,
                          lambda r, c: pw.eval(ch.v, v_lead + [r, c]))
                    gpu.barrier()

                    def pv(j0, acc):
                        acc = list(acc)
                        for u in range(unroll):
                            j = g.add(j0, u)
                            p = memref.load(Ps, [row, j])
                            for c in range(n_acc):
                                acc[c] = mmath.fma(p, memref.load(KVs, [j, out_cols[c]]), acc[c])
                        return acc

                    acc = g.loop(0, bn, unroll, acc, pv)
                    return [m_new, l_new] + acc

                final = g.loop(0, Sk, bn, [neg_inf, zero] + [zero] * n_acc, key_block)
                l_part, acc = final[1], final[2:]
                # Red's last readers (the row maxima) finished before the V barrier.
                memref.store(l_part, Red, [row, lane])
                gpu.barrier()
                total = memref.load(Red, [row, g.c(0)])
                for t in range(1, tpr):
                    total = arith.addf(total, memref.load(Red, [row, g.c(t)]))
                out_lead = list(batch_idx)

                def store():
                    for c in range(n_acc):
                        store_value(arith.divf(acc[c], total), out_mem, out_lead + [gi, out_cols[c]])

                g.when(g.lt(gi, Sq) if Sq % bm else None, store)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0,
                             {"strategy": "attention", "workgroup_bytes": plan["shared_bytes"],
                              "block_m": bm, "block_n": bn, "lanes_per_row": tpr})


register(AttentionStrategy())
