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

Two kernels. On CUDA with f16/bf16 q, k, v and head dims that are multiples of 16 the
tensor-core kernel (``_emit_mma``: mma.sync m16n8k16, FlashAttention-2's register
dataflow). fp8 q, k, v (``precision="fp8"`` on CUDA) take the fp8 wgmma kernel of
``attention_wgmma.py`` where it applies (sm_90a), else the SIMT kernel, which widens
the E4M3FN bytes as it loads them. Everywhere else, Vulkan and f32 included, the SIMT
kernel:

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
before V overwrites K, after V); two in the tensor-core kernel. Tiles read straight
from arguments are staged with 128-bit loads on CUDA. The plan (``plan``) says which
kernel, and its block sizes, as JSON-able values.

Measured on an H200 (2026-12-02, 4 x 16 heads x 2048, no mask): f16 head dim 64 at
163 TFLOP/s and bf16 head dim 128 at 148, against torch's flash SDPA at 451 and 648;
the f32 SIMT kernel at 14 against 34. Checked against torch on the H200: sequence
tails (257, 513, 1000), [s, s], [b, 1, s, s] and boolean masks, head dims 64 and 128
(the head-dim-80 and single-row CUDA cases in the tests came later and have not run there).

Since then: K and V fragments by ldmatrix (V with .trans), exp as exp2, the scale as a
reciprocal multiply, and key blocks that a mask masks entirely skipped (``_skipping_loop``):
4x32x2048x128 bf16 1.62 -> 1.30 ms, x64 0.83 -> 0.65 ms (bench/variants.py). Then K and
V double-buffered by cp.async where no blocks are skipped (``PIPELINE``): 1.30 -> 1.04
ms and 0.64 -> 0.57 ms. On sm_90a the plan is the wgmma kernel of
``attention_wgmma.py`` (2026-12-03: 4x32x2048x128 0.73 ms, 0.61x SDPA; x64 0.41 ms), which
shares ``online_softmax`` and ``_skipping_loop`` with this one; this kernel's skipping loop
still stages synchronously (a register prefetch exists, ``PREFETCH``, off by default, as
it turns skipping off). No TMA in either.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import broadcast_shapes
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from . import matmul as _matmul
from .matmul import (
    GpuFunc,
    KernelView,
    MmaSync,
    Pointwise,
    VectorStaging,
    _contiguous_last,
    defining,
    direct_source,
    gpu_arg_types,
    pointwise_closure,
    quad_reduce,
    stage_tile,
    staging_vector_bytes,
    store_value,
    workgroup_memref,
)


class _Chain:
    """The recognized parts of an attention kernel function.

    ``mm1``, ``sm``, ``mm2``: q @ k^T, the softmax, the second product; ``q``, ``kt``,
    ``v``: the products' operands (``kt`` and, for fp8's K-major V, ``v`` may be
    transposes of arguments: ``_transposed_source``). ``p_value``: mm2's A operand,
    ``sm.result`` itself or the end of the P chain (casts and rank-0 scales of the
    softmax); ``p_scale``: the constant c with P chain = c * P up to its casts (1.0
    without scales), None where a multiplier is not a constant fill; ``p_elem``: the
    element type of mm2's A operand ("bf16", "f8E4M3FN", "f32"); ``epilogue_value``:
    the kernel's result, ``mm2.result`` itself or the end of the rank-0 scales and casts
    after it."""

    def __init__(self, kernel: ir.Operation):
        view = KernelView(kernel)
        self.view = view
        if len(view.results) != 1:
            raise NotApplicable(f"@{view.name} returns {len(view.results)} values; attention returns one")
        # The epilogue: rank-0 scales and casts after P @ V (fp8's dequantization).
        self.epilogue_value = view.results[0]
        mm2 = defining(view.results[0])
        while mm2 is not None and _link(mm2) is not None:
            mm2 = defining(_link(mm2)[0])
        if mm2 is None or mm2.name != "kf.matmul":
            raise NotApplicable("the result is not matmul(softmax(...), v)")
        # The P chain: casts and rank-0 scales from the softmax to P @ V's A operand (the
        # precision policy's rounding of P). It is homogeneous of degree 1 in P, which is
        # what lets the kernels apply it to unnormalized probabilities.
        self.p_value, self.p_scale = mm2.operands[0], 1.0
        self.p_elem = spec_of(self.p_value.type).elem
        sm = defining(self.p_value)
        while sm is not None and _link(sm) is not None:
            x, c = _link(sm)
            self.p_scale = None if self.p_scale is None or math.isnan(c) else self.p_scale * c
            sm = defining(x)
        if sm is None or sm.name != "kf.softmax":
            raise NotApplicable("the first operand of the last matmul is not a softmax, or casts and rank-0 "
                                "scales of one")
        s_spec = spec_of(sm.result.type)
        if op_attrs(sm)["dim"] % s_spec.rank != s_spec.rank - 1:
            raise NotApplicable("softmax is not over the last dimension")
        if len(list(sm.result.uses)) != 1:
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
        # A mask applied last, with a fill far below any real score (the seed's
        # masked_fill(mask == 0, -1e9)): key blocks where it masks every score add exactly
        # nothing to rows that have a real score somewhere, so the kernel may skip them.
        self.mask_cond, self.mask_fill = None, None
        last = defining(sm.operands[0])
        self.unmasked_scores = None  # the scores before the mask: a block the mask leaves whole
        if last is not None and last.name == "kf.masked_fill" and op_attrs(last)["value"] <= -1e4:
            self.mask_cond, self.mask_fill = last.operands[1], float(op_attrs(last)["value"])
            self.unmasked_scores = last.operands[0]


def _float_cast(op: ir.Operation) -> bool:
    return op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(op.result.type).is_float


def _link(op: ir.Operation) -> tuple[ir.Value, float] | None:
    """A link of the P chain or the epilogue: (its operand x, its factor) for a float
    cast of x (1), ``x * c``, ``c * x`` (c) or ``x / c`` (1 / c) with c rank-0 and x not;
    the factor is NaN where c is not a constant fill (an argument: fp8's scales). None for
    any other op."""
    if _float_cast(op):
        return op.operands[0], 1.0
    if op.name not in ("kf.mul", "kf.div"):
        return None
    a, b = op.operands
    rank0 = [not spec_of(v.type).shape for v in (a, b)]
    if rank0[1] and not rank0[0]:
        x, c = a, b
    elif op.name == "kf.mul" and rank0[0] and not rank0[1]:
        x, c = b, a
    else:
        return None
    fill = defining(c)
    if fill is None or fill.name != "kf.fill":
        return x, math.nan
    v = float(op_attrs(fill)["value"])
    return x, (v if op.name == "kf.mul" else 1.0 / v if v else math.nan)


def apply_p_chain(pw: Pointwise, ch: "_Chain", p: ir.Value, index: list) -> ir.Value:
    """The P chain (what the second product reads of the softmax: fp8's ``cast(P * 256)``,
    bf16's ``cast(P)``) applied to an unnormalized probability p, in f32: the kernels
    round before the row sums divide (the chain is homogeneous in P, so the division
    commutes with everything but the rounding)."""
    if ch.p_value == ch.sm.result:
        return p
    pw.reset()
    pw.bind(ch.sm.result, p)
    out = scalar_math.convert(pw.eval(ch.p_value, index), ir.F32Type.get())
    pw.reset()
    return out


def apply_epilogue(pw: Pointwise, ch: "_Chain", o: ir.Value, index: list) -> ir.Value:
    """The ops after P @ V (rank-0 scales, casts) on one output element o."""
    if ch.epilogue_value == ch.mm2.result:
        return o
    pw.reset()
    pw.bind(ch.mm2.result, o)
    out = pw.eval(ch.epilogue_value, index)
    pw.reset()
    return out


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _shared_bytes(bm: int, bn: int, d: int, dv: int, tpr: int) -> int:
    return 4 * (bm * (d + 1) + bn * (max(d, dv) + 1) + bm * (bn + 1) + bm * tpr)


def _transposed_source(v: ir.Value) -> ir.Value:
    """The operand of a kf.transpose that defines v (K for K^T), else v."""
    op = _matmul.defining(v)
    return op.operands[0] if op is not None and op.name == "kf.transpose" else v


def _pipelined_key_loop(g: GpuFunc, Sk: int, bn: int, k_stage: VectorStaging, v_stage: VectorStaging,
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


def online_softmax(g: GpuFunc, pw: Pointwise, ch: "_Chain", s: list[list[ir.Value]], m: list[ir.Value],
                   l: list[ir.Value], rows: list[ir.Value], tig2: ir.Value, n0: ir.Value, bm: int, bn: int,
                   s_lead: list, exp, score_in: ir.Value | None = None,
                   causal: bool = False) -> tuple[list, list, list, list]:
    """One key block of FlashAttention's online softmax on scores in the mma accumulator
    layout (``s[j]``: the 4 values of 8-key tile j: rows gid, gid + 8 -- ``rows`` --,
    columns 2 tig, 2 tig + 1), shared by the mma.sync and wgmma kernels: the elementwise
    chain between the matmuls (scale, mask, bias) per score with the tails at -inf, the
    running row maxima ``m`` and sums ``l`` (quad shuffles), and the probabilities.
    Returns (m_new, l_new, alpha -- the factor the accumulator is rescaled by --, p).
    ``score_in``: the value whose elements are the scores, softmax's operand unless told
    (the scores before the mask, for a block the mask leaves whole). ``causal``: the
    mask condition is known to be ``key > query`` over this block (the block table's
    CAUSAL class), so it is computed from the indices instead of read: per score one
    compare of ``row - n0 - 2 tig`` (once a row) with the column's constant offset."""
    Sq, Sk = ch.seq_q, ch.seq_k
    f32 = ir.F32Type.get()
    zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
    score_in = score_in if score_in is not None else ch.sm.operands[0]
    i32 = ir.IntegerType.get_signless(32)
    # key n0 + 2 tig + c is past query row gi iff c > gi - n0 - 2 tig (signed: negative
    # below the block's first key); i32 as sequences are far below 2^31
    offsets = [arith.index_cast(i32, arith.subi(gi, arith.addi(n0, tig2))) for gi in rows] if causal else []
    x = []
    for j in range(bn // 8):
        xj = []
        for k in range(4):
            gi, gj = rows[k // 2], arith.addi(n0, g.add(tig2, 8 * j + k % 2))

            def score(dot=s[j][k], gi=gi, gj=gj, h=k // 2, c=8 * j + k % 2):
                def real():
                    pw.reset()
                    pw.bind(ch.mm1.result, dot)
                    if causal:
                        pw.bind(ch.mask_cond, arith.cmpi(arith.CmpIPredicate.slt, offsets[h], arith.constant(i32, c)))
                    out = scalar_math.convert(pw.eval(score_in, s_lead + [gi, gj]), f32)
                    if causal:
                        del pw.bound[ch.mask_cond]
                    return [out]

                return g.guarded(g.lt(gi, Sq) if Sq % bm or Sq < bm else None, [f32], real,
                                 lambda: [zero])

            xj.append(g.guarded(g.lt(gj, Sk) if Sk % bn else None, [f32], score, lambda: [neg_inf])[0])
        x.append(xj)
    m_new, alpha = [], []
    for h in range(2):  # rows gid and gid + 8
        mx = x[0][2 * h]
        for j in range(bn // 8):
            for k in (2 * h, 2 * h + 1):
                if (j, k) != (0, 2 * h):
                    mx = arith.maximumf(mx, x[j][k])
        mx = arith.maximumf(m[h], quad_reduce(mx, arith.maximumf))
        m_new.append(mx)
        alpha.append(exp(arith.subf(m[h], mx)))
    p = [[exp(arith.subf(x[j][k], m_new[k // 2])) for k in range(4)] for j in range(bn // 8)]
    return m_new, row_sums(l, alpha, p), alpha, p


def row_sums(l: list[ir.Value], alpha: list[ir.Value], p: list[list[ir.Value]]) -> list[ir.Value]:
    """The running row sums after a key block: l rescaled by alpha plus the block's p
    (in the mma accumulator layout: rows gid -- values 0, 1 -- and gid + 8 -- 2, 3)."""
    out = []
    for h in range(2):
        t_ = arith.mulf(l[h], alpha[h])
        for pj in p:
            t_ = arith.addf(arith.addf(t_, pj[2 * h]), pj[2 * h + 1])
        out.append(t_)
    return out


def block_reduce(pred: ir.Value, how: str = "or", barrier: tuple[int, int] | None = None) -> ir.Value:
    """The workgroup's OR / AND of a predicate (``bar.red``; a barrier too). ``barrier``:
    (id, threads) of a named barrier of some of the workgroup's warps instead."""
    from mlir.dialects import llvm, nvvm

    i32 = ir.IntegerType.get_signless(32)
    if barrier is not None:  # the NVVM op reduces on barrier 0 only
        asm = (f"{{ .reg .pred p, q; setp.ne.u32 q, $1, 0; bar.red.{how}.pred p, {barrier[0]}, {barrier[1]}, q; "
               "selp.u32 $0, 1, 0, p; }")
        r = llvm.InlineAsmOp(i32, [arith.extui(i32, pred)], asm, "=r,r", has_side_effects=True).res
    else:
        r = nvvm.BarrierOp(i32, reductionOp=ir.Attribute.parse(f"#nvvm.reduction<{how}>"),
                           reductionPredicate=arith.extui(i32, pred)).res
    return arith.cmpi(arith.CmpIPredicate.ne, r, arith.constant(i32, 0))


class AttentionStrategy(Strategy):
    KIND = "attention"

    #: Register prefetch of the next K/V block (H200, 4x32x2048: 1.26 ms with it, 1.30
    #: without at head_dim 128, 0.667 and 0.648 at 64); off, as it also turns off block skipping.
    PREFETCH = False

    #: Whether tensor-core plans skip key blocks that a mask masks entirely (see
    #: ``_skipping_loop``).
    SKIP_MASKED_BLOCKS = True

    #: Whether tensor-core plans without block skipping double-buffer K and V with
    #: cp.async (the next block's copies in flight during this block's products), where
    #: both are arguments read as they lie with rows of whole 16-byte pieces. H200,
    #: 4x32x2048 bf16 (bench/results/variants-attention-pipeline-2026-12-02.json): head
    #: dim 128 1.30 -> 1.04 ms, 64 0.64 -> 0.57 ms. Eight warps (MMA_WARPS) were slower
    #: in every case there.
    PIPELINE = True

    #: A register budget for the tensor-core kernel (``.maxnreg``), or 0 for ptxas's own
    #: choice, which caps it at 168 for 128 threads (three workgroups an SM) and then
    #: spills 20 to 44 bytes at head_dim 128 with a mask; 255 gives it what it asks (about
    #: 210, two workgroups an SM) and was 10-20% slower on the H200 in every case measured.
    MAX_REGISTERS = 0

    #: per-thread f32 registers of scores plus accumulators that the plan allows: above
    #: this ptxas starts to spill at 128 threads (checked at head_dim 128).
    MAX_REGISTER_TILE = 64

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
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
        mma = self._mma_plan(ch, target)
        if mma is not None:
            return mma
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

    def _mma_plan(self, ch: _Chain, target: TargetInfo) -> dict | None:
        """The tensor-core plan (CUDA, f16/bf16 q/k/v, head dims multiples of 16 and 8),
        or None for the SIMT kernel. BLOCK_N is 64 keys up to head_dim 64 and 32 above
        (the S fragments then cost 16 registers instead of 32, next to 64 accumulators at
        head_dim 128); K and V tiles are kept in the input type, rows padded by 8
        elements so the fragment reads of a warp hit 32 distinct banks."""
        elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
        if target.name == "cuda" and len(elems) == 1 and next(iter(elems)).startswith("f8"):
            from . import attention_wgmma  # fp8: the wgmma kernel or the SIMT one

            return attention_wgmma.plan(ch, target, False)
        if target.name != "cuda" or len(elems) != 1 or elems.pop() not in ("f16", "bf16"):
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
        ldm = _matmul.MMA_LDMATRIX and dv % 16 == 0
        skip = self.SKIP_MASKED_BLOCKS and ch.mask_cond is not None
        from . import attention_wgmma

        hopper = attention_wgmma.plan(ch, target, skip)
        if hopper is not None:
            return hopper
        view = ch.view
        reads_args = all(view.arg_index(x) is not None for x in (_transposed_source(ch.kt), ch.v)) and \
            ch.k_d_contiguous and _contiguous_last(view, ch.v)
        stages = 2 if (self.PIPELINE and ldm and not skip and not self.PREFETCH and reads_args
                       and staging_vector_bytes(target) == 16 and (2 * shared) <= target.max_dynamic_shared_bytes) \
            else 1
        shared *= stages
        return {"block_m": bm, "block_n": bn, "threads": 32 * self.MMA_WARPS, "lanes_per_row": 4,
                "stages": stages, "dynamic_shared": shared > target.max_shared_bytes,
                "grid": [-(-ch.seq_q // bm), batch, 1], "shared_bytes": shared, "seq_q": ch.seq_q,
                "seq_k": ch.seq_k, "head_dim": d, "head_dim_v": dv, "batch": list(ch.batch), "unroll": 1,
                "mma": True, "vector_bytes": staging_vector_bytes(target), "prefetch": self.PREFETCH,
                "ldmatrix": ldm, "skip_masked_blocks": skip, "max_registers": self.MAX_REGISTERS}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        ch = _Chain(kernel)
        if plan.get("mma"):
            if target.name != "cuda":
                raise NotApplicable("the tensor-core attention plan is for CUDA")
            if plan.get("wgmma"):
                from . import attention_wgmma

                return attention_wgmma.emit(self, ch, kernel, plan, gpu_module, target)
            return self._emit_mma(ch, kernel, plan, gpu_module, target)
        view = ch.view
        bm, bn, threads, tpr = plan["block_m"], plan["block_n"], plan["threads"], plan["lanes_per_row"]
        unroll = plan["unroll"]
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
        if (D, Dv, Sq, Sk) != (plan["head_dim"], plan["head_dim_v"], plan["seq_q"], plan["seq_k"]):
            raise NotApplicable("the plan was made for another kernel")
        dkv = max(D, Dv)
        n_s, n_acc = bn // tpr, -(-Dv // tpr)
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
                pw.hoist_scalars()  # rank-0 arguments (fp8's scales) loaded once
                tid = g.tid()
                qblock = g.bid("x")
                batch_idx = g.delinearize(g.bid("y"), ch.batch) if ch.batch else []
                row, lane = g.div(tid, tpr), g.rem(tid, tpr)
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
                        l_new = arith.addf(l_new, p)  # the row sum of the unrounded p
                        if ch.p_value != ch.sm.result:  # P @ V reads the P chain of p (fp8: 256 p, rounded)
                            p = apply_p_chain(pw, ch, p, s_lead + [gi, arith.addi(n0, lane_cols[c])])
                        memref.store(p, Ps, [row, lane_cols[c]])
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
                            store_value(apply_epilogue(pw, ch, arith.divf(acc[c], total), idx), out_mem, idx)

                        g.when(g.lt(out_cols[c], Dv) if tpr * (c + 1) > Dv else None, one)

                g.when(g.lt(gi, Sq) if Sq % bm else None, store)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0,
                             {"strategy": "attention", "workgroup_bytes": plan["shared_bytes"],
                              "block_m": bm, "block_n": bn, "lanes_per_row": tpr})

    def _emit_mma(self, ch: _Chain, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
                  target: TargetInfo) -> EmittedKernel:
        """The CUDA tensor-core kernel: FlashAttention-2's register dataflow on
        ``mma.sync.m16n8k16`` (f16 or bf16 operands, f32 accumulators).

        Each warp owns 16 query rows; its Q fragments (A operands) are read from global
        memory once and stay in registers. Per key block the workgroup stages K and V
        (input type, padded rows) between two barriers; S = Q K^T comes out in the
        accumulator layout (thread: rows gid and gid + 8, columns 2 tig and 2 tig + 1 of
        each 8-key tile), where scale, mask and tails are applied per element like the
        SIMT kernel; row maxima and sums are reduced over the 4 threads of a quad with
        xor shuffles. That layout is also the A-operand layout of the next product, so
        P goes from registers straight into P @ V (rounded to the input type, as
        FlashAttention does), with V's B fragments read from workgroup memory."""
        view = ch.view
        bm, bn, threads = plan["block_m"], plan["block_n"], plan["threads"]
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
        elem = spec_of(ch.q.type).elem
        et = ir.Type.parse(elem)
        stages = plan.get("stages", 1)
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, gpu_arg_types(view, target),
                        [workgroup_memref([stages * bn, D + 8], et), workgroup_memref([stages * bn, Dv + 8], et)],
                        (threads, 1, 1), dynamic_shared=plan.get("dynamic_shared", False))
            Ks, Vs = g.shared
            if plan.get("max_registers"):
                g.op.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32),
                                                                     plan["max_registers"])
            n_in = len(view.args)
            out_mem = g.args[n_in]
            pw = Pointwise(g, view, g.args[:n_in])
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

                # Q fragments: for k step t, columns 16t + 2tig (+1) and 16t + 2tig + 8 (+9).
                q_lead = lead(ch.q)
                q_cols = [16 * t + dc for t in range(D // 16) for dc in (0, 1, 8, 9)]
                q_vals = []
                for r in rows:
                    def read_row(r=r):
                        pw.reset()
                        return [scalar_math.convert(pw.eval(ch.q, q_lead + [r, g.add(tig2, c)]), et) for c in q_cols]

                    q_vals.append(g.guarded(g.lt(r, Sq) if Sq % bm or Sq < bm else None, [et] * len(q_cols),
                                            read_row, lambda: [zero_e] * len(q_cols)))
                q_frag = [[tc.pack(q_vals[0][4 * t], q_vals[0][4 * t + 1]), tc.pack(q_vals[1][4 * t], q_vals[1][4 * t + 1]),
                           tc.pack(q_vals[0][4 * t + 2], q_vals[0][4 * t + 3]),
                           tc.pack(q_vals[1][4 * t + 2], q_vals[1][4 * t + 3])] for t in range(D // 16)]
                k_lead, v_lead = lead(ch.kt), lead(ch.v)
                k_direct = direct_source(view, g.args[:n_in], ch.kt, k_lead, True)
                v_direct = direct_source(view, g.args[:n_in], ch.v, v_lead, False)
                s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
                n_o = Dv // 8

                vb = plan.get("vector_bytes", 0)
                k_stage = VectorStaging(g, tid, threads, Ks, bn, D, Sk, D, False, k_direct, vb)
                v_stage = VectorStaging(g, tid, threads, Vs, bn, Dv, Sk, Dv, False, v_direct, vb)
                # Register prefetch: the next block's K and V are loaded before this block's
                # products, so their latency hides behind the tensor cores.
                prefetch = plan.get("prefetch", False) and k_stage.ok and v_stage.ok and stages == 1
                n_pre = len(k_stage.slots) + len(v_stage.slots) if prefetch else 0
                first = k_stage.load(0, 0, True) + v_stage.load(0, 0, True) if prefetch else []

                log2e = g.fconst(math.log2(math.e))

                def exp(x):
                    # e^x as 2^(x log2 e): ex2.approx, one instruction (2 ulp), where
                    # libdevice's expf takes about ten; -inf still gives 0.
                    return mmath.exp2(arith.mulf(x, log2e))

                def key_block(n0, carried, kv_row0=None):
                    """One key block; ``kv_row0``: the block is already staged (the
                    pipeline), at that row of the stacked K and V tiles."""
                    m, l, o = carried[0:2], carried[2:4], carried[4:len(carried) - n_pre]
                    if kv_row0 is None:
                        gpu.barrier()  # the previous block's fragment reads are done
                        if prefetch:
                            staged = carried[len(carried) - n_pre:]
                            k_stage.store(staged[:len(k_stage.slots)])
                            v_stage.store(staged[len(k_stage.slots):])
                        else:
                            stage_tile(g, pw, tid, threads, Ks, bn, D, ch.k_d_contiguous, n0, Sk, 0, D,
                                       lambda r, c: pw.eval(ch.kt, k_lead + [c, r]), direct=k_direct, vector_bytes=vb)
                            stage_tile(g, pw, tid, threads, Vs, bn, Dv, _contiguous_last(view, ch.v), n0, Sk, 0, Dv,
                                       lambda r, c: pw.eval(ch.v, v_lead + [r, c]), direct=v_direct, vector_bytes=vb)
                        gpu.barrier()
                    upcoming = []
                    if prefetch:
                        n1 = g.add(n0, bn)
                        upcoming = k_stage.load(n1, 0, True) + v_stage.load(n1, 0, True)
                    s = []
                    if lt is not None:
                        k_row = lt["b_n"] if kv_row0 is None else arith.addi(lt["b_n"], kv_row0)
                        v_row = lt["bt_k"] if kv_row0 is None else arith.addi(lt["bt_k"], kv_row0)
                    if lt is not None:  # two 8-key tiles' K fragments per ldmatrix.x4
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
                    m_new, l_new, alpha, p = online_softmax(g, pw, ch, s, m, l, rows, tig2, n0, bm, bn, s_lead, exp)
                    o = [arith.mulf(o[4 * n + k], alpha[k // 2]) for n in range(n_o) for k in range(4)]
                    # P for the product: the P chain on the unnormalized p (bf16's cast of the
                    # probabilities: the rounding to et, which the mma needs anyway), in et
                    if ch.p_value != ch.sm.result:
                        p = [[apply_p_chain(pw, ch, p[j][k], s_lead + [rows[k // 2], arith.addi(n0, g.add(
                            tig2, 8 * j + k % 2))]) for k in range(4)] for j in range(bn // 8)]
                    pe = [[scalar_math.convert(v, et) for v in pj] for pj in p]
                    for kk in range(bn // 16):
                        a = [tc.pack(pe[2 * kk][0], pe[2 * kk][1]), tc.pack(pe[2 * kk][2], pe[2 * kk][3]),
                             tc.pack(pe[2 * kk + 1][0], pe[2 * kk + 1][1]), tc.pack(pe[2 * kk + 1][2], pe[2 * kk + 1][3])]
                        if lt is not None:  # V is [key, d]: its B fragments by ldmatrix.trans, two d tiles each
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
                    return m_new + l_new + o + upcoming

                init = [neg_inf, neg_inf, zero, zero] + [zero] * (4 * n_o)
                if ch.mask_cond is not None and not prefetch and plan.get("skip_masked_blocks", False):
                    final = self._skipping_loop(g, pw, ch, key_block, init, rows, tig2, bm, bn, s_lead)
                elif stages > 1:
                    if not (k_stage.copies_async and v_stage.copies_async and lt is not None):
                        raise NotApplicable("the plan's cp.async K/V pipeline needs both tiles staged as 16-byte "
                                            "copies and ldmatrix fragments")
                    final = _pipelined_key_loop(g, Sk, bn, k_stage, v_stage, init, key_block)
                else:
                    final = g.loop(0, Sk, bn, init + first, key_block)
                totals = [quad_reduce(final[2 + h], arith.addf) for h in range(2)]
                o = final[4:4 + 4 * n_o]
                for h in range(2):
                    def store(h=h):
                        for n in range(n_o):
                            for k in (2 * h, 2 * h + 1):
                                col = g.add(tig2, 8 * n + k % 2)
                                idx = list(batch_idx) + [rows[h], col]
                                store_value(apply_epilogue(pw, ch, arith.divf(o[4 * n + k], totals[h]), idx),
                                            out_mem, idx)

                    g.when(g.lt(rows[h], Sq) if Sq % bm or Sq < bm else None, store)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                             {"strategy": "attention", "tensor_cores": "mma.sync.m16n8k16",
                              "workgroup_bytes": plan["shared_bytes"], "block_m": bm, "block_n": bn,
                              "stages": stages})

    @staticmethod
    def _skipping_loop(g: GpuFunc, pw: Pointwise, ch: _Chain, key_block, init: list[ir.Value], rows: list[ir.Value],
                       tig2: ir.Value, bm: int, bn: int, s_lead: list, stage_block=None, start_pass=None,
                       whole_blocks: bool = False, block_class=None, uniform=None) -> list[ir.Value]:
        """The key loop, skipping blocks that the mask masks entirely (a causal mask's
        upper triangle: half the work), exactly.

        Per key block every thread tests its own score positions of the mask and the
        workgroup ORs them (``bar.red.or``); a block with no unmasked score is neither
        staged nor computed. That is exact for every row with an unmasked score
        somewhere, whose running max is then a real score and the skipped terms
        exp(fill - max) are 0 in f32. A row masked everywhere is softmax over equal fills
        in eager torch (uniform weights over all keys), so when one occurs in a block that
        skipped anything, the block runs the loop again without skipping (the outer
        two-pass loop; the second pass happens only then).

        Hooks of a pipelined kernel (the wgmma one): ``start_pass()`` at the start of each
        pass (the first block's copies); ``stage_block(n0)`` at the start of every block,
        skipped or not, returns the pipeline stage the block's K and V are in (having
        staged its mask tile, see ``Pointwise.tiles``, and issued the next block's
        copies), passed on as ``key_block(n0, state, stage)``. With ``whole_blocks`` the
        workgroup also ANDs whether the mask leaves every score of the block alone, and
        ``key_block(..., unmasked=pred)`` may then skip the mask (a causal mask's blocks
        below the diagonal). ``block_class(n0)``, where given, answers (live, whole) for
        the block instead of the test (a table made before the kernel); ``stage_block``
        is then told whether blocks may be skipped at all (``allow``). It may answer
        (live, whole, causal): ``causal`` -- the mask is ``key > query`` over the block --
        goes to ``key_block(..., causal=pred)``. ``uniform``, where given, rewrites the
        condition of the branch around each block (the wgmma kernel: a warp vote of it,
        which ptxas knows to be uniform)."""
        Sq, Sk = ch.seq_q, ch.seq_k
        i1 = ir.IntegerType.get_signless(1)
        true, false = arith.constant(i1, 1), arith.constant(i1, 0)
        types = [v.type for v in init]

        block_or = block_reduce
        uniform = uniform or (lambda p: p)

        def inner(allow: ir.Value):
            def block(n0, carried):
                state, skipped = carried[:-1], carried[-1]
                stage = stage_block(n0, allow) if stage_block is not None else None
                if block_class is not None:
                    live, whole, *causal = block_class(n0)
                    go = arith.ori(live, arith.xori(allow, true))
                    extra = {"stage": stage, **({"unmasked": whole} if whole_blocks else {}),
                             **({"causal": causal[0]} if causal else {})}
                    out = g.guarded(uniform(go), types, lambda: key_block(n0, state, **extra), lambda: state)
                    return out + [arith.ori(skipped, arith.xori(go, true))]
                live, whole = false, true
                for gi in rows:
                    for j in range(bn // 8):
                        for e in range(2):
                            gj = arith.addi(n0, g.add(tig2, 8 * j + e))
                            conds = [c for c in (g.lt(gi, Sq) if Sq % bm or Sq < bm else None,
                                                 g.lt(gj, Sk) if Sk % bn else None) if c is not None]

                            def masked(gi=gi, gj=gj):
                                pw.reset()
                                # the condition at its own (broadcast) index, e.g. a [seq, seq] mask
                                c = pw.eval(ch.mask_cond, pw.operand_index(
                                    spec_of(ch.mask_cond.type).shape, s_lead + [gi, gj], ch.scores.rank))
                                pw.reset()
                                return [c]

                            m = g.guarded(g.all_of(conds), [i1], masked, lambda: [true])[0]
                            live = arith.ori(live, arith.xori(m, true))
                            whole = arith.andi(whole, arith.xori(m, true))
                go = arith.ori(block_or(live), arith.xori(allow, true))
                extra = {} if stage is None else {"stage": stage}
                if whole_blocks:
                    extra["unmasked"] = block_reduce(whole, "and")
                out = g.guarded(uniform(go), types, lambda: key_block(n0, state, **extra), lambda: state)
                return out + [arith.ori(skipped, arith.xori(go, true))]

            return block

        def run_pass(allow):
            if start_pass is not None:
                start_pass()
            out = g.loop(0, Sk, bn, init + [false], inner(allow))
            return out[:-1], out[-1]

        return two_pass_loop(g, ch, init, rows, bm, run_pass)


def two_pass_loop(g: GpuFunc, ch: _Chain, init: list[ir.Value], rows: list[ir.Value], bm: int,
                  run_pass, reduce=block_reduce) -> list[ir.Value]:
    """The skipping loop's outer loop: ``run_pass(allow)`` runs the key blocks once
    (skipping dead ones where ``allow``, an i1, holds) and returns (state, skipped). The
    second pass, with nothing skipped, runs only when the first skipped a block and a
    query row of the workgroup saw masked scores only (its max is the fill): in eager
    torch such a row is softmax over equal fills, uniform over all keys. ``reduce``: the
    OR over the threads that compute (``block_reduce``)."""
    Sq = ch.seq_q
    i1 = ir.IntegerType.get_signless(1)
    true, false = arith.constant(i1, 1), arith.constant(i1, 0)
    types = [v.type for v in init]
    fill_half = g.fconst(ch.mask_fill / 2)

    def attempt(p, carried):
        done = carried[0]

        def run():
            allow = arith.cmpi(arith.CmpIPredicate.eq, p, g.c(0))
            state, skipped = run_pass(allow)
            # a row that saw masked scores only has the fill as its max
            full = false
            for h, gi in enumerate(rows):
                only_masked = arith.cmpf(arith.CmpFPredicate.OLE, state[h], fill_half)
                if Sq % bm or Sq < bm:
                    only_masked = arith.andi(only_masked, g.lt(gi, Sq))
                full = arith.ori(full, only_masked)
            redo = arith.andi(reduce(full), skipped)
            return [arith.xori(redo, true)] + list(state)

        return g.guarded(done, [i1] + types, lambda: list(carried), run)

    return g.loop(0, 2, 1, [false] + init, attempt)[1:]


register(AttentionStrategy())
