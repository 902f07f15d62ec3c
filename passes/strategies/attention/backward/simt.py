"""The SIMT attention backward: Vulkan, Metal, and CUDA where no tensor-core kernel
applies. No atomics and no tensor cores, so it runs on every device kf targets.

One launch, two kinds of workgroup (FlashAttention-2's scheme without atomics: dQ in
a pass of its own):

- *dK/dV workgroups* (grid x below the key blocks): a block of ``block`` keys, each key
  row owned by ``lanes_per_row`` lanes. K and V of the block are staged once; the loop
  walks the query blocks, staging Q and dO, and a lane computes, for the queries
  ``l, l + lanes, ...`` of the block, S and dP (dot products over the head dims), P from
  the row's logsumexp and dS from D (both from the preprocess's workspace), writes P
  and dS to workgroup memory, and after a barrier adds its key's dV += P dO and
  dK += dS Q for its columns ``l, l + lanes, ...``.
- *dQ workgroups* (the rest): a block of query rows; Q and dO are staged once, the loop
  walks the key blocks (staging K and V), a lane computes S, dP and dS for its keys and
  after a barrier dQ += dS K for its columns.

The chain between the products (scale, mask, casts, the softmax backward) is evaluated
per element by ``Pointwise`` (``BackwardChain``), so any chain kf-fuse recognizes runs
here. Tails: rows past the sequences compute on zeros and are not stored; their P and
dS are 0. Statistics and accumulators are f32.

At run-time sequence lengths (run_time.py) the grid's x is the run-time number of key
blocks and query blocks, the loops over the other sequence run to its run-time length,
and the buffers after the heads are flat.

Not handled: a plan needs ``block`` rows whose tiles fit workgroup memory (4 rows of
head dim 256 take 33 KB).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from ...base import EmittedKernel, NotApplicable, TargetInfo
from ... import run_time_sizes
from ...run_time_sizes import ragged
from ...kernel_ir import (GpuFunc, Pointwise, contiguous_last, direct_source, gpu_arg_types, linearize, stage_tile,
                          staging_vector_bytes, store_value, workgroup_memref)
from . import run_time
from .chain import BackwardChain
from .preprocess import emit_preprocess, workspace_type

#: Per-thread accumulators (dK and dV columns) the planner prefers at most; head dims
#: that no lane split divides take more.
MAX_ACCUMULATORS = 64


@dataclass(frozen=True)
class SimtPlan:
    """The SIMT backward's shape (recorded in ``kf.plan``)."""

    block: int
    threads: int
    lanes_per_row: int
    grid: list
    shared_bytes: int
    key_blocks: int
    query_blocks: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    batch: list
    vector_bytes: int
    kernel: str = "simt"

    @staticmethod
    def from_dict(plan: dict) -> "SimtPlan":
        names = {f.name for f in dataclasses.fields(SimtPlan)}
        return SimtPlan(**{k: v for k, v in plan.items() if k in names})


def _shared_bytes(b: int, d: int, dv: int) -> int:
    return 4 * (2 * b * (d + 1) + 2 * b * (dv + 1) + 2 * b * (b + 1))


def plan(ch: BackwardChain, target: TargetInfo) -> dict:
    """The largest block (rows of keys and of queries) and thread count whose tiles fit
    workgroup memory, lanes a row dividing the head dims and the block."""
    d, dv = ch.head_dim, ch.head_dim_v
    threads_cap = min(128, target.max_threads)
    longest = max(ch.seq_q, ch.seq_k)
    best = None
    for b in (32, 16, 8, 4, 2, 1):
        if b > max(4, 1 << max(0, (longest - 1).bit_length())):
            continue
        for tpr in (32, 16, 8, 4, 2, 1):
            if b * tpr > threads_cap or d % tpr or dv % tpr or b % tpr:
                continue
            shared = _shared_bytes(b, d, dv)
            if shared > target.max_shared_bytes:
                continue
            acc = (d + dv) // tpr
            key = (acc <= MAX_ACCUMULATORS, b * tpr, b)
            if best is None or key > best[0]:
                best = (key, b, tpr, shared)
    if best is None:
        raise NotApplicable(f"no attention backward tiling of head dims {d}/{dv} fits {target.max_shared_bytes} "
                            "bytes of workgroup memory")
    _, b, tpr, shared = best
    batch = math.prod(ch.batch)
    if batch > 65535:
        raise NotApplicable(f"{batch} batch elements exceed the grid's y limit")
    kb = -(-ch.seq_k // b) if ("dk" in ch.products or "dv" in ch.products) else 0
    qb = -(-ch.seq_q // b) if "dq" in ch.products else 0
    return dataclasses.asdict(SimtPlan(
        block=b, threads=b * tpr, lanes_per_row=tpr, grid=[kb + qb, batch, 1], shared_bytes=shared, key_blocks=kb,
        query_blocks=qb, seq_q=ch.seq_q, seq_k=ch.seq_k, head_dim=d, head_dim_v=dv, batch=list(ch.batch),
        vector_bytes=staging_vector_bytes(target)))


class SimtBackward:
    """The SIMT backward kernel of a plan for a ``BackwardChain``."""

    def __init__(self, ch: BackwardChain, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation,
                 target: TargetInfo):
        self.ch, self.kernel, self.gpu_module, self.target = ch, kernel, gpu_module, target
        self.plan = p = SimtPlan.from_dict(plan)
        if (ch.seq_q, ch.seq_k, ch.head_dim, ch.head_dim_v) != (p.seq_q, p.seq_k, p.head_dim, p.head_dim_v):
            raise NotApplicable("the plan was made for another kernel")
        self.view = ch.view
        self.b, self.tpr = p.block, p.lanes_per_row
        #: run-time sizes: the kernel function's slots (run_time.py)
        self.slots = [tuple(x) for x in plan.get("sizes", [])]

    def emit(self) -> EmittedKernel:
        ch, view, b = self.ch, self.view, self.b
        D, Dv = ch.head_dim, ch.head_dim_v
        slots = self.slots
        with self.kernel.location:
            prelude = emit_preprocess(ch, self.gpu_module, self.target, self.kernel, slots)
            ws_t = workspace_type(ch)
            n_in = len(view.args)
            arg_types = gpu_arg_types(view, self.target)
            arg_types = arg_types[:n_in] + [ir.MemRefType.get(ws_t.shape, ws_t.element_type)] + arg_types[n_in:]
            arg_types = run_time.declare_flat(arg_types, view, slots, shift_results=1)
            if slots:
                arg_types.append(run_time_sizes.slot_type(len(slots)))
            shared = [workgroup_memref([b, D + 1]), workgroup_memref([b, Dv + 1]), workgroup_memref([b, D + 1]),
                      workgroup_memref([b, Dv + 1]), workgroup_memref([b, b + 1]), workgroup_memref([b, b + 1])]
            self.g = g = GpuFunc(self.gpu_module, view.name, arg_types, shared, (self.plan.threads, 1, 1))
            self.Ks, self.Vs, self.Qs, self.Os, self.Ps, self.Ss = g.shared
            self.ws = g.args[n_in]
            self.outs = g.args[n_in + 1:n_in + 1 + len(view.results)]
            self.pw = Pointwise(g, view, g.args[:n_in])
            grid_sizes = ()
            with ir.InsertionPoint(g.entry):
                self.seq_q, self.seq_k, self.key_share, self.flat = ch.seq_q, ch.seq_k, None, {}
                if slots:
                    lengths = run_time.Lengths(g, self.kernel, ch, slots)
                    self.seq_q, self.seq_k, self.key_share = lengths.seq_q, lengths.seq_k, lengths.key_share
                    self.flat = lengths.flat
                    self.pw.flat = lengths.flat_inputs()
                    parts = []
                    if self.plan.key_blocks:
                        parts.append(lengths.blocks_text(lengths.k_slot, self.seq_k, 1, b))
                    if self.plan.query_blocks:
                        parts.append(lengths.blocks_text(lengths.q_slot, self.seq_q, 1, b))
                    grid_sizes = (" + ".join(parts), str(self.plan.grid[1]), "1")
                self.key_blocks = run_time.ceil_div(g, self.seq_k, b) if self.plan.key_blocks else 0
                self.pw.hoist_scalars()
                self._place()
                kb = self.plan.key_blocks
                if kb and self.plan.query_blocks:
                    first = g.lt(self.block_x, self.key_blocks)
                    g.when(first, self._dkdv)
                    g.when(arith.xori(first, arith.constant(first.type, 1)), self._dq)
                elif kb:
                    self._dkdv()
                else:
                    self._dq()
            g.finish()
        return EmittedKernel(view.name, tuple(self.plan.grid), (self.plan.threads, 1, 1), 0,
                             {"strategy": "attention backward", "kernel": "simt", "block": b,
                              "lanes_per_row": self.tpr, "workgroup_bytes": self.plan.shared_bytes},
                             prelude=prelude, prelude_output=ws_t, sizes=run_time_sizes.launch_slots(slots, n_in, 1),
                             grid_sizes=grid_sizes)

    # ---- the thread's place

    def _place(self) -> None:
        g, ch = self.g, self.ch
        tid = g.tid()
        self.tid = tid
        self.block_x = g.bid("x")
        self.batch_lin = g.bid("y")
        self.batch_idx = g.delinearize(self.batch_lin, ch.batch) if ch.batch else []
        self.row, self.lane = g.div(tid, self.tpr), g.rem(tid, self.tpr)
        nb = len(ch.batch)
        pw = self.pw

        def lead(v):
            return pw.operand_index(spec_of(v.type).shape[:-2], self.batch_idx, nb)

        self.q_lead, self.k_lead, self.do_lead, self.v_lead = lead(ch.q), lead(ch.kt), lead(ch.do), lead(ch.vt)
        memrefs = self.g.args[:len(self.view.args)]
        flat = pw.flat
        self.q_direct = direct_source(self.view, memrefs, ch.q, self.q_lead, False, flat)
        self.k_direct = direct_source(self.view, memrefs, ch.kt, self.k_lead, True, flat)
        self.do_direct = direct_source(self.view, memrefs, ch.do, self.do_lead, False, flat)
        self.v_direct = direct_source(self.view, memrefs, ch.vt, self.v_lead, True, flat)

    def _stage(self, tile, cols, row0, n_rows, read, direct, fast_is_col):
        stage_tile(self.g, self.pw, self.tid, self.plan.threads, tile, self.b, cols, fast_is_col, row0, n_rows, 0,
                   cols, read, direct=direct, vector_bytes=self.plan.vector_bytes)

    def _stage_q(self, i0):
        ch, pw = self.ch, self.pw
        self._stage(self.Qs, ch.head_dim, i0, self.seq_q, lambda r, c: pw.eval(ch.q, self.q_lead + [r, c]),
                    self.q_direct, contiguous_last(self.view, ch.q))
        self._stage(self.Os, ch.head_dim_v, i0, self.seq_q, lambda r, c: pw.eval(ch.do, self.do_lead + [r, c]),
                    self.do_direct, contiguous_last(self.view, ch.do))

    def _stage_k(self, j0):
        ch, pw = self.ch, self.pw
        self._stage(self.Ks, ch.head_dim, j0, self.seq_k, lambda r, c: pw.eval(ch.kt, self.k_lead + [c, r]),
                    self.k_direct, not contiguous_last(self.view, ch.kt))
        self._stage(self.Vs, ch.head_dim_v, j0, self.seq_k, lambda r, c: pw.eval(ch.vt, self.v_lead + [c, r]),
                    self.v_direct, not contiguous_last(self.view, ch.vt))

    def _dot(self, a, ra, b_, rb, n):
        """sum over d < n of a[ra][d] * b_[rb][d] (workgroup tiles), unrolled: lavapipe
        ends an invocation after 65535 loop iterations, which a loop over the head dim
        for every score would pass at a few hundred queries."""
        g = self.g
        acc = g.fconst(0.0)
        for d in range(n):
            acc = mmath.fma(memref.load(a, [ra, g.c(d)]), memref.load(b_, [rb, g.c(d)]), acc)
        return acc

    def _row_stats(self, r: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(D, logsumexp) of global query row r (< Sq), from the workspace."""
        g = self.g
        at = arith.addi(run_time.mul(self.batch_lin, self.seq_q), r)
        return memref.load(self.ws, [g.c(0), at]), memref.load(self.ws, [g.c(1), at])

    def _element(self, i, j, s, dp, d_row, lse, values):
        """The chain's values ``values`` (Products' regions) at query i, key j."""
        ch, pw, g = self.ch, self.pw, self.g
        f32 = g.f32
        rank = ch.scores.rank
        pw.reset()
        ch.bind(pw, s, dp, d_row)
        x_idx = pw.operand_index(spec_of(ch.x.type).shape, self.batch_idx + [i, j], rank)
        ch.probability(pw, x_idx, lse, self.key_share)
        out = [scalar_math.convert(pw.eval(p.region, p.region_index(pw, self.batch_idx, rank, i, j)), f32)
               for p in values]
        pw.reset()
        return out

    def _store(self, prod, row, accs, cols):
        """Store a product's accumulators (columns ``cols``) of output row ``row``
        through the kernel result's epilogue."""
        ch, g, pw = self.ch, self.g, self.pw
        n = prod.result
        spec = ch.view.result_specs[n]
        lead = pw.operand_index(spec.shape[:-2], self.batch_idx, len(ch.batch))
        result = ch.view.results[n]
        strides = self.flat.get(len(ch.view.args) + n)
        for acc, c in zip(accs, cols):
            pw.reset()
            pw.bind(prod.mm.result, acc)
            idx = lead + [row, c]
            store_value(pw.eval(result, idx), self.outs[n], idx if strides is None else [linearize(g, idx, strides)])
        pw.reset()

    # ---- the two kinds of workgroup

    def _dkdv(self) -> None:
        """A key block: dK and dV of its keys over every query block."""
        ch, g, b, tpr = self.ch, self.g, self.b, self.tpr
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, self.seq_q, self.seq_k
        prods = [ch.products[r] for r in ("dv", "dk") if r in ch.products]
        j0 = g.mul(self.block_x, b)
        j = arith.addi(j0, self.row)
        self._stage_k(j0)
        n_q = b // tpr
        cols = {"dv": [g.add(self.lane, tpr * u) for u in range(Dv // tpr)],
                "dk": [g.add(self.lane, tpr * u) for u in range(D // tpr)]}
        init = [g.fconst(0.0)] * sum(len(cols[p.role]) for p in prods)
        zero = g.fconst(0.0)

        def query_block(i0, accs):
            gpu.barrier()  # the previous block's readers of Q, dO, P and dS are done
            self._stage_q(i0)
            gpu.barrier()
            def score(c, _):
                q = arith.addi(self.lane, g.mul(c, tpr))
                i = arith.addi(i0, q)

                def real():
                    s = self._dot(self.Ks, self.row, self.Qs, q, D)
                    dp = self._dot(self.Vs, self.row, self.Os, q, Dv)
                    d_row, lse = self._row_stats(i)
                    return self._element(i, j, s, dp, d_row, lse, prods)

                inside = g.all_of([x for x in (g.lt(i, Sq) if ragged(Sq, b) else None,
                                               g.lt(j, Sk) if ragged(Sk, b) else None) if x is not None])
                vals = g.guarded(inside, [g.f32] * len(prods), real, lambda: [zero] * len(prods))
                for prod, v in zip(prods, vals):
                    memref.store(v, self.Ps if prod.role == "dv" else self.Ss, [self.row, q])
                return []

            g.loop(0, n_q, 1, [], score)
            gpu.barrier()
            out, at = [], 0
            for prod in prods:
                tile, data = (self.Ps, self.Os) if prod.role == "dv" else (self.Ss, self.Qs)
                n = len(cols[prod.role])

                def acc_step(qq, acc, tile=tile, data=data, role=prod.role):
                    p = memref.load(tile, [self.row, qq])
                    return [mmath.fma(p, memref.load(data, [qq, c]), a) for a, c in zip(acc, cols[role])]

                out += g.loop(0, b, 1, accs[at:at + n], acc_step)
                at += n
            return out

        accs = g.loop(0, Sq, b, init, query_block)

        def store():
            at = 0
            for prod in prods:
                n = len(cols[prod.role])
                self._store(prod, j, accs[at:at + n], cols[prod.role])
                at += n

        g.when(g.lt(j, Sk) if ragged(Sk, b) else None, store)

    def _dq(self) -> None:
        """A query block: dQ of its rows over every key block."""
        ch, g, b, tpr = self.ch, self.g, self.b, self.tpr
        D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, self.seq_q, self.seq_k
        prod = ch.products["dq"]
        kb = self.key_blocks
        qb = arith.subi(self.block_x, g.c(kb) if isinstance(kb, int) else kb)
        i0 = g.mul(qb, b)
        i = arith.addi(i0, self.row)
        self._stage_q(i0)
        in_q = g.lt(i, Sq) if ragged(Sq, b) else None
        zero = g.fconst(0.0)
        d_row, lse = g.guarded(in_q, [g.f32, g.f32], lambda: list(self._row_stats(i)), lambda: [zero, zero])
        cols = [g.add(self.lane, tpr * u) for u in range(D // tpr)]

        def key_block(j0, accs):
            gpu.barrier()  # the previous block's readers of K, V and dS are done
            self._stage_k(j0)
            gpu.barrier()
            def score(c, _):
                kk = arith.addi(self.lane, g.mul(c, tpr))
                j = arith.addi(j0, kk)

                def real():
                    s = self._dot(self.Qs, self.row, self.Ks, kk, D)
                    dp = self._dot(self.Os, self.row, self.Vs, kk, Dv)
                    return self._element(i, j, s, dp, d_row, lse, [prod])

                inside = g.all_of([x for x in (in_q, g.lt(j, Sk) if ragged(Sk, b) else None) if x is not None])
                v = g.guarded(inside, [g.f32], real, lambda: [zero])[0]
                memref.store(v, self.Ss, [self.row, kk])
                return []

            g.loop(0, b // tpr, 1, [], score)
            gpu.barrier()

            def acc_step(jj, acc):
                p = memref.load(self.Ss, [self.row, jj])
                return [mmath.fma(p, memref.load(self.Ks, [jj, c]), a) for a, c in zip(acc, cols)]

            return g.loop(0, b, 1, accs, acc_step)

        accs = g.loop(0, Sk, b, [zero] * len(cols), key_block)
        g.when(in_q, lambda: self._store(prod, i, accs, cols))
