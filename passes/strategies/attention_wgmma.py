"""The attention strategy's Hopper kernel: FlashAttention on ``wgmma.mma_async`` (sm_90a).

The mma.sync kernel (attention.py) reads every K and V fragment from shared memory
with ldmatrix into registers, 16 query rows a warp; at head dim 128 that kept it at
0.44x torch's SDPA on the H200. Here the tensor cores read K and V from shared memory
themselves, through matrix descriptors, and a warpgroup (4 warps) owns 64 query rows:

- Q (the workgroup's BLOCK_M = 64 x WARPGROUPS rows) is copied once into 128-byte
  swizzled shared memory; K and V blocks of BLOCK_N keys are double-buffered by cp.async
  in the same layout (``wgmma.SwizzledTile``: Q and K K-major over the head dim, V as it
  lies, keys by head dim, which wgmma reads transposed).
- Per key block, S = Q K^T is one m64 x BLOCK_N x 16 wgmma per 16 of the head dim, both
  operands from shared memory. The accumulator comes out in mma.sync's C layout per 8
  columns, so the online softmax is the mma.sync kernel's (``attention.online_softmax``:
  the elementwise chain per score, tails, quad-shuffled row maxima and sums).
- O += P V takes P from registers: the A operand of a register-A wgmma has mma.sync's A
  fragment layout, which is the layout the scores are in, rounded to the input type
  (as FlashAttention does). MLIR 22's nvvm.wgmma.mma_async takes descriptors only, so
  this instruction is inline PTX, its 4 A registers and Dv/2 accumulators as operands.
- A key block is waited for before its softmax (S) and before the next block (O), so
  a warpgroup's products do not overlap its own softmax; the workgroup's other
  warpgroups do, and the next block's copies are in flight meanwhile.

Masks that mask whole key blocks are skipped exactly as in the mma.sync kernel
(``AttentionStrategy._skipping_loop``, K and V then staged per block); without a
mask, or with SKIP_MASKED_BLOCKS off, the double-buffered loop runs.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, llvm, nvvm

from .base import EmittedKernel, NotApplicable, TargetInfo
from .matmul import (Direct, GpuFunc, MmaSync, Pointwise, VectorStaging, _elem_bytes, direct_source, gpu_arg_types,
                     quad_reduce, store_value)
from . import wgmma as _wg

#: Whether sm_90a attention takes wgmma (else the mma.sync kernel).
WGMMA = True

#: Warpgroups a workgroup (64 query rows each).
WARPGROUPS = 2

#: Keys a block.
BLOCK_N = 128


def plan(ch, target: TargetInfo, skip: bool) -> dict | None:
    """The wgmma attention plan, or None where the mma.sync kernel stays: not sm_90a,
    q/k/v not f16/bf16 arguments read as they lie (K through its transpose), head dims
    not multiples of 64 (whole 128-byte swizzled rows) up to 256, or shared memory short."""
    if not (WGMMA and _wg.available(target)):
        return None
    view = ch.view
    elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
    if len(elems) != 1 or (elem := elems.pop()) not in ("f16", "bf16"):
        return None
    d, dv = ch.head_dim, ch.head_dim_v
    if d % 64 or dv % 64 or max(d, dv) > 256:
        return None
    from .attention import _transposed_source
    from .matmul import _contiguous_last

    if view.arg_index(ch.q) is None or not _contiguous_last(view, ch.q):
        return None
    if view.arg_index(_transposed_source(ch.kt)) is None or not ch.k_d_contiguous:
        return None
    if view.arg_index(ch.v) is None or not _contiguous_last(view, ch.v):
        return None
    bm, bn = 64 * WARPGROUPS, BLOCK_N
    stages = 1 if skip else 2
    shared = 2 * (bm * d + stages * bn * (d + dv)) + _wg.ATOM_BYTES
    if shared > target.max_dynamic_shared_bytes:
        return None
    masks = _staged_masks(ch, bm, bn) if skip and ch.mask_cond is not None else []
    mask_bytes = sum(_units(bm * (bn + pad) * width) for _, width, pad in masks)
    if shared + mask_bytes > target.max_dynamic_shared_bytes:
        masks, mask_bytes = [], 0
    shared += mask_bytes
    batch = math.prod(ch.batch)
    if batch > 65535:
        return None
    return {"block_m": bm, "block_n": bn, "threads": 128 * WARPGROUPS, "stages": stages, "grid": [-(-ch.seq_q // bm),
            batch, 1], "shared_bytes": shared, "dynamic_shared": True, "seq_q": ch.seq_q, "seq_k": ch.seq_k,
            "head_dim": d, "head_dim_v": dv, "batch": list(ch.batch), "mma": True, "wgmma": True,
            "skip_masked_blocks": skip, "elem": elem, "staged_masks": [i for i, _, _ in masks]}


#: Mask tiles' rows are padded by 16 bytes: the 8 rows a warp's fragment reads at once
#: then start in 8 different groups of 4 banks (a 256-byte row would put them in one).
MASK_PAD_BYTES = 16


def _units(nbytes: int) -> int:
    return -(-nbytes // _wg.ATOM_BYTES) * _wg.ATOM_BYTES


def _staged_masks(ch, bm: int, bn: int) -> list[tuple[int, int, int]]:
    """(argument index, element bytes, pad elements) of each argument the mask reads
    that is staged a block at a time in shared memory: a [.., Sq, Sk] argument whose
    leading dims are 1 (one mask for every head: the causal mask) and whose rows are
    whole 16-byte vectors. The skipping loop reads a block's mask twice (to test the
    block, then in the softmax), each thread 64 scattered elements a block: from
    global memory that was most of the causal kernel's time."""
    from .matmul import defining

    view = ch.view
    found, seen, stack = [], set(), [ch.mask_cond]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        i = view.arg_index(v)
        if i is not None:
            spec = view.arg_specs[i]
            width = {"f32": 4, "f16": 2, "bf16": 2, "i8": 1, "i1": 1}.get(spec.elem)
            if width and spec.rank >= 2 and tuple(spec.shape[-2:]) == (ch.seq_q, ch.seq_k) and \
                    all(x == 1 for x in spec.shape[:-2]) and (ch.seq_k * width) % 16 == 0:
                found.append((i, width, MASK_PAD_BYTES // width))
            continue
        op = defining(v)
        if op is not None:
            stack.extend(op.operands)
    return sorted(set(found))


def _register_a_wgmma(acc: ir.Value, n: int, elem: str, a: list[ir.Value], b_desc: ir.Value) -> ir.Value:
    """``wgmma.mma_async m64n{n}k16`` with A from registers (4 x b32 of the m64 x k16 A
    tile in mma.sync's fragment layout) and B, transposed (MN-major), by descriptor:
    inline PTX, accumulators tied in and out (``acc``: a struct of n / 2 f32)."""
    n_acc = n // 2
    out = ",".join(f"${i}" for i in range(n_acc))
    asm = ("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
           f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{elem}.{elem} {{{out}}}, "
           f"{{${n_acc}, ${n_acc + 1}, ${n_acc + 2}, ${n_acc + 3}}}, ${n_acc + 4}, p, 1, 1, 1;\n}}")
    cons = ",".join(["=f"] * n_acc + ["r"] * 4 + ["l"] + [str(i) for i in range(n_acc)])
    f32 = ir.F32Type.get()
    accs = [llvm.extractvalue(f32, acc, [i]) for i in range(n_acc)]
    return llvm.InlineAsmOp(acc.type, [*a, b_desc, *accs], asm, cons, has_side_effects=True).res


def emit(strategy, ch, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
    """The wgmma attention kernel of a ``plan()`` plan (see the module docstring)."""
    from .attention import online_softmax

    view = ch.view
    bm, bn, threads, stages = plan["block_m"], plan["block_n"], plan["threads"], plan["stages"]
    D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
    elem = spec_of(ch.q.type).elem
    et = ir.Type.parse(elem)
    esize = 2
    per_row = _wg.SWIZZLE_BYTES // esize
    i64 = ir.IntegerType.get_signless(64)
    f32 = ir.F32Type.get()
    s_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (bn // 2)) + ")>")
    o_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (Dv // 2)) + ")>")
    s_attrs = _wg._wgmma_attrs(elem, bn, 16, False)
    with kernel.location:
        g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target), [], (threads, 1, 1))  # window: _carve_aligned
        n_in = len(view.args)
        out_mem = g.args[n_in]
        pw = Pointwise(g, view, g.args[:n_in])
        zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
        tc = MmaSync(elem)
        nb = len(ch.batch)
        with ir.InsertionPoint(g.entry):
            # Q: bm rows x D; K: bn rows x D a stage; V: bn k-rows x Dv a stage (MN-major)
            staged = plan.get("staged_masks", []) if plan.get("skip_masked_blocks") else []
            mask_elems = [ir.MemRefType(g.args[i].type).element_type for i in staged]
            Qs, Ks, Vs, *Ms = _wg._carve_aligned(
                g, [(bm * D // per_row, per_row, et), (stages * bn * D // per_row, per_row, et),
                    (stages * bn * Dv // per_row, per_row, et)] +
                [(bm, bn + MASK_PAD_BYTES // _elem_bytes(t), t) for t in mask_elems])
            tid = g.tid()
            qblock = g.bid("x")
            batch_idx = g.delinearize(g.bid("y"), ch.batch) if ch.batch else []
            warp, lane = g.div(tid, 32), g.rem(tid, 32)
            wg = g.div(warp, 4)
            gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
            q0 = g.mul(qblock, bm)
            r0 = arith.addi(q0, arith.addi(g.mul(wg, 64), arith.addi(g.mul(g.rem(warp, 4), 16), gid)))
            rows = [r0, g.add(r0, 8)]
            pw.reciprocal_of_constants = True

            def lead(value):
                return pw.operand_index(spec_of(value.type).shape[:-2], batch_idx, nb)

            q_direct = direct_source(view, g.args[:n_in], ch.q, lead(ch.q), False)
            k_direct = direct_source(view, g.args[:n_in], ch.kt, lead(ch.kt), True)
            v_direct = direct_source(view, g.args[:n_in], ch.v, lead(ch.v), False)
            if None in (q_direct, k_direct, v_direct):
                raise NotApplicable("the wgmma attention plan reads q, k and v straight from arguments")
            q_tile = _wg.SwizzledTile(g, tid, threads, Qs, q_direct, bm, D, esize, Sq, D, False, width=D)
            k_tile = _wg.SwizzledTile(g, tid, threads, Ks, k_direct, bn, D, esize, Sk, D, False, width=D)
            v_tile = _wg.SwizzledTile(g, tid, threads, Vs, v_direct, Dv, bn, esize, Dv, Sk, True)
            s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
            mask_tiles = []
            for i, tile in zip(staged, Ms):
                rank = view.arg_specs[i].rank
                src = Direct(g.args[i], [g.c(0)] * (rank - 2), False)
                staging = VectorStaging(g, tid, threads, tile, bm, bn, Sq, Sk, False, src, 16)
                if not staging.copies_async:
                    raise NotApplicable(f"the mask argument {i} cannot be staged by cp.async")
                mask_tiles.append((i, tile, staging))
            n_o = Dv // 8
            q_desc = arith.addi(q_tile.descriptor_base(), arith.index_cast(i64, g.mul(wg, 64 * _wg.SWIZZLE_BYTES // 16)))
            k_desc0, v_desc0 = k_tile.descriptor_base(), v_tile.descriptor_base()
            log2e = g.fconst(math.log2(math.e))

            def exp(x):
                return mmath_exp2(arith.mulf(x, log2e))

            def fence_and_publish():
                nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                                  space=ir.Attribute.parse("#nvvm.shared_space<cta>"))
                gpu.barrier()

            def key_block(n0, carried, stage=None):
                """One key block; ``stage``: the block is already in that stage (the
                pipelined loop). Without, it is staged here into stage 0."""
                m, l, o = carried[0:2], carried[2:4], carried[4]
                if stage is None:
                    gpu.barrier()  # the previous block's readers are done
                    k_tile.copy_async(n0, 0, 0)
                    v_tile.copy_async(0, n0, 0)
                    nvvm.cp_async_commit_group()
                    nvvm.cp_async_wait_group(0)
                    fence_and_publish()
                    stage = g.c(0)
                k_d = arith.addi(k_desc0, arith.index_cast(i64, g.mul(stage, k_tile.stage_bytes // 16)))
                v_d = arith.addi(v_desc0, arith.index_cast(i64, g.mul(stage, v_tile.stage_bytes // 16)))
                nvvm.wgmma_fence_aligned()
                acc = llvm.mlir_zero(s_t)
                for t in range(D // 16):
                    acc = nvvm.WgmmaMmaAsyncOp(
                        s_t, acc, arith.addi(q_desc, _wg._i64(q_tile.slice_offset(t, 16) // 16)),
                        arith.addi(k_d, _wg._i64(k_tile.slice_offset(t, 16) // 16)), *s_attrs).result
                nvvm.wgmma_commit_group_sync_aligned()
                nvvm.wgmma_wait_group_sync_aligned(0)
                s = [[llvm.extractvalue(f32, acc, [4 * j + k]) for k in range(4)] for j in range(bn // 8)]
                m_new, l_new, alpha, p = online_softmax(g, pw, ch, s, m, l, rows, tig2, n0, bm, bn, s_lead, exp)
                # O *= alpha (the rows' rescale), in the accumulator registers
                ov = [arith.mulf(llvm.extractvalue(f32, o, [i]), alpha[(i % 4) // 2]) for i in range(Dv // 2)]
                o = llvm.mlir_undef(o_t)
                for i, v in enumerate(ov):
                    o = llvm.insertvalue(o, v, [i])
                pe = [[scalar_math.convert(v, et) for v in pj] for pj in p]
                nvvm.wgmma_fence_aligned()
                for kk in range(bn // 16):
                    a = [tc.pack(pe[2 * kk][0], pe[2 * kk][1]), tc.pack(pe[2 * kk][2], pe[2 * kk][3]),
                         tc.pack(pe[2 * kk + 1][0], pe[2 * kk + 1][1]), tc.pack(pe[2 * kk + 1][2], pe[2 * kk + 1][3])]
                    a = [x if elem != "f16" else llvm.bitcast(ir.IntegerType.get_signless(32), x) for x in a]
                    o = _register_a_wgmma(o, Dv, elem, a, arith.addi(v_d, _wg._i64(v_tile.slice_offset(kk, 16) // 16)))
                nvvm.wgmma_commit_group_sync_aligned()
                nvvm.wgmma_wait_group_sync_aligned(0)
                return m_new + l_new + [o]

            q_tile.copy_async(q0, 0, 0)
            init = [neg_inf, neg_inf, zero, zero, llvm.mlir_zero(o_t)]
            skip = plan.get("skip_masked_blocks") and ch.mask_cond is not None
            if skip or stages < 2:
                nvvm.cp_async_commit_group()  # Q lands with the first block's copies
                if skip:
                    def stage_mask(n0):
                        """This block's mask tiles: every thread reads them from here on."""
                        if not mask_tiles:
                            return
                        gpu.barrier()  # the previous block's readers are done
                        for i, tile, staging in mask_tiles:
                            staging.copy_async(q0, n0)
                            pw.tiles[i] = (tile, q0, n0)
                        nvvm.cp_async_commit_group()
                        nvvm.cp_async_wait_group(0)
                        gpu.barrier()

                    final = strategy._skipping_loop(g, pw, ch, key_block, init, rows, tig2, bm, bn, s_lead,
                                                    stage_mask)
                    pw.tiles.clear()
                else:  # one stage: each block staged where it is used
                    final = g.loop(0, Sk, bn, init, lambda n0, c: key_block(n0, c))
            else:
                k_tile.copy_async(0, 0, 0)
                v_tile.copy_async(0, 0, 0)
                nvvm.cp_async_commit_group()

                def step(n0, carried):
                    j = g.div(n0, bn)
                    nvvm.cp_async_wait_group(0)
                    fence_and_publish()  # also: every warpgroup is done with the other stage
                    nxt = g.rem(g.add(j, 1), 2)
                    n1 = g.add(n0, bn)
                    k_tile.copy_async(n1, 0, nxt)
                    v_tile.copy_async(0, n1, nxt)
                    nvvm.cp_async_commit_group()
                    return key_block(n0, carried, g.rem(j, 2))

                final = g.loop(0, Sk, bn, init, step)
            nvvm.cp_async_wait_group(0)
            totals = [quad_reduce(final[2 + h], arith.addf) for h in range(2)]
            o = final[4]
            for h in range(2):
                def store(h=h):
                    for n in range(n_o):
                        for k in (2 * h, 2 * h + 1):
                            col = g.add(tig2, 8 * n + k % 2)
                            v = llvm.extractvalue(f32, o, [4 * n + k])
                            store_value(arith.divf(v, totals[h]), out_mem, list(batch_idx) + [rows[h], col])

                g.when(g.lt(rows[h], Sq) if Sq % bm or Sq < bm else None, store)
        g.finish()
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                         {"strategy": "attention", "tensor_cores": f"wgmma.m64n{bn}k16+m64n{Dv}k16",
                          "workgroup_bytes": plan["shared_bytes"], "block_m": bm, "block_n": bn, "stages": stages})


def mmath_exp2(x: ir.Value) -> ir.Value:
    from mlir.dialects import math as mmath

    return mmath.exp2(x)
