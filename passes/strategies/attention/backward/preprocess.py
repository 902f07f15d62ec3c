"""The backward's preprocess: FlashAttention's D = rowsum(dO * O) and each row's
logsumexp, written once a call into a workspace that the main kernel reads
(``EmittedKernel.prelude``).

The workspace is f32 [2, rows] (rows: the batch's query rows, flattened, at the bound of
run-time sequence lengths): D in row 0, the logsumexp in row 1, both as the kernel
function computes them (D the row sum of its ``d_src``, the logsumexp its ``lse``
value). One thread a row; the main kernel then
reads two floats a row instead of evaluating the row sum per block.
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, memref

from ... import run_time_sizes
from ...base import EmittedKernel, TargetInfo
from ...kernel_ir import GpuFunc, Pointwise, gpu_arg_types
from . import run_time
from .chain import BackwardChain

#: Threads a workgroup of the preprocess.
THREADS = 128


def workspace_type(ch: BackwardChain) -> ir.RankedTensorType:
    """The workspace's tensor type: f32 [2, rows]."""
    rows = math.prod(ch.batch) * ch.seq_q
    return ir.RankedTensorType.get([2, rows], ir.F32Type.get())


def row_values(g: GpuFunc, pw: Pointwise, ch: BackwardChain, batch_idx: list, i: ir.Value) -> tuple:
    """(D, logsumexp) of query row i of a batch element, in f32, from the kernel
    function's values."""
    f32 = ir.F32Type.get()
    nb = len(ch.batch)
    d_spec = spec_of(ch.d_src.type)
    lead = pw.operand_index(d_spec.shape[:-2], batch_idx, nb)

    def add(c, acc):
        pw.reset()
        return [arith.addf(acc[0], scalar_math.convert(pw.eval(ch.d_src, lead + [i, c]), f32))]

    d = g.loop(0, d_spec.shape[-1], 1, [g.fconst(0.0)], add)[0]
    pw.reset()
    rank = ch.scores.rank
    l_idx = pw.operand_index(spec_of(ch.lse.type).shape, batch_idx + [i, g.c(0)], rank)
    lse = scalar_math.convert(pw.eval(ch.lse, l_idx), f32)
    pw.reset()
    return d, lse


def emit_preprocess(ch: BackwardChain, gpu_module: ir.Operation, target: TargetInfo,
                    kernel: ir.Operation | None = None, slots=()) -> EmittedKernel:
    """The preprocess kernel: thread r writes row r's D and logsumexp. ``slots``: the
    kernel function's run-time sizes (run_time.py; ``kernel`` the bounded kernel
    function): the preprocess takes those of its inputs, and rows of the run-time
    number of queries."""
    view = ch.view
    n_in = len(view.args)
    ws_t = workspace_type(ch)
    mem_t = ir.MemRefType.get(ws_t.shape, ws_t.element_type)
    name = f"{view.name}_pre"
    threads = min(THREADS, target.max_threads)
    slots = [tuple(s) for s in slots if s[0] < n_in]
    types = run_time.declare_flat(gpu_arg_types(view, target)[:n_in], view, slots) + [mem_t]
    if slots:
        types.append(run_time_sizes.slot_type(len(slots)))
    g = GpuFunc(gpu_module, name, types, [], (threads, 1, 1))
    pw = Pointwise(g, view, g.args[:n_in])
    ws = g.args[n_in]
    batch = math.prod(ch.batch)
    grid_sizes = ()
    with ir.InsertionPoint(g.entry):
        seq_q = ch.seq_q
        if slots:
            lengths = run_time.Lengths(g, kernel, ch, slots)
            seq_q, pw.flat = lengths.seq_q, lengths.flat_inputs()
            grid_sizes = (lengths.blocks_text(lengths.q_slot, seq_q, batch, threads), "1", "1")
        rows = run_time.mul(batch, seq_q)
        r = arith.addi(g.mul(g.bid("x"), threads), g.tid())

        def row():
            b, i = run_time.div(r, seq_q), run_time.rem(r, seq_q)
            batch_idx = g.delinearize(b, ch.batch) if ch.batch else []
            d, lse = row_values(g, pw, ch, batch_idx, i)
            memref.store(d, ws, [g.c(0), r])
            memref.store(lse, ws, [g.c(1), r])

        g.when(g.lt(r, rows) if run_time_sizes.ragged(rows, threads) else None, row)
        g.finish()
    rows = ws_t.shape[1]
    return EmittedKernel(name, (-(-rows // threads), 1, 1), (threads, 1, 1), 0,
                         {"strategy": "attention backward preprocess"}, sizes=tuple(slots), grid_sizes=grid_sizes)
