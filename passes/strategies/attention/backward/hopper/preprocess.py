"""The Hopper backward's preprocess (FlashAttention-3's ``flash_bwd_preprocess``): per
query row D = rowsum(dO * O) and the logsumexp times log2 e, and the row's dQ sums
zeroed, into the workspace (``plan.Workspace``); with a mask also the block table the
main kernel walks.

A *row workgroup* takes 64 rows of one batch element: ``head_dim / 8`` threads a row,
each reading 8 consecutive elements of dO and O (one 16-byte load of each, where D's
operand is their product as kf-fuse writes it; else element by element), the row's
partial sums added by xor shuffles. Rows past the queries (the padding up to whole
query blocks) get D = 0 and a logsumexp of +inf, so that their P is 0. With a mask, the
workgroup also flags its 64 rows if one of them is masked everywhere (its logsumexp
within half the mask's fill) and then sums such rows' share of every key's dV
(``_dead_dv``), which the main kernel adds to its dV.

A *table workgroup* (with a mask: the first grid columns, table block x * batch + y; the
mask is every head's) classifies one (query block, key block) of the mask as the forward's table
does (``attention.hopper.block_table``): DEAD, WHOLE, CAUSAL (masked exactly where the
key is past the query) or PARTIAL, its 256 threads reading the block's mask along the
keys and reducing with ``bar.red``.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, memref, vector

from ....base import EmittedKernel
from ....kernel_ir import GpuFunc, Pointwise, direct_source, gpu_arg_types
from ....nvidia.barriers import block_reduce
from ...hopper.block_table import CAUSAL, DEAD, PARTIAL, WHOLE
from .plan import BLOCK_N, FLAG_ROWS

#: Rows a row workgroup of the preprocess, and its threads.
ROWS, THREADS = FLAG_ROWS, 256


def _product_operands(ch) -> tuple | None:
    """(a, b) where D's operand is a * b of two arguments (through float casts), else None."""
    from kf.dialects.types import defining

    op = defining(ch.d_src)
    if op is None or op.name != "kf.mul":
        return None
    out = []
    for v in op.operands:
        d = defining(v)
        if d is not None and d.name == "kf.cast":
            v = d.operands[0]
        if ch.view.arg_index(v) is None or spec_of(v.type).shape != spec_of(ch.d_src.type).shape:
            return None
        out.append(v)
    return tuple(out)


def store_i32(g: GpuFunc, value: ir.Value, ws: ir.Value, at: ir.Value) -> None:
    """An i32 into the f32 workspace (its bits)."""
    memref.store(arith.bitcast(g.f32, value), ws, [at])


def load_i32(ws: ir.Value, at: ir.Value) -> ir.Value:
    """An i32 from the f32 workspace."""
    return arith.bitcast(ir.IntegerType.get_signless(32), memref.load(ws, [at]))


def emit_preprocess(k) -> EmittedKernel:
    """The preprocess of the backward ``k`` (a HopperBackward)."""
    ch, plan, view = k.ch, k.plan, k.view
    name = f"{view.name}_pre"
    n_in = len(view.args)
    g = GpuFunc(k.gpu_module, name, gpu_arg_types(view, k.target)[:n_in] + [k.ws_type], [], (THREADS, 1, 1))
    pw = Pointwise(g, view, g.args[:n_in])
    tables = plan.query_blocks * plan.key_blocks if plan.masked else 0
    batch = math.prod(ch.batch)
    columns = -(-tables // batch)  # grid columns of table workgroups, every row of the grid
    with ir.InsertionPoint(g.entry):
        x = g.bid("x")
        if tables:
            is_table = g.lt(x, columns)
            t = arith.addi(g.mul(x, batch), g.bid("y"))
            g.when(arith.andi(is_table, g.lt(t, tables)), lambda: _table_block(k, g, pw, t))
            g.when(arith.xori(is_table, arith.constant(is_table.type, 1)),
                   lambda: _rows(k, g, pw, arith.subi(x, g.c(columns))))
        else:
            _rows(k, g, pw, x)
        g.finish()
    return EmittedKernel(name, (columns + plan.seq_q_padded // ROWS, batch, 1), (THREADS, 1, 1), 0,
                         {"strategy": "attention backward preprocess"})


def _rows(k, g: GpuFunc, pw: Pointwise, block: ir.Value) -> None:
    """A row workgroup (see the module docstring)."""
    ch, plan, view = k.ch, k.plan, k.view
    d = plan.head_dim
    lanes = d // 8
    per_pass = THREADS // lanes
    ws = g.args[-1]
    f32 = ir.F32Type.get()
    layout = plan.layout
    nb = len(ch.batch)
    tid = g.tid()
    m0, bh = g.mul(block, ROWS), g.bid("y")
    batch_idx = g.delinearize(bh, ch.batch) if ch.batch else []
    lane = g.rem(tid, lanes)
    c0 = g.mul(lane, 8)
    d_spec = spec_of(ch.d_src.type)
    lead = pw.operand_index(d_spec.shape[:-2], batch_idx, nb)
    operands = _product_operands(ch)
    memrefs = g.args[:len(view.args)]
    i1 = ir.IntegerType.get_signless(1)
    dead = arith.constant(i1, 0)
    threshold = g.fconst(plan.mask_fill * math.log2(math.e) / 2) if plan.masked else None
    for p in range(ROWS // per_pass):
        r = g.add(g.div(tid, lanes), p * per_pass)
        i = arith.addi(m0, r)

        def partial(i=i):
            if operands is not None:
                prod = None
                for v in operands:
                    src = direct_source(view, memrefs, v, lead, False)
                    et = ir.MemRefType(src.mem.type).element_type
                    x = vector.load(ir.VectorType.get([8], et), src.mem, src.lead + [i, c0], alignment=16)
                    x = arith.extf(ir.VectorType.get([8], f32), x) if et != f32 else x
                    prod = x if prod is None else arith.mulf(prod, x)
                return [vector.reduction(f32, vector.CombiningKind.ADD, prod)]
            acc = g.fconst(0.0)
            for e in range(8):
                pw.reset()
                acc = arith.addf(acc, scalar_math.convert(pw.eval(ch.d_src, lead + [i, g.add(c0, e)]), f32))
            pw.reset()
            return [acc]

        inside = g.lt(i, ch.seq_q) if plan.seq_q_padded != ch.seq_q else None
        total = g.guarded(inside, [f32], partial, lambda: [g.fconst(0.0)])[0]
        i32 = ir.IntegerType.get_signless(32)
        for off in (1, 2, 4, 8)[:int(math.log2(lanes))]:
            other = gpu.shuffle(total, arith.constant(i32, off), arith.constant(i32, 32), gpu.ShuffleMode.XOR)[0]
            total = arith.addf(total, other)

        def lse(i=i):
            pw.reset()
            idx = pw.operand_index(spec_of(ch.lse.type).shape, batch_idx + [i, g.c(0)], ch.scores.rank)
            value = scalar_math.convert(pw.eval(ch.lse, idx), f32)
            pw.reset()
            return [arith.mulf(value, g.fconst(math.log2(math.e)))]

        first = arith.cmpi(arith.CmpIPredicate.eq, lane, g.c(0))
        l2 = g.guarded(arith.andi(first, inside) if inside is not None else first, [f32], lse,
                       lambda: [g.fconst(math.inf)])[0]
        if threshold is not None:
            dead = arith.ori(dead, arith.cmpf(arith.CmpFPredicate.OLE, l2, threshold))

        def write(i=i, total=total, l2=l2):
            row = arith.addi(g.mul(bh, plan.seq_q_padded), i)
            memref.store(total, ws, [g.add(row, layout.d_at)])
            memref.store(l2, ws, [g.add(row, layout.lse_at)])

        g.when(first, write)
    if threshold is not None:
        dead = block_reduce(dead, "or")
        flag = arith.extui(ir.IntegerType.get_signless(32), dead)
        slot = arith.addi(g.mul(bh, plan.seq_q_padded // ROWS), block)
        g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)),
               lambda: store_i32(g, flag, ws, g.add(slot, layout.dead_at)))
        g.when(dead, lambda: _dead_dv(k, g, pw, m0, batch_idx, threshold, slot))
    # the block's dQ sums: ROWS x d floats from dq_at + (bh * Sqp + m0) * d
    zeros = arith.constant(ir.VectorType.get([4], f32), ir.DenseElementsAttr.get_splat(
        ir.VectorType.get([4], f32), ir.FloatAttr.get(f32, 0.0)))
    base = g.add(g.mul(arith.addi(g.mul(bh, plan.seq_q_padded), m0), d), layout.dq_at)
    for u in range(ROWS * d // (4 * THREADS)):
        vector.store(zeros, ws, [arith.addi(base, g.mul(g.add(tid, u * THREADS), 4))], alignment=16)


def _dead_dv(k, g: GpuFunc, pw: Pointwise, m0: ir.Value, batch_idx: list, threshold: ir.Value,
             slot: ir.Value) -> None:
    """The dead rows' share of every key's dV, for a row workgroup with one (its flag
    set): a row masked everywhere has P = 1 / Sk at every key (the forward's softmax over
    equal fills) and dS = 0, so it adds the same dO / Sk to every key's dV, which the main
    kernel adds at its end instead of visiting the row's blocks. Thread c sums column c
    over the workgroup's rows."""
    ch, plan = k.ch, k.plan
    f32 = ir.F32Type.get()
    tid = g.tid()
    ws = g.args[-1]
    do_shape = spec_of(ch.do.type).shape
    lse_shape = spec_of(ch.lse.type).shape

    def column():
        def row(r, carried):
            i = arith.addi(m0, r)

            def add():
                pw.reset()
                l2 = arith.mulf(scalar_math.convert(
                    pw.eval(ch.lse, pw.operand_index(lse_shape, batch_idx + [i, g.c(0)], ch.scores.rank)), f32),
                    g.fconst(math.log2(math.e)))
                pw.reset()
                x = scalar_math.convert(pw.eval(ch.do, pw.operand_index(do_shape, batch_idx + [i, tid],
                                                                       ch.scores.rank)), f32)
                pw.reset()
                dead = arith.cmpf(arith.CmpFPredicate.OLE, l2, threshold)
                return [arith.addf(carried[0], arith.select(dead, x, g.fconst(0.0)))]

            inside = g.lt(i, ch.seq_q) if plan.seq_q_padded != ch.seq_q else None
            return g.guarded(inside, [f32], add, lambda: carried)

        total = g.loop(0, ROWS, 1, [g.fconst(0.0)], row)[0]
        at = arith.addi(g.mul(slot, plan.head_dim), arith.addi(tid, g.c(plan.layout.dead_dv_at)))
        memref.store(arith.mulf(total, g.fconst(1.0 / ch.seq_k)), ws, [at])

    g.when(g.lt(tid, plan.head_dim), column)


def _table_block(k, g: GpuFunc, pw: Pointwise, x: ir.Value) -> None:
    """A table workgroup: block (m, n) = (x % query blocks, x / query blocks)."""
    ch, plan = k.ch, k.plan
    bm, nq = plan.block_m, plan.query_blocks
    ws = g.args[-1]
    i1, i32 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
    true = arith.constant(i1, 1)
    tid = g.tid()
    m, n = g.rem(x, nq), g.div(x, nq)
    q0, k0 = g.mul(m, bm), g.mul(n, BLOCK_N)
    spec = spec_of(ch.mask_cond.type)
    lead = [g.c(0)] * (ch.scores.rank - 2)
    # counts (i32), not i1 chains: 3 x 32 predicates a thread spill in ptxas
    zero = arith.constant(i32, 0)
    n_masked, n_kept, n_off = zero, zero, zero  # off: inside, and masked unlike the causal pattern
    for e in range(bm * BLOCK_N // THREADS):
        lin = g.add(tid, e * THREADS)
        q, key = arith.addi(q0, g.div(lin, BLOCK_N)), arith.addi(k0, g.rem(lin, BLOCK_N))
        inside = g.all_of([c for c in (g.lt(q, ch.seq_q), g.lt(key, ch.seq_k)) if c is not None])
        # clamped into the mask (a load in bounds, no branch), then counted as masked outside
        qc, kc = arith.minui(q, g.c(ch.seq_q - 1)), arith.minui(key, g.c(ch.seq_k - 1))
        pw.reset()
        cond = pw.eval(ch.mask_cond, pw.operand_index(spec.shape, lead + [qc, kc], ch.scores.rank))
        pw.reset()
        masked = arith.ori(cond, arith.xori(inside, true))
        above = arith.cmpi(arith.CmpIPredicate.ugt, key, q)
        off = arith.andi(inside, arith.xori(masked, above))
        n_masked = arith.addi(n_masked, arith.extui(i32, masked))
        n_kept = arith.addi(n_kept, arith.extui(i32, arith.xori(masked, true)))
        n_off = arith.addi(n_off, arith.extui(i32, off))
    live = arith.cmpi(arith.CmpIPredicate.ne, n_kept, zero)
    whole = arith.cmpi(arith.CmpIPredicate.eq, n_masked, zero)
    causal = arith.cmpi(arith.CmpIPredicate.eq, n_off, zero)
    live, whole, causal = block_reduce(live, "or"), block_reduce(whole, "and"), block_reduce(causal, "and")
    code = arith.select(live, arith.select(whole, arith.constant(i32, WHOLE),
                                           arith.select(causal, arith.constant(i32, CAUSAL),
                                                        arith.constant(i32, PARTIAL))),
                        arith.constant(i32, DEAD))
    at = g.add(arith.addi(g.mul(n, nq), m), plan.layout.codes_at)
    g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)), lambda: store_i32(g, code, ws, at))
