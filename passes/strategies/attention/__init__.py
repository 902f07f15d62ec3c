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

Around the two products the chain may hold what the precision policy writes
(passes/apply_precision.py): casts and rank-0 scales between ``q @ k^T`` and the softmax
(evaluated per score with the rest of ``f``), a *P chain* from the softmax to the second
product's A operand (``_Chain.p_value``: casts, and muls/divs by rank-0 fills or
arguments -- bf16's ``cast(P)``, fp8's ``cast(cast(P -> f32) * 256 -> f8E4M3FN)``), V
through a last-two-dims transpose (fp8's K-major V), and an *epilogue* after it
(``_Chain.epilogue_value``: rank-0 scales and casts, fp8's ``* (1 / (256 s_v))``). The
P chain is homogeneous of degree 1 in P up to its roundings, so every kernel applies it
to the unnormalized probabilities ``p = exp(s - m)`` (FlashAttention-3's order for fp8:
the rounding happens before the division by the row sum): the accumulator takes
``p' v`` with ``p' = P chain(p)`` as an f32 value (an E4M3FN value, say), the row sum
``l`` adds the unrounded ``p``, and the output is ``epilogue(acc / l)``.

Three kernels. On sm_90a the Hopper kernel (``hopper/``: wgmma, a producer warpgroup,
the block table of a mask) where it applies, for f16/bf16 and fp8 q, k, v. Elsewhere on
CUDA, with f16/bf16 q, k, v and head dims that are multiples of 16, the tensor-core
kernel (``mma.py``: mma.sync m16n8k16, FlashAttention-2's register dataflow; key
blocks a mask masks entirely skipped, ``skipping.py``, else K and V double-buffered by
cp.async). fp8 q, k, v where the Hopper kernel does not apply take the SIMT kernel, which
widens the E4M3FN bytes as it loads them. On SPIR-V with f16 q, k, v, where the device
lists an f16 cooperative-matrix shape (VK_KHR_cooperative_matrix) and the sizes are
static, the SIMT kernel below takes both products of each key block from the
workgroup's subgroups (``coopmat.py``). Everywhere else, Vulkan and f32 included, the
SIMT kernel:

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
  accumulator divided once; where the kernel function returns the scores' row
  logsumexp too (``Chain.lse_pos``: what kf's autograd saves), a row's first lane
  writes ``m + log(l)`` from the running max and the total.

Tails: keys past seq_k score -inf (their p is exactly 0, and the V rows loaded for them
are zeros), query rows past seq_q compute on zeros and are not stored. Statistics,
scores and the accumulator are f32 for every input type.

Run-time sequence lengths (strategies/run_time_sizes.py): all three kernels take them,
one program for every length up to the bound; every tail is then guarded, and buffers
whose sequence follows the heads are flat, addressed with run-time strides
(``run_time.py`` for the tensor-core kernels). Their plans are made on the bound and
take only what holds for every length (``hopper.plan``'s ``bounded``).

Barriers per key block: five (before K is overwritten, after K, after the row maxima,
before V overwrites K, after V); two in the tensor-core kernel. Tiles read straight
from arguments are staged with 128-bit loads on CUDA. The plan (``plan``) says which
kernel, and its block sizes, as JSON-able values.

What the shared parts are: ``chain.py`` (the recognized chain, its P chain and
epilogue), ``run_time.py`` (run-time lengths), ``softmax.py`` (the online softmax in
the mma layout), ``skipping.py`` (the block-skipping key loops). Measurements:
bench/RESULTS.md.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from .. import run_time_sizes
from ..base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from ..kernel_ir import (
    GpuFunc,
    Pointwise,
    direct_source,
    gpu_arg_types,
    linearize,
    stage_tile,
    staging_vector_bytes,
    store_value,
    workgroup_memref,
)
from ..kernel_ir import contiguous_last as _contiguous_last
from . import coopmat, hopper, mma, run_time
from .chain import Chain as _Chain
from .chain import apply_epilogue, apply_p_chain, lse_index, row_lse
from .chain import transposed_source as _transposed_source
from .hopper import AttentionVariant


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _shared_bytes(bm: int, bn: int, d: int, dv: int, tpr: int) -> int:
    return 4 * (bm * (d + 1) + bn * (max(d, dv) + 1) + bm * (bn + 1) + bm * tpr)


class AttentionStrategy(Strategy):
    KIND = "attention"
    VARIANT = AttentionVariant

    #: per-thread f32 registers of scores plus accumulators that the plan allows: above
    #: this ptxas starts to spill at 128 threads (checked at head_dim 128).
    MAX_REGISTER_TILE = 64

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: AttentionVariant | None = None) -> dict:
        """Block sizes: the largest BLOCK_M x BLOCK_N tile (then the larger BLOCK_M) whose
        Q, K/V, P and row-exchange buffers fit the shared-memory budget, with 128 threads,
        or the most of 64, 32 and 16 that have such a tile (TPR = threads / BLOCK_M lanes
        per row, dividing BLOCK_N), and at most MAX_REGISTER_TILE scores plus
        accumulators per thread. A lane owns ceil(Dv / TPR) output columns (the last
        partly past Dv where TPR does not divide it: those are computed on a clamped
        column and not stored), so every head dim has a plan; fewer threads let a short
        query block (BLOCK_M = 4) take key blocks small enough for a large head dim's
        budget, or for a few keys. Blocks larger than the sequences are not considered."""
        ch = _Chain(kernel)
        d, dv = ch.head_dim, ch.head_dim_v
        mma = self._mma_plan(ch, target, variant or AttentionVariant(), run_time_sizes.is_bounded(kernel))
        if mma is not None:
            return mma
        coop = coopmat.plan(ch, target, variant or AttentionVariant())
        if coop is not None:
            return coop
        best = None
        for threads in (128, 64, 32, 16):
            if best is not None:
                break
            if threads > target.max_threads:
                continue
            for bm in (64, 32, 16, 8, 4):
                if bm > max(4, _pow2_ceil(ch.seq_q)) or threads % bm:
                    continue
                tpr = threads // bm
                if tpr > 32:
                    continue
                n_acc = -(-dv // tpr)
                for bn in (64, 32, 16, 8, 4):
                    if bn % tpr or bn > max(4, _pow2_ceil(ch.seq_k)):
                        continue
                    if bn // tpr + n_acc > self.MAX_REGISTER_TILE:
                        continue
                    shared = _shared_bytes(bm, bn, d, dv, tpr)
                    if shared > target.max_shared_bytes:
                        continue
                    key = (bm * bn, bm)
                    if best is None or key > best[0]:
                        best = (key, bm, bn, tpr, shared, threads)
        if best is None:
            raise NotApplicable(f"no attention tiling of head dims {d}/{dv} fits {target.max_shared_bytes} bytes "
                                f"of shared memory")
        _, bm, bn, tpr, shared, threads = best
        batch = math.prod(ch.batch)
        grid = [-(-ch.seq_q // bm), batch, 1]
        if batch > 65535:
            raise NotApplicable(f"{batch} batch elements exceed the grid's y limit")
        return {"block_m": bm, "block_n": bn, "threads": threads, "lanes_per_row": tpr, "grid": grid,
                "shared_bytes": shared, "seq_q": ch.seq_q, "seq_k": ch.seq_k, "head_dim": d, "head_dim_v": dv,
                "batch": list(ch.batch), "unroll": 4 if d % 4 == 0 and bn % 4 == 0 else 1, "mma": False,
                "vector_bytes": staging_vector_bytes(target)}

    #: Warps per workgroup of the tensor-core kernel; each owns 16 query rows.
    MMA_WARPS = 4
    #: At run-time key lengths, at most this many (static) query rows take the SIMT kernel.
    DECODE_ROWS = 16

    def _mma_plan(self, ch: _Chain, target: TargetInfo, variant: AttentionVariant, bounded: bool) -> dict | None:
        """The tensor-core plan (CUDA, f16/bf16 q/k/v, head dims multiples of 16 and 8),
        or None for the SIMT kernel. BLOCK_N is 64 keys up to head_dim 64 and 32 above
        (the S fragments then cost 16 registers instead of 32, next to 64 accumulators at
        head_dim 128); K and V tiles are kept in the input type, rows padded by 8
        elements so the fragment reads of a warp hit 32 distinct banks. Key blocks that a
        mask masks entirely are skipped (``skipping.skipping_loop``); without a mask, K and
        V are double-buffered by cp.async (the next block's copies in flight during this
        block's products) where both are arguments read as they lie with rows of whole
        16-byte pieces. ``bounded``: the kernel has run-time sequence lengths (the plan is
        for every length up to its bound)."""
        elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
        if target.name == "cuda" and len(elems) == 1 and next(iter(elems)).startswith("f8"):
            return hopper.plan(ch, target, False, variant, bounded)  # fp8: the wgmma kernel or the SIMT one
        if target.name != "cuda" or len(elems) != 1 or elems.pop() not in ("f16", "bf16"):
            return None
        if bounded and ch.seq_q <= self.DECODE_ROWS:
            # decoding: a few query rows against a run-time number of keys, which the SIMT
            # kernel takes with the queries' length static; a tile of 64 query rows would
            # be mostly idle
            return None
        d, dv = ch.head_dim, ch.head_dim_v
        if d % 16 or dv % 8 or max(d, dv) > 256 or 32 * self.MMA_WARPS > target.max_threads:
            return None
        bm = 16 * self.MMA_WARPS
        for bn in ((64, 32, 16) if max(d, dv) <= 64 else (32, 16)):
            shared = 2 * bn * (d + 8) + 2 * bn * (dv + 8)
            if shared <= target.max_shared_bytes:
                break
        else:
            return None
        batch = math.prod(ch.batch)
        if batch > 65535:
            return None
        ldm = dv % 16 == 0
        skip = ch.mask_cond is not None
        on_hopper = hopper.plan(ch, target, skip, variant, bounded)
        if on_hopper is not None:
            return on_hopper
        view = ch.view
        reads_args = all(view.arg_index(x) is not None for x in (_transposed_source(ch.kt), ch.v)) and \
            ch.k_d_contiguous and _contiguous_last(view, ch.v)
        stages = 2 if (ldm and not skip and reads_args and staging_vector_bytes(target) == 16
                       and (2 * shared) <= target.max_dynamic_shared_bytes) else 1
        shared *= stages
        return {"block_m": bm, "block_n": bn, "threads": 32 * self.MMA_WARPS, "lanes_per_row": 4,
                "stages": stages, "dynamic_shared": shared > target.max_shared_bytes,
                "grid": [-(-ch.seq_q // bm), batch, 1], "shared_bytes": shared, "seq_q": ch.seq_q,
                "seq_k": ch.seq_k, "head_dim": d, "head_dim_v": dv, "batch": list(ch.batch), "unroll": 1,
                "mma": True, "vector_bytes": staging_vector_bytes(target), "ldmatrix": ldm,
                "skip_masked_blocks": skip}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        ch = _Chain(kernel)
        if plan.get("mma"):
            if target.name != "cuda":
                raise NotApplicable("the tensor-core attention plan is for CUDA")
            if plan.get("wgmma"):
                return hopper.emit(ch, kernel, plan, gpu_module, target)
            return mma.emit(ch, kernel, plan, gpu_module, target)
        view = ch.view
        bm, bn, threads, tpr = plan["block_m"], plan["block_n"], plan["threads"], plan["lanes_per_row"]
        unroll = plan["unroll"]
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
        if (D, Dv, Sq, Sk) != (plan["head_dim"], plan["head_dim_v"], plan["seq_q"], plan["seq_k"]):
            raise NotApplicable("the plan was made for another kernel")
        size_slots = [tuple(x) for x in plan.get("sizes", [])]
        seq_slots = run_time.seq_slots(ch, size_slots, keys_only=True) if size_slots else None
        dkv = max(D, Dv)
        n_s, n_acc = bn // tpr, -(-Dv // tpr)
        coop = plan.get("coopmat", False)
        if coop and (size_slots or target.name != "spirv"):
            raise NotApplicable("the cooperative-matrix attention plan is for SPIR-V and static sizes")
        # with cooperative matrices: Q, K/V, the f32 S/O tile, the f16 P tile, the rows
        shared_types = coopmat.shared_types(plan) if coop else \
            [workgroup_memref([bm, D + 1]), workgroup_memref([bn, dkv + 1]), workgroup_memref([bm, bn + 1]),
             workgroup_memref([bm, tpr])]
        with kernel.location:
            arg_types = gpu_arg_types(view, target)
            specs = [*view.arg_specs, *view.result_specs]
            # buffers whose run-time dim comes after a dim that is not 1: declared flat,
            # addressed with run-time strides
            strided = run_time_sizes.strided_positions(specs, size_slots)
            for pos in strided:
                arg_types[pos] = run_time_sizes.flat_type(arg_types[pos])
            if size_slots:  # run-time sizes: the slots' buffer, last
                arg_types.append(run_time_sizes.slot_type(len(size_slots)))
            g = GpuFunc(gpu_module, view.name, arg_types, shared_types, (threads, 1, 1))
            if coop:
                Qs, KVs, SO, Ps, Red = g.shared
            else:
                Qs, KVs, Ps, Red = g.shared
            # the tails' guards are static where the tiles divide the sequences; with
            # run-time sequence lengths every tail is guarded
            ragged_q, ragged_k = bool(Sq % bm), bool(Sk % bn)
            out_strides = lse_strides = None
            if seq_slots is not None:
                sizes = run_time_sizes.SizeSlots(g.entry, g.args[-1], size_slots)
                Sk, ragged_k = sizes.size(seq_slots[1]), True
                if seq_slots[0] is not None:  # else the queries' length is static
                    Sq, ragged_q = sizes.size(seq_slots[0]), True
                flat = {pos: sizes.strides_at(specs[pos].shape, run_time_sizes.dims_of(size_slots, pos))
                        for pos in strided}
                out_strides = flat.pop(len(view.args) + ch.out_pos, None)
                if ch.lse_pos is not None:
                    lse_strides = flat.pop(len(view.args) + ch.lse_pos, None)
            n_in = len(view.args)
            out_mem = g.args[n_in + ch.out_pos]
            pw = Pointwise(g, view, g.args[:n_in])
            if seq_slots is not None:
                pw.flat = flat
            f32 = g.f32
            zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
            nb = len(ch.batch)
            with ir.InsertionPoint(g.entry):
                pw.hoist_scalars()  # rank-0 arguments (fp8's scales) loaded once
                tid = g.tid()
                qblock = g.bid("x")
                batch_idx = g.delinearize(g.bid("y"), ch.batch) if ch.batch else []
                row, lane = g.div(tid, tpr), g.rem(tid, tpr)
                sub = g.div(tid, plan["subgroup_size"]) if coop else None  # whole subgroups, in order
                mma_ops = coopmat.subgroup_mma(g, plan) if coop else None
                i0 = g.mul(qblock, bm)
                gi = g.add(i0, row)

                def lead(value):
                    return pw.operand_index(spec_of(value.type).shape[:-2], batch_idx, nb)

                vbytes = plan.get("vector_bytes", 0)

                def stage(tile, rows, cols, fast_is_col, row0, n_rows, read, direct):
                    stage_tile(g, pw, tid, threads, tile, rows, cols, fast_is_col, row0, n_rows, 0, cols, read,
                               direct=direct, vector_bytes=vbytes)

                q_lead, k_lead, v_lead = lead(ch.q), lead(ch.kt), lead(ch.v)
                s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
                memrefs = g.args[:n_in]
                stage(Qs, bm, D, _contiguous_last(view, ch.q), i0, Sq, lambda r, c: pw.eval(ch.q, q_lead + [r, c]),
                      direct_source(view, memrefs, ch.q, q_lead, False))
                k_direct = direct_source(view, memrefs, ch.kt, k_lead, True)
                v_direct = direct_source(view, memrefs, ch.v, v_lead, False)

                lane_cols = [g.add(lane, tpr * c) for c in range(n_s)]  # keys of this lane in a block
                out_cols = [g.add(lane, tpr * c) for c in range(n_acc)]  # output columns of this lane
                # Columns past Dv (TPR not dividing it) read column Dv - 1 and are not stored.
                v_cols = out_cols if Dv % tpr == 0 else \
                    out_cols[:-1] + [arith.minui(out_cols[-1], g.c(Dv - 1))]
                score_in = ch.sm.operands[0]

                def key_block(n0, carried):
                    m_old, l_old, acc = carried[0], carried[1], carried[2:]
                    gpu.barrier()  # the previous block's readers of KVs and Ps are done
                    stage(KVs, bn, D, ch.k_d_contiguous, n0, Sk, lambda r, c: pw.eval(ch.kt, k_lead + [c, r]), k_direct)
                    gpu.barrier()

                    def dot(d0, s):
                        s = list(s)
                        for u in range(unroll):
                            d = g.add(d0, u)
                            qd = memref.load(Qs, [row, d])
                            for c in range(n_s):
                                s[c] = mmath.fma(qd, memref.load(KVs, [lane_cols[c], d]), s[c])
                        return s

                    if coop:
                        coopmat.scores(g, plan, mma_ops, sub, Qs, KVs, SO)
                        gpu.barrier()
                        dots = [memref.load(SO, [row, lane_cols[c]]) for c in range(n_s)]
                    else:
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
                            return g.guarded(g.lt(gi, Sq) if ragged_q else None, [f32], real, lambda: [zero])

                        xs.append(g.guarded(g.lt(gj, Sk) if ragged_k else None, [f32], score,
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
                        l_new = arith.addf(l_new, p)  # the row sum of the unrounded p
                        if ch.p_value != ch.sm.result:  # P @ V reads the P chain of p (fp8: 256 p, rounded)
                            p = apply_p_chain(pw, ch, p, s_lead + [gi, arith.addi(n0, lane_cols[c])])
                        memref.store(coopmat.to_f16(p) if coop else p, Ps, [row, lane_cols[c]])
                    acc = [arith.mulf(a, alpha) for a in acc]
                    gpu.barrier()  # K reads and P writes are done
                    stage(KVs, bn, Dv, _contiguous_last(view, ch.v), n0, Sk,
                          lambda r, c: pw.eval(ch.v, v_lead + [r, c]), v_direct)
                    gpu.barrier()

                    def pv(j0, acc):
                        acc = list(acc)
                        for u in range(unroll):
                            j = g.add(j0, u)
                            p = memref.load(Ps, [row, j])
                            for c in range(n_acc):
                                acc[c] = mmath.fma(p, memref.load(KVs, [j, v_cols[c]]), acc[c])
                        return acc

                    if coop:
                        coopmat.products(g, plan, mma_ops, sub, Ps, KVs, SO)
                        gpu.barrier()
                        acc = [arith.addf(a, memref.load(SO, [row, v_cols[c]])) for c, a in enumerate(acc)]
                    else:
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
                        idx = out_lead + [gi, out_cols[c]]

                        def one(c=c, idx=idx):
                            at = idx if out_strides is None else [linearize(g, idx, out_strides)]
                            store_value(apply_epilogue(pw, ch, arith.divf(acc[c], total), idx), out_mem, at)

                        g.when(g.lt(out_cols[c], Dv) if tpr * (c + 1) > Dv else None, one)

                g.when(g.lt(gi, Sq) if ragged_q else None, store)
                if ch.lse_pos is not None:  # the row's logsumexp, by its first lane
                    def store_lse():
                        idx = lse_index(ch, batch_idx, gi, g.c(0))
                        at = idx if lse_strides is None else [linearize(g, idx, lse_strides)]
                        store_value(row_lse(final[0], total), g.args[n_in + ch.lse_pos], at)

                    first = arith.cmpi(arith.CmpIPredicate.eq, lane, g.c(0))
                    g.when(arith.andi(first, g.lt(gi, Sq)) if ragged_q else first, store_lse)
            g.finish()
        notes = {"strategy": "attention", "workgroup_bytes": plan["shared_bytes"], "block_m": bm, "block_n": bn,
                 "lanes_per_row": tpr}
        if coop:
            notes["cooperative_matrix"] = "{}x{}x{}.f16".format(*plan["coopmat_shape"])
        if seq_slots is None:
            return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0, notes)
        grid_x = str(plan["grid"][0]) if seq_slots[0] is None else run_time_sizes.grid_text(seq_slots[0], 1, bm)
        grid = (grid_x, str(plan["grid"][1]), "1")
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0, notes, sizes=tuple(size_slots),
                             grid_sizes=grid)


register(AttentionStrategy())

from . import backward  # noqa: E402,F401  (registers the attention_backward strategy)
