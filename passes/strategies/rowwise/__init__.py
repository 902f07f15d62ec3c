"""The rowwise strategy: kernels whose reductions all run over the same trailing
dimension(s) of one row space — layer norm, RMSNorm, softmax, log_softmax, and any
elementwise ops (torch broadcasting) around them.

Shape of the emitted kernel (one workgroup per row, T threads, T a power of two):

    row = block_id.x                      (decomposed into the leading coordinates;
                                           past the target's grid x limit, 65535 on
                                           Vulkan and Metal: y * grid_x + x, the
                                           spare workgroups past the last row idle)
    for each statistic, in dependency order:          (a *phase*)
        acc = scf.for j = tid to R step T iter_args(neutral) {kf.row_loop}
                  acc op f(x[row, j], earlier statistics)
        stat = workgroup_reduce(acc)      (subgroup shuffles where the target has
                                           them -- CUDA, Vulkan devices with subgroup
                                           shuffles --, else a tree in workgroup
                                           memory with gpu.barrier)
    scf.for j = tid to R step T {kf.row_loop}:   (the output phase)
        out[row, j] = g(x[row, j], statistics)
    per-row outputs: thread 0 stores them

With column partials (a norm's weight and bias gradients beside dx: ``sum(reshape(e,
[G, B, cols]), dims=[1])``, what kf-split-reductions and kf-fuse make of ``sum(dy *
xhat, 0)``), a workgroup takes a group of B consecutive rows instead of one row:

    group = block_id.x
    scf.for r = 0 to B iter_args(sums) {     (the phases and outputs above, of row
        ...                                    group * B + r)
        sums += e[row, my columns]            (registers mode: in registers; the loop
        gpu.barrier                            kernel: in the partial output itself,
    }                                          each thread its own columns)
    partial[group, my columns] = sums

so the rows are read once, by this kernel, and the kernel after it reads G rows of f32
sums rather than all the rows (kf-fuse's column kernel).

Why this shape:

- Phases in dependency order make the numerics those of the textbook algorithms: var
  is two-pass (the mean first, then the sum of squared deviations from it), never
  E[x²] - E[x]², which loses every digit when |mean| >> std; softmax subtracts the row
  maximum before exp.
- Everything is computed in f32 (f64 stays f64): f16/bf16 elements are extended when
  loaded and the output is rounded once, when stored (kf's precision policy).
- Global loads and stores are plain scalars in loops marked ``kf.row_loop``: the loop
  shape that ``kf-vectorize`` turns into 128-bit accesses, and loads of an input read in
  more than one phase carry ``kf.promote`` so that ``kf-promote-shared`` reads the row
  from global memory once. Keeping those two rewrites out of the strategy keeps each
  one small and testable on its own IR (and keeps this module about the math).
- The two reduction scratch buffers alternate between consecutive reductions, so a
  reduction needs no barrier after all threads have read its result: the next write to
  the same buffer comes after the next reduction's barrier. The group loop's barrier at
  the end of each row keeps that true from one row to the next.
- Column partials: a group of threads sums the same columns of every row of its block,
  so a thread adds only its own elements -- no reduction across threads, no atomics,
  and the sums' order is fixed (the results do not depend on scheduling). Blocks of
  rows, not one partial row per row, keep what the last stage reads small; B rows per
  group cost B sequential rows per workgroup, so kf-split-reductions chooses G (256 by
  default) to keep the GPU full.

Not handled (the strategy raises NotApplicable and kf-map-to-gpu falls back to
generic): reductions over non-trailing dims, integer reductions, argmax/topk, layout ops
other than unit-dim reshapes and broadcast_to, mixing a keepdim=False reduction result
with full rows (torch right-aligns it against the wrong dims). Reductions over several
trailing dims work but are not vectorized (their column index is not the loop index).
With column partials, registers mode's sums are held beside the row with no register
cap, and f32 rows take it only where one group of rows fills a workgroup.

The package: ``analysis.py`` (the row space and the statistics), ``plan.py`` (registers
mode or the loop kernel, threads and lanes; the variants), ``emit.py`` (values and
reductions both kernels share), ``loop.py`` (the loop kernel's phases), ``registers.py``
(registers mode's phases).
"""

from __future__ import annotations

import contextlib

from mlir import ir
from mlir.dialects import arith, gpu, scf

from .. import run_time_sizes
from ..base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from ..emit import max_grid_x, storage_type
from .analysis import analyze
from .emit import ASSUMED_ALIGNMENT, MAX_SHARED
from .loop import LoopEmitter
from .plan import RowwiseVariant
from .plan import plan as _plan
from .registers import RegistersEmitter

__all__ = ["RowwiseStrategy", "RowwiseVariant", "analyze"]


class RowwiseStrategy(Strategy):
    KIND = "rowwise"
    VARIANT = RowwiseVariant

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: RowwiseVariant | None = None) -> dict:
        """Threads per row, vector lanes, which inputs' rows to cache in workgroup memory
        and how reductions combine across threads; ``variant``: a RowwiseVariant (its
        defaults where None)."""
        return _plan(analyze(kernel), target, variant or RowwiseVariant())

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        a = analyze(kernel)
        plan = plan or self.plan(kernel, target)
        name = ir.StringAttr(kernel.attributes["sym_name"]).value
        T = plan["threads"]
        registers = plan.get("mode") == "registers"
        P = plan.get("rows_per_block", 1)
        blocks = -(-(a.groups or a.rows) // P)
        # (at run-time sizes the launcher computes the grid's x; a size past the device's
        # limit is the launcher's clear error)
        grid = (blocks, 1, 1) if plan.get("sizes") else folded_grid(blocks, max_grid_x(target.name))
        with kernel.location:
            # booleans are bytes on CUDA (torch's layout; a vector<N x i1> load would read
            # N bits): loaded as != 0, stored zero-extended
            arg_types = [ir.MemRefType.get(list(n.shape), storage_type(n.elem, target.name))
                         for n in a.inputs + a.outputs]
            size_slots = plan.get("sizes", [])
            if size_slots and a.groups:
                raise NotApplicable("column partials over groups of rows need the number of rows at compile time")
            if size_slots:  # run-time sizes: the slots' buffer, last
                arg_types.append(run_time_sizes.slot_type(len(size_slots)))
            wg = ir.Attribute.parse("#gpu.address_space<workgroup>")
            # the scratch holds the row statistics: f64 where one of them (or an input) is
            # f64, also a statistic of f32 inputs cast up (softmax(x, dtype=torch.float64))
            wide = any(n.elem == "f64" for n in a.inputs + [s[1] for s in a.stats])
            ct = ir.F64Type.get() if wide else ir.F32Type.get()
            slots = target.subgroup_size if plan["reduction"] == "shuffle" else T
            scratch_t = ir.MemRefType.get([slots], ct, None, wg)
            block = gpu_module.regions[0].blocks[0]
            ip = ir.InsertionPoint.at_block_terminator(block) if _has_terminator(block) else ir.InsertionPoint(block)
            fn = gpu.GPUFuncOp(ir.TypeAttr.get(ir.FunctionType.get(arg_types, [])), sym_name=name, kernel=True,
                               known_block_size=[T, 1, 1], ip=ip)
            fn.operation.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 2)
            fn.operation.attributes[MAX_SHARED] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                     target.max_shared_bytes)
            entry = fn.regions[0].blocks.append(*arg_types, scratch_t, scratch_t)
            args = list(entry.arguments)
            with ir.InsertionPoint(entry):
                em = (RegistersEmitter if registers else LoopEmitter)(
                    a, plan, target, fn, args[:len(arg_types)], args[len(arg_types):])
                if size_slots:
                    sizes = run_time_sizes.SizeSlots(entry, args[len(arg_types) - 1], size_slots)
                    em.rows_value = sizes.extent(a.rows)
                with _folded(em, grid, blocks):
                    em.setup()
                    with em.rows():
                        for kind, node in a.stats:
                            em.phase(kind, node)
                        em.outputs()
                gpu.ReturnOp([])
            if plan.get("max_registers"):
                # .maxnreg for ptxas (a cap: it may still use fewer)
                fn.operation.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(32), plan["max_registers"])
            if em.assumed_alignment:
                # what kf-vectorize records for its vector accesses: the launcher's promise
                fn.operation.attributes[ASSUMED_ALIGNMENT] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(64), em.assumed_alignment)
        notes = dict(plan, inputs=len(a.inputs), outputs=len(a.outputs))
        if not size_slots:
            return EmittedKernel(name, grid, (T, 1, 1), 0, notes)
        return EmittedKernel(name, grid, (T, 1, 1), 0, notes, sizes=tuple(map(tuple, size_slots)),
                             grid_sizes=(run_time_sizes.grid_text(0, a.rows // run_time_sizes.BOUND, P), "1", "1"))


def folded_grid(blocks: int, max_x: int) -> tuple[int, int, int]:
    """A grid of at least ``blocks`` workgroups whose x is at most ``max_x`` (Vulkan and
    Metal guarantee 65535): more rows than that go to a second dim, the fewest spare
    workgroups (at most gy - 1) past the last."""
    gy = -(-blocks // max_x)
    return (-(-blocks // gy), gy, 1)


@contextlib.contextmanager
def _folded(em, grid: tuple[int, int, int], blocks: int):
    """Around the kernel's body: where the grid is folded (``folded_grid``), the
    workgroup's linear index, y * gx + x, for the emitter, and the body only for
    workgroups below ``blocks`` (a workgroup's threads all take the same branch, so its
    barriers stay uniform)."""
    if grid[1] == 1:
        yield
        return
    gx = arith.constant(ir.IndexType.get(), grid[0])
    em.block_index = arith.addi(arith.muli(gpu.block_id(gpu.Dimension.y), gx), gpu.block_id(gpu.Dimension.x))
    if grid[0] * grid[1] == blocks:
        yield
        return
    iff = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, em.block_index,
                              arith.constant(ir.IndexType.get(), blocks)))
    with ir.InsertionPoint(iff.then_block):
        yield
        scf.YieldOp([])


def _has_terminator(block: ir.Block) -> bool:
    ops = list(block.operations)
    return bool(ops) and ops[-1].operation.name in ("gpu.module_end",)


register(RowwiseStrategy())
