"""The query blocks a key block of the Hopper backward visits under a mask, from the
preprocess's block table: the blocks its column does not mark DEAD, in order.

The producer holds them as an i64 bit mask (bit m: query block m; a warp ballot per 32
blocks, as the forward's ``table_masks``). The consumers, with no register to spare at
head dim 64, keep them as a list in shared memory (``list_steps``): entry i is the i-th
visited block with its class bits (WHOLE: no mask; CAUSAL: masked exactly where the key
is past the query; else the mask is read), loaded at the step.

A row the mask masks everywhere needs no visit: its dS is 0, and its P (1 / Sk at every
key) adds the same to every key's dV, which the preprocess sums (``preprocess._dead_dv``)
and the consumers add at the end (``dead_dv``).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm, scf

from ....nvidia.barriers import NamedBarrier, named_sync
from ...hopper.block_table import CAUSAL, DEAD, WHOLE, cttz, live_after, live_count
from .preprocess import load_i32

#: A step list entry: the query block in its low bits, then its class.
WHOLE_BIT, CAUSAL_BIT = 1 << 8, 1 << 9


def _code(k, m: ir.Value) -> ir.Value:
    """The table's code of (the workgroup's key block, query block m)."""
    g, plan = k.g, k.plan
    at = arith.addi(g.mul(g.bid("x"), plan.query_blocks), arith.addi(m, g.c(plan.layout.codes_at)))
    return load_i32(k.ws, at)


def _is(code: ir.Value, value: int) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32)
    return arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(i32, value))


def visit_mask(k) -> ir.Value:
    """The workgroup's key block's visited query blocks, an i64 bit mask."""
    g, nq = k.g, k.plan.query_blocks
    i1, i32, i64 = (ir.IntegerType.get_signless(w) for w in (1, 32, 64))
    lane = g.rem(k.tid, 32)
    out = None
    for w in range(-(-nq // 32)):
        m = g.add(lane, 32 * w)
        pred = arith.xori(_is(_code(k, arith.minui(m, g.c(nq - 1))), DEAD), arith.constant(i1, 1))
        if nq < 32 * (w + 1):
            pred = arith.andi(g.lt(m, nq), pred)
        word = arith.extui(i64, nvvm.vote_sync(i32, arith.constant(i32, -1), pred, nvvm.VoteSyncKind.ballot))
        if w:
            word = arith.shli(word, arith.constant(i64, 32 * w))
        out = word if out is None else arith.ori(out, word)
    return out


def walk(k, visit: ir.Value | None, init: list, body) -> list:
    """``body(i, m, carried)`` for the i-th query block visited (m: its index, an index
    value), in order; every block without ``visit`` (``visit_mask``)."""
    g = k.g
    if visit is None:
        return g.loop(0, k.plan.query_blocks, 1, init, lambda i, c: body(i, i, c))
    loop = scf.ForOp(g.c(0), live_count(visit), g.c(1), list(init) + [cttz(visit)])
    with ir.InsertionPoint(loop.body):
        i, carried = loop.induction_variable, list(loop.inner_iter_args)
        m = carried[-1]
        out = body(i, arith.index_cast(ir.IndexType.get(), m), carried[:-1])
        scf.yield_(list(out) + [cttz(live_after(visit, m))])
    return list(loop.results)[:-1]


def list_steps(k, steps: ir.Value) -> ir.Value:
    """The consumers' walk as a list in shared memory (``steps``, i32 [1, query blocks
    or more]), written by consumer thread m for query block m, behind the consumers'
    barrier; returns its length (an index)."""
    g, nq = k.g, k.plan.query_blocks
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    visit = visit_mask(k)

    def write():
        m = k.tid
        code = _code(k, m)

        def store():
            below = arith.andi(visit, arith.subi(arith.shli(arith.constant(i64, 1), arith.index_cast(i64, m)),
                                                 arith.constant(i64, 1)))
            at = arith.index_cast(ir.IndexType.get(), llvm.intr_ctpop(below))
            bits = arith.select(_is(code, WHOLE), arith.constant(i32, WHOLE_BIT),
                                arith.select(_is(code, CAUSAL), arith.constant(i32, CAUSAL_BIT),
                                             arith.constant(i32, 0)))
            memref.store(arith.ori(arith.index_cast(i32, m), bits), steps, [g.c(0), at])

        g.when(arith.xori(_is(code, DEAD), arith.constant(ir.IntegerType.get_signless(1), 1)), store)

    g.when(g.lt(k.tid, nq), write)
    named_sync(NamedBarrier.CONSUMERS, 256)
    return live_count(visit)


def listed(k, steps: ir.Value, count: ir.Value, init: list, body) -> list:
    """``body(i, m, entry, carried)`` for the i-th entry of ``list_steps``'s list (m: its
    query block, an index)."""
    g = k.g
    i32 = ir.IntegerType.get_signless(32)
    loop = scf.ForOp(g.c(0), count, g.c(1), list(init))
    with ir.InsertionPoint(loop.body):
        i = loop.induction_variable
        entry = memref.load(steps, [g.c(0), i])
        m = arith.index_cast(ir.IndexType.get(), arith.andi(entry, arith.constant(i32, 0xFF)))
        scf.yield_(list(body(i, m, entry, list(loop.inner_iter_args))))
    return list(loop.results)


def has(entry: ir.Value, flag: int) -> ir.Value:
    """Whether a step list entry has a class bit."""
    i32 = ir.IntegerType.get_signless(32)
    return arith.cmpi(arith.CmpIPredicate.ne, arith.andi(entry, arith.constant(i32, flag)), arith.constant(i32, 0))
