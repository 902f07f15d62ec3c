"""Strategies for the kernels kf-recognize-moe makes: ``moe_route``, ``moe_gemm`` and
``moe_combine`` (passes/recognize_moe.py says what each computes; its kernel functions'
bodies are the reference in kf ops, and their ``kf.moe`` attribute names the sizes and
options these strategies read).

- ``moe_route``: one workgroup does a stable counting sort of the N = T*K (token, slot)
  pairs by expert, so the result is deterministic without atomics. Thread i owns the
  contiguous slots [i*C, (i+1)*C). For each bucket b (experts 0..E-1, then E for
  out-of-range indices) every thread counts its slots of b, a Hillis-Steele scan over
  the threads' counts in workgroup memory gives each thread its first row in the
  bucket, and the thread writes ``slot_row`` / ``row_token`` for its slots in slot order.
  E+1 buckets cost (E+1) * (2C loads + log2(threads) barriers): microseconds at the
  benchmark's 16k slots, against GEMMs of milliseconds.
- ``moe_gemm``: a grouped GEMM. Workgroup (x, y) takes column tile x of row tile y of
  the concatenation of the buckets' row ranges, each bucket's range cut into BLOCK_M
  tiles of its own (so a tile never mixes experts): y is found by a scan over the
  E+1 offsets, and workgroups past the last tile return. The grid's y extent is the
  static bound ceil(N / BLOCK_M) + E + 1 on the number of such tiles. The K loop is the
  SIMT matmul strategy's (f32 accumulators in a THREAD_M x THREAD_N register tile, A and
  B staged through workgroup memory with ``stage_tile``): the B tile is read from the
  expert's slice of the stacked weights, and for the first projection the A tile's rows
  are read from x through ``row_token`` while it is staged (the gather costs one
  index load per element, no copy of x). The epilogue applies the GELU, rounds once and
  stores the rows of the tile's bucket only. Bucket E rows (out-of-range indices) are
  computed with the last expert's weights, as the reference body says, and never read.
- ``moe_combine``: one thread per output element sums its token's K slots in f32:
  ``w[t,j] * y[slot_row[t*K+j], n]`` for the slots whose index is in range.

Not done: tensor cores (the matmul strategy's mma.sync path) for f16/bf16 on CUDA, and
fusing the combine into the second GEMM's epilogue (it would need atomics or a
second pass to stay deterministic).
"""

from __future__ import annotations

import math

from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from . import emit as E
from .base import EmittedKernel, Strategy, TargetInfo, register
from .matmul import Direct, GpuFunc, KernelView, MatmulStrategy, stage_tile, store_value, workgroup_memref


def moe_attrs(kernel: ir.Operation) -> dict:
    """The kf.moe attribute of a kernel function as a Python dict."""
    d = ir.DictAttr(kernel.attributes["kf.moe"])
    out = {}
    for i in range(len(d)):
        a = d[i].attr
        if isinstance(a, ir.BoolAttr):
            out[d[i].name] = bool(a.value)
        elif isinstance(a, ir.IntegerAttr):
            out[d[i].name] = int(a.value)
        else:
            out[d[i].name] = ir.StringAttr(a).value
    return out


def _arg_types(view: KernelView, target: TargetInfo) -> list[ir.Type]:
    return [E.memref_type(s, target.name) for s in [*view.arg_specs, *view.result_specs]]


class _NoMemo:
    """stage_tile resets a Pointwise's memo before each element; these reads keep none."""

    def reset(self) -> None:
        pass


def _idx(v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), v)


def _i32(g: GpuFunc, v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IntegerType.get_signless(32), v)


def _routed_expert(g: GpuFunc, idx_mem: ir.Value, lead_shape, t: ir.Value, j: int | ir.Value,
                   n_experts: int) -> tuple[ir.Value, ir.Value]:
    """(valid, expert as index: E when invalid) of slot j of token t."""
    tix = g.delinearize(t, lead_shape) if lead_shape else []
    v = memref.load(idx_mem, tix + [g.c(j) if isinstance(j, int) else j])
    it = v.type
    lo = arith.cmpi(arith.CmpIPredicate.sge, v, scalar_math.const(it, 0))
    hi = arith.cmpi(arith.CmpIPredicate.slt, v, scalar_math.const(it, n_experts))
    valid = arith.andi(lo, hi)
    return valid, arith.select(valid, _idx(v), g.c(n_experts))


# --------------------------------------------------------------------------- routing


class MoeRouteStrategy(Strategy):
    KIND = "moe_route"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """One workgroup: 1024 threads on CUDA, 256 on SPIR-V, fewer for few slots."""
        info = moe_attrs(kernel)
        n = info["rows"]
        threads = min(1024 if target.name == "cuda" else target.max_threads, max(32, 1 << (n - 1).bit_length()))
        return {"threads": threads, "chunk": -(-n // threads), "grid": [1, 1, 1], "rows": n,
                "experts": info["experts"], "shared_bytes": 4 * threads}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        threads, C = plan["threads"], plan["chunk"]
        N, K, n_exp = info["rows"], info["top_k"], info["experts"]
        lead = view.arg_specs[0].shape[:-1]
        i32 = ir.IntegerType.get_signless(32)
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target), [workgroup_memref([threads], i32)],
                        (threads, 1, 1))
            idx, offsets, row_token, slot_row = g.args
            buf = g.shared[0]
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                first = g.mul(tid, C)
                zero32 = arith.constant(i32, 0)
                false = arith.constant(ir.IntegerType.get_signless(1), 0)

                def is_in(s: ir.Value, b: ir.Value) -> ir.Value:
                    """slot s (< N) is routed to bucket b."""
                    _, key = _routed_expert(g, idx, lead, g.div(s, K), g.rem(s, K), n_exp)
                    return arith.cmpi(arith.CmpIPredicate.eq, key, b)

                def in_range(s: ir.Value):
                    return g.lt(s, N) if threads * C != N else None

                def bucket(b: ir.Value, carried):
                    (base,) = carried

                    def count(i, acc):
                        s = arith.addi(first, i)
                        hit = g.guarded(in_range(s), [ir.IndexType.get()],
                                        lambda: [arith.select(is_in(s, b), g.c(1), g.c(0))], lambda: [g.c(0)])[0]
                        return [arith.addi(acc[0], hit)]

                    (cnt,) = g.loop(0, C, 1, [g.c(0)], count)
                    gpu.barrier()  # the previous bucket's reads of buf are done
                    memref.store(_i32(g, cnt), buf, [tid])
                    off = 1
                    while off < threads:  # inclusive scan of the threads' counts
                        gpu.barrier()
                        cur = memref.load(buf, [tid])
                        o = off
                        prev = g.guarded(arith.cmpi(arith.CmpIPredicate.uge, tid, g.c(o)), [i32],
                                         lambda: [memref.load(buf, [arith.subi(tid, g.c(o))])], lambda: [zero32])[0]
                        gpu.barrier()
                        memref.store(arith.addi(cur, prev), buf, [tid])
                        off *= 2
                    gpu.barrier()
                    incl = _idx(memref.load(buf, [tid]))
                    total = _idx(memref.load(buf, [g.c(threads - 1)]))
                    g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)),
                           lambda: memref.store(_i32(g, base), offsets, [b]))

                    def place(i, pos):
                        s = arith.addi(first, i)
                        hit = g.guarded(in_range(s), [false.type], lambda: [is_in(s, b)], lambda: [false])[0]

                        def write():
                            memref.store(_i32(g, pos[0]), slot_row, [s])
                            memref.store(_i32(g, g.div(s, K)), row_token, [pos[0]])

                        g.when(hit, write)
                        return [arith.addi(pos[0], arith.select(hit, g.c(1), g.c(0)))]

                    g.loop(0, C, 1, [arith.addi(base, arith.subi(incl, cnt))], place)
                    return [arith.addi(base, total)]

                g.loop(0, n_exp + 1, 1, [g.c(0)], bucket)
                g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)),
                       lambda: memref.store(arith.constant(i32, N), offsets, [g.c(n_exp + 1)]))
            g.finish()
        return EmittedKernel(view.name, (1, 1, 1), (threads, 1, 1), 0,
                             {"strategy": self.KIND, "workgroup_bytes": plan["shared_bytes"]})


# --------------------------------------------------------------------------- grouped GEMM


class MoeGemmStrategy(Strategy):
    KIND = "moe_gemm"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """The SIMT matmul's tiles (MatmulStrategy.plan's rule, on the packed rows: 128x128
        with 8x8 a thread on CUDA when that gives a wave of workgroups, else 64x64 with
        4x4; BLOCK_K the largest of 32/16/8 that fits the shared memory)."""
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        n_rows, n_cols = view.result_specs[0].shape
        k = view.arg_specs[1].shape[1]
        big = target.name == "cuda" and -(-n_rows // 128) * -(-n_cols // 128) >= 128
        bm, bn, tm, tn = (128, 128, 8, 8) if big else (64, 64, 4, 4)
        while (bm // tm) * (bn // tn) > target.max_threads:
            bm, bn = bm // 2, bn // 2
        bk = next((c for c in (32, 16, 8) if MatmulStrategy._shared(bm, bn, c) <= target.max_shared_bytes), 8)
        grid = [-(-n_cols // bn), -(-n_rows // bm) + info["experts"] + 1, 1]
        if grid[1] > 65535:
            raise ValueError(f"{n_rows} MoE rows need {grid[1]} row tiles, more than a grid's y extent")
        return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm, "thread_n": tn,
                "threads": (bm // tm) * (bn // tn), "grid": grid, "shared_bytes": MatmulStrategy._shared(bm, bn, bk),
                "m": n_rows, "n": n_cols, "k": k, "experts": info["experts"]}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        bm, bn, bk = plan["block_m"], plan["block_n"], plan["block_k"]
        tm, tn, threads = plan["thread_m"], plan["thread_n"], plan["threads"]
        M, N, K = plan["m"], plan["n"], plan["k"]
        n_exp, gather = info["experts"], info["gather"]
        f32 = ir.F32Type.get()
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target),
                        [workgroup_memref([bk, bm + 1]), workgroup_memref([bk, bn])], (threads, 1, 1))
            As, Bs = g.shared
            a_mem, w_mem, offsets = g.args[:3]
            row_token = g.args[3] if gather else None
            out = g.args[-1]
            x_lead = view.arg_specs[0].shape[:-1]
            with ir.InsertionPoint(g.entry):
                tid = g.tid()
                col_tile, tile = g.bid("x"), g.bid("y")
                i1 = ir.IntegerType.get_signless(1)

                def scan(b, carried):
                    start, bucket, m0, m_end, found = carried
                    lo = _idx(memref.load(offsets, [b]))
                    hi = _idx(memref.load(offsets, [g.add(b, 1)]))
                    tiles = g.div(g.add(arith.subi(hi, lo), bm - 1), bm)
                    end = arith.addi(start, tiles)
                    here = arith.andi(arith.cmpi(arith.CmpIPredicate.uge, tile, start),
                                      arith.cmpi(arith.CmpIPredicate.ult, tile, end))
                    row0 = arith.addi(lo, g.mul(arith.subi(tile, start), bm))
                    return [end, arith.select(here, b, bucket), arith.select(here, row0, m0),
                            arith.select(here, hi, m_end), arith.ori(found, here)]

                _, bucket, m0, m_end, found = g.loop(0, n_exp + 1, 1,
                                                     [g.c(0), g.c(0), g.c(0), g.c(0), arith.constant(i1, 0)], scan)

                def body():
                    expert = arith.minui(bucket, g.c(n_exp - 1))  # bucket E: computed, never read
                    n0 = g.mul(col_tile, bn)
                    cols = bn // tn
                    tr, tc = g.div(tid, cols), g.rem(tid, cols)
                    vbytes = target.vector_bytes if target.name == "cuda" else 0
                    memo = _NoMemo()

                    def read_a(r, c):
                        if gather:
                            tok = _idx(memref.load(row_token, [r]))
                            at = (g.delinearize(tok, x_lead) if x_lead else []) + [c]
                        else:
                            at = [r, c]
                        return scalar_math.convert(memref.load(a_mem, at), f32)

                    def read_b(r, c):
                        return scalar_math.convert(memref.load(w_mem, [expert, r, c]), f32)

                    a_direct = None if gather else Direct(a_mem, [], False)
                    b_direct = Direct(w_mem, [expert], False)
                    row_of = [g.add(tr, i * (bm // tm)) for i in range(tm)]
                    col_of = [g.add(tc, j * cols) for j in range(tn)]

                    def k_step(k0, acc):
                        gpu.barrier()
                        # Rows past the bucket's end (< M, so in bounds) are staged too: a
                        # row of C depends on its own row of A only, and those are not stored.
                        stage_tile(g, memo, tid, threads, As, bm, bk, True, m0, M, k0, K, read_a, transposed=True,
                                   direct=a_direct, vector_bytes=vbytes)
                        stage_tile(g, memo, tid, threads, Bs, bk, bn, True, k0, K, n0, N, read_b,
                                   direct=b_direct, vector_bytes=vbytes)
                        gpu.barrier()

                        def inner(kk, acc):
                            a = [memref.load(As, [kk, r]) for r in row_of]
                            b = [memref.load(Bs, [kk, c]) for c in col_of]
                            return [mmath.fma(a[i], b[j], acc[i * tn + j]) for i in range(tm) for j in range(tn)]

                        return g.loop(0, bk, 1, acc, inner)

                    acc = g.loop(0, K, bk, [g.fconst(0.0)] * (tm * tn), k_step)
                    for i in range(tm):
                        gr = arith.addi(m0, row_of[i])
                        for j in range(tn):
                            gc = g.add(n0, col_of[j])
                            conds = [arith.cmpi(arith.CmpIPredicate.ult, gr, m_end)]
                            if N % bn:
                                conds.append(g.lt(gc, N))

                            def store(v=acc[i * tn + j], gr=gr, gc=gc):
                                if info["activation"] == "gelu":
                                    v = scalar_math.emit("gelu", [v], {"approximate": info["approximate"]})
                                store_value(v, out, [gr, gc])

                            g.when(g.all_of(conds), store)

                g.when(found, body)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), 0,
                             {"strategy": self.KIND, "workgroup_bytes": plan["shared_bytes"],
                              "tile": [bm, bn, bk], "thread_tile": [tm, tn], "gather": gather})


# --------------------------------------------------------------------------- combine


class MoeCombineStrategy(Strategy):
    KIND = "moe_combine"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        view = KernelView(kernel)
        total = math.prod(view.result_specs[0].shape)
        block = min(256, target.max_threads)
        grid, stride = E.launch_geometry(total, block, E.max_grid_x(target.name))
        return {"block": block, "numel": total, "grid": [grid, 1, 1], "grid_stride": stride}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view = KernelView(kernel)
        info = moe_attrs(kernel)
        K, n_exp = info["top_k"], info["experts"]
        out_shape = view.result_specs[0].shape
        lead, G = out_shape[:-1], out_shape[-1]
        block, total = plan["block"], plan["numel"]
        f32 = ir.F32Type.get()
        with kernel.location:
            g = GpuFunc(gpu_module, view.name, _arg_types(view, target), [], (block, 1, 1))
            y, slot_row, wt, idx, out = g.args
            with ir.InsertionPoint(g.entry):
                kb = E.IndexBuilder(g.entry)

                def one(lin: ir.Value) -> None:
                    t, n = g.div(lin, G), g.rem(lin, G)
                    tix = g.delinearize(t, lead) if lead else []
                    acc = g.fconst(0.0)
                    for j in range(K):
                        valid, _ = _routed_expert(g, idx, lead, t, j, n_exp)
                        r = _idx(memref.load(slot_row, [g.add(g.mul(t, K), j)]))
                        w = scalar_math.convert(memref.load(wt, tix + [g.c(j)]), f32)
                        v = scalar_math.convert(memref.load(y, [r, n]), f32)
                        acc = arith.addf(acc, arith.select(valid, arith.mulf(w, v), g.fconst(0.0)))
                    store_value(acc, out, tix + [n])

                E.for_each_thread_item(kb, total, block, plan["grid"][0], bool(plan["grid_stride"]), one)
            g.finish()
        return EmittedKernel(view.name, tuple(plan["grid"]), (block, 1, 1), 0, {"strategy": self.KIND})


register(MoeRouteStrategy())
register(MoeGemmStrategy())
register(MoeCombineStrategy())
