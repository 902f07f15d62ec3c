"""The Hopper backward's consumer warpgroups: per step (a block of queries), FlashAttention-3's
backward mainloop for the warpgroup's 64 keys.

- S^T = K Q^T and dP^T = V dO^T (descriptor wgmmas: keys are the M rows, so each thread
  holds a key row's scores for its query columns, and P^T and dS^T come out in the A
  fragment layout of the next products);
- P^T = 2^(S^T c log2 e - lse log2 e) with the stage's logsumexp, dS^T = P^T (dP^T - D);
  under a mask the steps are the query blocks ``walk`` lists, and P^T is 0 where the
  mask masks (``_cut``: nothing in whole blocks, the indices in causal ones, the mask
  itself in the others);
- dV += P^T dO and dK += dS^T Q (register-A wgmmas; dO and Q read MN-major);
- dS^T stored to shared memory as dS (MN-major), both warpgroups' halves behind one named
  barrier, and dQ = dS K (each warpgroup 64 of the head dim, or 64 of the queries at head
  dim 64) added into the workspace's f32 sums with ``red.global.add.v2.f32``.

The stage goes back to the producer once the step's products are done. At the end dK
(times the chain's gradient scale) and dV (plus, under a mask, the share of the rows it
masks everywhere) are stored through the kernel function's epilogues.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm, vector

from ....emit import to_storage
from ....kernel_ir import elem_bytes
from ....nvidia import wgmma as _wg
from ....nvidia.barriers import NamedBarrier, named_sync
from ...hopper.softmax import softmax_exp2, uniform
from .plan import FLAG_ROWS, STAGES
from .preprocess import load_i32
from .walk import CAUSAL_BIT, WHOLE_BIT, has, list_steps, listed, walk

_K = 16  # k of a 16-bit wgmma


def _struct(n: int) -> ir.Type:
    return ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * n) + ")>")


def _values(acc: ir.Value, n: int) -> list[ir.Value]:
    f32 = ir.F32Type.get()
    return [llvm.extractvalue(f32, acc, [i]) for i in range(n)]


def _first(attrs: list) -> list:
    """wgmma attributes with scale-d 0: the product overwrites the accumulator (no zeros
    moved into it first)."""
    return attrs[:4] + [ir.Attribute.parse("#nvvm.wgmma_scale_out<zero>")] + attrs[5:]


def _k_major_offset(t: int, rows: int) -> int:
    """Bytes to the t-th k slice (16 elements) of a K-major swizzled tile of ``rows`` rows."""
    col, within = divmod(t * _K * 2, _wg.SWIZZLE_BYTES)
    return col * rows * _wg.SWIZZLE_BYTES + within


def _mn_major_offset(kk: int) -> int:
    """Bytes to the kk-th k slice (16 k-rows) of an MN-major swizzled tile."""
    return kk * _K * _wg.SWIZZLE_BYTES


class Consumer:
    """The two consumer warpgroups of the backward ``k`` (a HopperBackward)."""

    def __init__(self, k):
        self.k = k

    def run(self) -> None:
        k = self.k
        g, D, bm, bn = k.g, k.D, k.bm, k.bn
        i64 = ir.IntegerType.get_signless(64)
        self.wg = g.div(k.tid, 128)
        lane = g.rem(k.tid, 32)
        self.warp = g.rem(g.div(k.tid, 32), 4)
        self.gid, self.tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
        # the thread's rows of its warpgroup's 64: 16 warp + gid (+ 8)
        self.row = arith.addi(g.mul(self.warp, 16), self.gid)
        k.barriers.wait_q()  # K and V landed

        def c(v):
            return _wg.i64_const(v // 16)

        def at(desc, off):
            return arith.addi(desc, off if not isinstance(off, int) else c(off))

        wg_rows = arith.index_cast(i64, g.mul(self.wg, 64 * _wg.SWIZZLE_BYTES // 16))
        self.k_a = arith.addi(_wg.descriptor(k.Ks, 16), wg_rows)  # this warpgroup's 64 keys
        self.v_a = arith.addi(_wg.descriptor(k.Vs, 16), wg_rows)
        self.q_b, self.do_b = _wg.descriptor(k.Qs, 16), _wg.descriptor(k.dOs, 16)
        self.q_mn = _wg.descriptor(k.Qs, bm * _wg.SWIZZLE_BYTES)
        self.do_mn = _wg.descriptor(k.dOs, bm * _wg.SWIZZLE_BYTES)
        # dQ = dS K: head dim 128 -- the warpgroup's 64 columns (K's atom column wg); head
        # dim 64 -- its 64 queries (dS's atom column wg)
        atom_column = arith.index_cast(i64, g.mul(self.wg, bn * _wg.SWIZZLE_BYTES // 16))
        self.k_mn = _wg.descriptor(k.Ks, bn * _wg.SWIZZLE_BYTES)
        self.ds_a = _wg.descriptor(k.dSs, bn * _wg.SWIZZLE_BYTES)
        if D == 128:
            self.k_mn = arith.addi(self.k_mn, atom_column)
        else:
            self.ds_a = arith.addi(self.ds_a, atom_column)
        for name in ("k_a", "v_a", "q_b", "do_b", "q_mn", "do_mn", "k_mn", "ds_a"):
            setattr(self, "_" + name, getattr(self, name))
        self.at, self.c = at, c
        self.s_t, self.o_t, self.q_t = _struct(bm // 2), _struct(D // 2), _struct(32)
        self.s_attrs = _wg.wgmma_attrs(k.elem, bm, _K, False)
        self.q_attrs = _wg.wgmma_attrs(k.elem, 64, _K, True, a_mn_major=True)
        self.scale = k.g.fconst(k.plan.score_scale * math.log2(math.e))
        zero = llvm.mlir_zero(self.o_t)
        self.masked = k.plan.masked
        if self.masked:
            out = listed(k, k.steps, list_steps(k, k.steps), [zero, zero], self.step)
        else:
            out = walk(k, None, [zero, zero], lambda it, m, c: self.step(it, m, None, c))
        self.store(out[0], out[1])

    # ---- a step

    def step(self, it, m, entry, carried):
        """The it-th step: query block m (under a mask ``entry``: its step list entry)."""
        k = self.k
        g, D, bm, bn = k.g, k.D, k.bm, k.bn
        dk, dv = carried
        m0 = g.mul(m, bm)
        stage = g.rem(it, STAGES)
        q_off = arith.index_cast(ir.IntegerType.get_signless(64), g.mul(stage, k.stage_bytes // 16))
        cut = self._cut(m0, entry) if self.masked else None
        k.barriers.wait_full(it)
        s = self._ss(self._fresh("k_a"), arith.addi(self._fresh("q_b"), q_off), D // _K, bn, bm)
        dp = self._ss(self._fresh("v_a"), arith.addi(self._fresh("do_b"), q_off), D // _K, bn, bm)
        nvvm.wgmma_wait_group_sync_aligned(1)
        p = self._probabilities(_values(s, bm // 2), stage, cut)
        dsum = self._stats(stage, 0)
        nvvm.wgmma_wait_group_sync_aligned(0)
        p_a, ds_a = self._fragments(p, _values(dp, bm // 2), dsum)
        nvvm.wgmma_fence_aligned()
        do_mn = arith.addi(self._fresh("do_mn"), q_off)
        for kk in range(bm // _K):
            dv = _wg.register_a_wgmma(dv, D, k.elem, p_a[kk], self.at(do_mn, _mn_major_offset(kk)))
        nvvm.wgmma_commit_group_sync_aligned()
        self._store_ds(ds_a, stage)
        nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                          space=ir.Attribute.parse("#nvvm.shared_space<cta>"))
        named_sync(NamedBarrier.CONSUMERS, 256)  # both halves of dS are written
        dq = None
        if "dq" in k.roles:
            ds_off = arith.index_cast(ir.IntegerType.get_signless(64), g.mul(stage, k.ds_stage_bytes // 16))
            ds_a_desc = arith.addi(self._fresh("ds_a"), ds_off)
            k_mn = self._fresh("k_mn")
            nvvm.wgmma_fence_aligned()
            dq = llvm.mlir_undef(self.q_t)
            for kk in range(bn // _K):
                dq = nvvm.WgmmaMmaAsyncOp(self.q_t, dq, self.at(ds_a_desc, _mn_major_offset(kk)),
                                          self.at(k_mn, _mn_major_offset(kk)),
                                          *(self.q_attrs if kk else _first(self.q_attrs))).result
            nvvm.wgmma_commit_group_sync_aligned()
        q_mn = arith.addi(self._fresh("q_mn"), q_off)
        for kk in range(bm // _K):
            dk = _wg.register_a_wgmma(dk, D, k.elem, ds_a[kk], self.at(q_mn, _mn_major_offset(kk)))
        nvvm.wgmma_commit_group_sync_aligned()
        if dq is not None:
            nvvm.wgmma_wait_group_sync_aligned(1)  # dV and dQ; dK may be in flight
            self._add_dq(dq, m0)
        nvvm.wgmma_wait_group_sync_aligned(0)
        k.barriers.release(it)
        return [dk, dv]

    def _fresh(self, name: str) -> ir.Value:
        """A base descriptor, opaque (``nvidia.wgmma.opaque``) where it is used: the
        slices' sums are made beside their wgmmas instead of held through the loop."""
        return _wg.opaque(getattr(self, "_" + name))

    def _ss(self, a_desc, b_desc, steps, rows, cols):
        """A descriptor wgmma product (m64 x ``cols``, K-major A and B), committed."""
        k = self.k
        nvvm.wgmma_fence_aligned()
        acc = llvm.mlir_undef(self.s_t)  # the first product does not read it (scale-d 0)
        for t in range(steps):
            attrs = self.s_attrs if t else _first(self.s_attrs)
            acc = nvvm.WgmmaMmaAsyncOp(self.s_t, acc, self.at(a_desc, _k_major_offset(t, rows)),
                                       self.at(b_desc, _k_major_offset(t, k.bm)), *attrs).result
        nvvm.wgmma_commit_group_sync_aligned()
        return acc

    def _stats(self, stage, kind: int):
        """The thread's query columns' (8i + 2 tig + e) log2 logsumexp (``kind`` 1) or D
        (0), from the stage's statistics in shared memory: a function of an accumulator
        value's index that loads the column pair where it is first asked for (loaded all
        at once, 32 a thread at head dim 64, they spilled)."""
        k = self.k
        g = k.g
        pair = ir.VectorType.get([2], ir.F32Type.get())
        row = arith.addi(g.mul(stage, 2), g.c(kind))
        loaded: dict = {}

        def value(v: int) -> ir.Value:
            i = v // 4
            if i not in loaded:
                x = vector.load(pair, k.stats, [row, g.add(self.tig2, 8 * i)], alignment=8)
                loaded[i] = [vector.ExtractOp(x, [], [e]).result for e in range(2)]
            return loaded[i][v % 2]

        return value

    def _cut(self, m0, entry) -> list[ir.Value]:
        """Which of the thread's accumulator values of the query block at m0 the mask masks (or
        lie past the keys or queries), as i32 words (bit i % 32 of word i / 32), by the
        block's class (``walk``): whole blocks none, causal ones from the indices, the
        others read from the mask. Made before the step's products, whose accumulators
        are not live yet: the mask's loads then cost no registers of theirs."""
        k = self.k
        g, ch = k.g, k.ch
        i1, i32 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
        n = k.bm // 2
        words = -(-n // 32)
        # the thread's first key, opaque: what is made from it (clamped keys, their bounds)
        # is loop-invariant, and held through the walk it would spill the consumers'
        idx, i64 = ir.IndexType.get(), ir.IntegerType.get_signless(64)
        key0 = arith.index_cast(idx, _wg.opaque(arith.index_cast(i64, arith.addi(
            k.n0, arith.addi(g.mul(self.wg, 64), self.row)))))
        q0 = arith.addi(m0, self.tig2)

        def coords(i):  # accumulator value i: key row + 8 h, query column 8 (i / 4) + i % 2
            return g.add(key0, 8 * ((i // 2) % 2)), g.add(q0, 8 * (i // 4) + i % 2)

        def pack(pred):
            out = []
            for w in range(words):
                word = arith.constant(i32, 0)
                for i in range(32 * w, min(n, 32 * w + 32)):
                    bit_i = arith.shli(arith.extui(i32, pred(i)), arith.constant(i32, i % 32))
                    word = arith.ori(word, bit_i)
                out.append(word)
            return out

        def causal():
            return pack(lambda i: arith.cmpi(arith.CmpIPredicate.ugt, *coords(i)))

        def partial():
            pw = k.pw
            spec = spec_of(ch.mask_cond.type)
            lead = [g.c(0)] * (ch.scores.rank - 2)

            def cut(i):
                key, q = coords(i)
                inside = arith.andi(g.lt(key, ch.seq_k), g.lt(q, ch.seq_q))
                qc, kc = arith.minui(q, g.c(ch.seq_q - 1)), arith.minui(key, g.c(ch.seq_k - 1))
                pw.reset()
                cond = pw.eval(ch.mask_cond, pw.operand_index(spec.shape, lead + [qc, kc], ch.scores.rank))
                pw.reset()
                return arith.ori(cond, arith.xori(inside, arith.constant(i1, 1)))
            return pack(cut)

        def masked():
            return g.guarded(uniform(has(entry, CAUSAL_BIT)), [i32] * words, causal, partial)

        return g.guarded(uniform(has(entry, WHOLE_BIT)), [i32] * words, lambda: [arith.constant(i32, 0)] * words,
                         masked)

    @staticmethod
    def _is_cut(cut: list, i: int) -> ir.Value:
        """Bit i of ``_cut``'s words."""
        i32 = ir.IntegerType.get_signless(32)
        word = arith.andi(cut[i // 32], arith.constant(i32, 1 << (i % 32) if i % 32 < 31 else -(1 << 31)))
        return arith.cmpi(arith.CmpIPredicate.ne, word, arith.constant(i32, 0))

    def _probabilities(self, s: list, stage, cut: list | None) -> list:
        """P^T of the step from its scores (the thread's accumulator values) and the rows'
        log2 logsumexp; 0 where the mask masks it (``cut``: ``_cut``'s words), also in a
        row it masks everywhere (whose P the preprocess gives dV: ``walk``)."""
        lse = self._stats(stage, 1)
        out = []
        for i, v in enumerate(s):
            p = softmax_exp2(arith.subf(arith.mulf(v, self.scale), lse(i)))
            if cut is not None:
                p = arith.select(self._is_cut(cut, i), self.k.g.fconst(0.0), p)
            out.append(p)
        return out

    def _fragments(self, p: list, dp: list, dsum) -> tuple[list, list]:
        """The A fragments (per k slice of 16 queries, 4 x b32 of a register-A wgmma, rounded
        to the input type) of P^T and of dS^T = P^T (dP^T - D), from values in the
        accumulator layout: each pair of dS made and both pairs packed at once, so that P
        and dP die as they go (head dim 64: 64 of each a thread)."""
        pf, df = [], []
        for kk in range(len(p) // 8):
            pk, dk = [], []
            for i in (2 * kk, 2 * kk + 1):
                for h in range(2):
                    at = [4 * i + 2 * h, 4 * i + 2 * h + 1]
                    ds = [arith.mulf(p[v], arith.subf(dp[v], dsum(v))) for v in at]
                    pk.append(self._pack(p[at[0]], p[at[1]]))
                    dk.append(self._pack(*ds))
            pf.append(pk)
            df.append(dk)
        return pf, df

    def _pack(self, x, y):
        k = self.k
        r = k.tc.pack(scalar_math.convert(x, k.et), scalar_math.convert(y, k.et))
        return r if k.elem != "f16" else llvm.bitcast(ir.IntegerType.get_signless(32), r)

    def _store_ds(self, frags, stage):
        """dS^T (the thread's A fragments) into the stage's dS tile: MN-major for dQ's A,
        element (key, query) at row (query / 64) x 128 + key, 16-byte chunk
        (query % 64) / 8 ^ key % 8. A thread's pairs are neighbouring queries: one 32-bit
        store each, a warp's 32 on distinct banks."""
        k = self.k
        g, bn = k.g, k.bn
        key0 = arith.addi(g.mul(self.wg, 64), self.row)
        for kk, frag in enumerate(frags):
            for half in range(2):  # queries 16 kk + 8 half + 2 tig
                for h in range(2):  # keys row, row + 8
                    q = g.add(self.tig2, 16 * kk + 8 * half)
                    key = g.add(key0, 8 * h)
                    r = arith.addi(g.mul(stage, k.bm * bn // 64), arith.addi(g.mul(g.div(q, 64), bn), key))
                    chunk = arith.xori(g.div(g.rem(q, 64), 8), g.rem(key, 8))
                    col = arith.addi(g.mul(chunk, 8), g.rem(q, 8))
                    pair = llvm.bitcast(ir.VectorType.get([2], k.et), frag[2 * half + h])
                    vector.store(pair, k.dSs, [r, col], alignment=4)

    def _add_dq(self, dq, m0):
        """The warpgroup's dQ (m64 x 64) added into the workspace's sums."""
        k = self.k
        g, D = k.g, k.D
        vals = _values(dq, 32)
        if D == 128:  # rows: the step's 64 queries; columns 64 wg ..
            q0, c0 = m0, g.mul(self.wg, 64)
        else:  # rows: queries 64 wg .. of the step; all 64 columns
            q0, c0 = arith.addi(m0, g.mul(self.wg, 64)), g.c(0)
        layout = k.plan.layout
        for i in range(8):
            for h in range(2):
                q = arith.addi(q0, g.add(self.row, 8 * h))
                col = arith.addi(c0, g.add(self.tig2, 8 * i))
                at = arith.addi(g.mul(k.row_of(q), D), col)
                _wg.red_add_f32x2(k.ws_address(g.add(at, layout.dq_at)), vals[4 * i + 2 * h], vals[4 * i + 2 * h + 1])

    # ---- the end

    def _add_dead_dv(self, vals: list) -> list:
        """dV plus the share of the rows the mask masks everywhere (``walk``): the
        preprocess's sums of the batch element's flagged row groups, at the thread's
        columns (8 i + 2 tig + e), the same for both its key rows."""
        k = self.k
        g, D, plan = k.g, k.D, k.plan
        layout = plan.layout
        f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
        slots = plan.seq_q_padded // FLAG_ROWS
        cols = [g.add(self.tig2, 8 * i + e) for i in range(D // 8) for e in range(2)]

        def slot(b, sums):
            at = arith.addi(g.mul(k.bh, slots), b)
            flag = load_i32(k.ws, arith.addi(at, g.c(layout.dead_at)))

            def add():
                base = arith.addi(g.mul(at, D), g.c(layout.dead_dv_at))
                return [arith.addf(x, memref.load(k.ws, [arith.addi(base, c)])) for x, c in zip(sums, cols)]

            dead = arith.cmpi(arith.CmpIPredicate.ne, flag, arith.constant(i32, 0))
            return g.guarded(uniform(dead), [f32] * len(cols), add, lambda: sums)

        sums = g.loop(0, slots, 1, [g.fconst(0.0)] * len(cols), slot)
        # value 4 i + 2 h + e is column 8 i + 2 tig + e
        return [arith.addf(v, sums[2 * (n // 4) + n % 2]) for n, v in enumerate(vals)]


    def store(self, dk, dv):
        """dK (times the gradient scale) and dV of the warpgroup's keys, through the
        kernel function's epilogues (one 2-element store a pair of columns)."""
        k = self.k
        g, ch, pw = k.g, k.ch, k.pw
        D = k.D
        for role, acc, scale in (("dk", dk, k.plan.grad_scale), ("dv", dv, 1.0)):
            if role not in ch.products:
                continue
            prod = ch.products[role]
            n = prod.result
            out = k.out_mem[n]
            result = ch.view.results[n]
            spec = ch.view.result_specs[n]
            lead = pw.operand_index(spec.shape[:-2], k.batch_idx, len(ch.batch))
            out_elem = ir.MemRefType(out.type).element_type
            pair_t = ir.VectorType.get([2], out_elem)
            vals = _values(acc, D // 2)
            if role == "dv" and self.masked:
                vals = self._add_dead_dv(vals)
            for h in range(2):
                key = arith.addi(k.n0, arith.addi(g.mul(self.wg, 64), g.add(self.row, 8 * h)))

                def write(key=key, h=h):
                    for i in range(D // 8):
                        pair = []
                        for e in range(2):
                            v = vals[4 * i + 2 * h + e]
                            if scale != 1.0:
                                v = arith.mulf(v, g.fconst(scale))
                            pw.reset()
                            pw.bind(prod.mm.result, v)
                            pair.append(to_storage(pw.eval(result, lead + [key, g.add(self.tig2, 8 * i + e)]),
                                                   out_elem))
                        pw.reset()
                        vector.store(vector.from_elements(pair_t, pair), out, lead + [key, g.add(self.tig2, 8 * i)],
                                     alignment=2 * elem_bytes(out_elem))

                g.when(g.lt(key, ch.seq_k) if ch.seq_k % k.bn else None, write)
