"""The GEMM a matmul kernel function holds, as the matmul kernels read it (``analyze``),
the order in which workgroups take its output tiles (``grouped_tiles``), and its run-time
rows (``RunTimeRows``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import defining, swaps_last_two
from mlir import ir
from mlir.dialects import arith

from .. import run_time_sizes
from ..base import NotApplicable
from ..kernel_ir import GpuFunc, KernelView, contiguous_last, pointwise_closure, unique_results


@dataclass
class Gemm:
    """A kernel function's one ``kf.matmul`` and how its operands lie."""

    mm: ir.Operation
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a_k_contiguous: bool  # A's innermost memory dimension is k (else m: a transposed argument)
    b_n_contiguous: bool
    a_direct: bool = False  # A is an argument read as it is (or with its last two dims swapped)
    b_direct: bool = False


def analyze(kernel: ir.Operation) -> tuple[KernelView, Gemm]:
    view = KernelView(kernel)
    mms = [op for op in view.ops if op.name == "kf.matmul"]
    if len(mms) != 1:
        raise NotApplicable(f"@{view.name} has {len(mms)} matmuls; the matmul strategy takes one")
    mm = mms[0]
    unique_results(view)
    a, b = mm.operands
    pointwise_closure(view, [a, b], [])
    pointwise_closure(view, view.results, [mm.result])
    # The matmul result must reach the outputs only through ops over the output shape.
    out = spec_of(mm.result.type)
    for r, s in zip(view.results, view.result_specs):
        if s.shape != out.shape:
            raise NotApplicable(f"result of shape {list(s.shape)} differs from the matmul's {list(out.shape)}")
    for op in view.ops:
        if op == mm or op.name == "kf.fill":
            continue
        if _depends_on(op, mm.result) and spec_of(op.results[0].type).shape != out.shape:
            raise NotApplicable(f"{op.name} after the matmul changes the shape")
    sa, sb = spec_of(a.type), spec_of(b.type)
    return view, Gemm(mm, out.shape[:-2], sa.shape[-2], sb.shape[-1], sa.shape[-1],
                       contiguous_last(view, a), contiguous_last(view, b), _reads_argument(view, a),
                       _reads_argument(view, b))


def _reads_argument(view: KernelView, v: ir.Value) -> bool:
    """Whether v is a kernel argument of rank >= 2, maybe with its last two dims swapped
    (what ``direct_source`` takes)."""
    op = defining(v)
    if op is not None and op.name == "kf.transpose":
        if not swaps_last_two(op_attrs(op)["perm"]):
            return False
        v = op.operands[0]
    i = view.arg_index(v)
    return i is not None and view.arg_specs[i].rank >= 2


def _depends_on(op: ir.Operation, v: ir.Value) -> bool:
    stack = list(op.operands)
    seen = set()
    while stack:
        x = stack.pop()
        if x == v:
            return True
        if x in seen:
            continue
        seen.add(x)
        d = defining(x)
        if d is not None:
            stack.extend(d.operands)
    return False


def grouped_tiles(g: GpuFunc, tiles_n: int, tiles_m: int | ir.Value, group_m: int) -> tuple[ir.Value, ir.Value]:
    """(column tile, row tile) of this workgroup. Without ``group_m``, block ids x and y.
    With it, the linear block id walks groups of ``group_m`` tile rows column by column,
    so the workgroups resident at once cover a near-square patch of the output and read
    the same A rows and B columns from L2 instead of sweeping all of B per tile row.
    ``tiles_m`` may be a run-time count (an index value): the last group is then always
    taken as possibly short."""
    bx, by = g.bid("x"), g.bid("y")
    dynamic = not isinstance(tiles_m, int)
    if group_m <= 1 or (not dynamic and tiles_m <= group_m) or tiles_n == 1:
        return bx, by
    pid = arith.addi(g.mul(by, tiles_n), bx)
    per_group = group_m * tiles_n
    first_m = g.mul(g.div(pid, per_group), group_m)
    in_group = g.rem(pid, per_group)
    if dynamic or tiles_m % group_m:
        size = arith.minui(arith.subi(tiles_m if dynamic else g.c(tiles_m), first_m), g.c(group_m))
        return arith.divui(in_group, size), arith.addi(first_m, arith.remui(in_group, size))
    return g.div(in_group, group_m), arith.addi(first_m, g.rem(in_group, group_m))


@dataclass
class RunTimeRows:
    """The run-time dim of a matmul kernel with run-time sizes (strategies/run_time_sizes.py):
    the output's M (the rows of A and C), its first batch dim that is not 1, or K (the
    output's sizes static: a weight gradient summed over run-time rows; the K loop then
    runs to the run-time K, its tail guarded) -- never N, which raises ValueError so that
    the driver compiles the kernel for static sizes. ``slot``: the output's slot (-1 for
    K); ``dim``: which output dim it is (None for K)."""

    slot: int
    dim: int | None
    rank: int
    slots: list

    @staticmethod
    def of(view: KernelView, plan: dict) -> "RunTimeRows | None":
        slots = [tuple(s) for s in plan.get("sizes", [])]
        if not slots:
            return None
        n_in = len(view.args)
        outs = [(k, d) for k, (pos, d) in enumerate(slots) if pos >= n_in]
        rank = view.result_specs[0].rank
        if not outs:
            return RunTimeRows(-1, None, rank, slots)
        k, d = outs[0]
        if d == rank - 1:
            raise ValueError("a matmul with a run-time N: its kernels take run-time rows (M) or batch only")
        return RunTimeRows(k, d, rank, slots)

    @property
    def is_m(self) -> bool:
        return self.dim == self.rank - 2

    @property
    def is_k(self) -> bool:
        return self.dim is None

    def depth(self, g: GpuFunc, kernel: ir.Operation, gm: Gemm) -> int | ir.Value:
        """K: its run-time size where it is K (found from the slots by
        run_time_sizes.RunTimeShapes over the bounded kernel), else the static one."""
        if not self.is_k:
            return gm.k
        shapes = run_time_sizes.RunTimeShapes(kernel, run_time_sizes.SizeSlots(g.entry, g.args[-1], self.slots))
        k = shapes.shape(gm.mm.operands[0])[-1]
        if isinstance(k, int):
            raise ValueError("a matmul whose run-time size is neither M, a batch dim nor K")
        return k

    def rows(self, g: GpuFunc, gm: Gemm) -> int | ir.Value:
        """M: the slot's run-time size where it is M, else the static one."""
        if not self.is_m:
            return gm.m
        return run_time_sizes.SizeSlots(g.entry, g.args[-1], self.slots).size(self.slot)

    def grid(self, plan: dict) -> tuple[str, str, str]:
        """The grid as expressions over the slot (``KernelABI.grid_sizes``): the row tiles
        (y) over M, or the batch (z) over a run-time batch dim."""
        gx, gy, gz = (str(x) for x in plan["grid"])
        if self.is_k:
            return gx, gy, gz
        if self.is_m:
            gy = run_time_sizes.grid_text(self.slot, 1, plan["block_m"])
        else:
            gz = run_time_sizes.grid_text(self.slot, math.prod(plan["batch"]) // run_time_sizes.BOUND, 1)
        return gx, gy, gz

    @staticmethod
    def launch(run_time: "RunTimeRows | None", plan: dict) -> dict:
        """EmittedKernel's ``sizes`` and ``grid_sizes`` (none for static sizes)."""
        if run_time is None:
            return {}
        return {"sizes": tuple(map(tuple, plan["sizes"])), "grid_sizes": run_time.grid(plan)}


def tail_guard(g: GpuFunc, i: ir.Value, extent: int | ir.Value, block: int) -> ir.Value | None:
    """``i < extent`` where tiles of ``block`` can pass the extent: a run-time extent
    always, a static one when the block does not divide it."""
    return g.lt(i, extent) if run_time_sizes.ragged(extent, block) else None


def row_tiles(g: GpuFunc, m: int | ir.Value, plan: dict) -> int | ir.Value:
    """The grid's row tiles: the plan's, or ceil(M / block_m) for a run-time M."""
    if isinstance(m, int):
        return plan["grid"][1]
    return g.div(g.add(m, plan["block_m"] - 1), plan["block_m"])


def gpu_arg_types_with_sizes(view: KernelView, target, plan: dict) -> list[ir.Type]:
    """The gpu.func's arguments: inputs, outputs and, with run-time sizes, the slots'
    buffer last."""
    from ..kernel_ir import gpu_arg_types

    types = gpu_arg_types(view, target)
    if plan.get("sizes"):
        types.append(run_time_sizes.slot_type(len(plan["sizes"])))
    return types
