"""The GEMM a matmul kernel function holds, as the matmul kernels read it (``analyze``),
and the order in which workgroups take its output tiles (``grouped_tiles``)."""

from __future__ import annotations

from dataclasses import dataclass

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import defining, swaps_last_two
from mlir import ir
from mlir.dialects import arith

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


def grouped_tiles(g: GpuFunc, tiles_n: int, tiles_m: int, group_m: int) -> tuple[ir.Value, ir.Value]:
    """(column tile, row tile) of this workgroup. Without ``group_m``, block ids x and y.
    With it, the linear block id walks groups of ``group_m`` tile rows column by column,
    so the workgroups resident at once cover a near-square patch of the output and read
    the same A rows and B columns from L2 instead of sweeping all of B per tile row."""
    bx, by = g.bid("x"), g.bid("y")
    if group_m <= 1 or tiles_m <= group_m or tiles_n == 1:
        return bx, by
    pid = arith.addi(g.mul(by, tiles_n), bx)
    per_group = group_m * tiles_n
    first_m = g.mul(g.div(pid, per_group), group_m)
    in_group = g.rem(pid, per_group)
    if tiles_m % group_m:
        size = arith.minui(arith.subi(g.c(tiles_m), first_m), g.c(group_m))
        return arith.divui(in_group, size), arith.addi(first_m, arith.remui(in_group, size))
    return g.div(in_group, group_m), arith.addi(first_m, g.rem(in_group, group_m))
