"""The cooperative-matrix operations of kf's SPIR-V kernels (matmul/coopmat.py,
attention/coopmat.py), on one subgroup's m x n tiles of f32 accumulators with k-steps of
operands staged in workgroup memory.

``SubgroupMma(emulated=False)`` writes MLIR's ``gpu.subgroup_mma`` ops, which kf-to-spirv
lowers to ``spirv.KHR.CooperativeMatrix{Load,MulAdd,Store}``: an accumulator is one
opaque value a tile. ``emulated=True`` computes the same products with the subgroup's
invocations in scalar f32 arithmetic (invocation ``lane`` owns the tile's elements
``lane, lane + subgroup, ...``): the kernels' dataflow -- staging, which subgroup takes
which tile, barriers, epilogues -- then runs on a device without cooperative matrices
(lavapipe), which is how kf's tests check it against torch where no GPU is. Plans say
which (``emulated``); only tests ask for the emulation.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import arith, gpu, memref
from mlir.dialects import math as mmath

from .kernel_ir import GpuFunc


def mma_type(rows: int, cols: int, elem: ir.Type, use: str) -> ir.Type:
    """``!gpu.mma_matrix<rows x cols x elem, use>`` (use: AOp, BOp, COp)."""
    return ir.Type.parse(f'!gpu.mma_matrix<{rows}x{cols}x{elem}, "{use}">')


class SubgroupMma:
    """m x n x k products of one subgroup (see the module docstring). An accumulator is a
    list of values: one ``!gpu.mma_matrix`` (COp, f32), or this invocation's f32 elements
    when emulated; ``acc_count`` is its length, for loops that carry them."""

    def __init__(self, g: GpuFunc, shape: Sequence[int], elem: ir.Type, subgroup_size: int, emulated: bool = False):
        self.g, (self.m, self.n, self.k), self.elem, self.emulated = g, tuple(shape), elem, emulated
        self.sg = subgroup_size
        if emulated:
            if (self.m * self.n) % subgroup_size:
                raise ValueError(f"an emulated {self.m}x{self.n} tile needs a subgroup size dividing "
                                 f"{self.m * self.n}, got {subgroup_size}")
            lane = g.rem(g.tid(), subgroup_size)
            # (row, column) in the tile of each element this invocation owns
            self.owned = [(g.div(g.add(lane, self.sg * j), self.n), g.rem(g.add(lane, self.sg * j), self.n))
                          for j in range(self.m * self.n // self.sg)]
        else:
            self.a_t = mma_type(self.m, self.k, elem, "AOp")
            self.b_t = mma_type(self.k, self.n, elem, "BOp")
            self.c_t = mma_type(self.m, self.n, g.f32, "COp")

    @property
    def acc_count(self) -> int:
        return len(self.owned) if self.emulated else 1

    def zero(self) -> list[ir.Value]:
        if self.emulated:
            return [self.g.fconst(0.0)] * self.acc_count
        return [gpu.subgroup_mma_constant_matrix(self.c_t, self.g.fconst(0.0))]

    def mma(self, acc: list[ir.Value], a: ir.Value, a_at: Sequence[ir.Value], b: ir.Value,
            b_at: Sequence[ir.Value], b_transposed: bool = False) -> list[ir.Value]:
        """acc + A B for one k-step: A the m x k block of memref ``a`` at ``a_at`` (row,
        column), B the k x n block of ``b`` at ``b_at`` -- or, ``b_transposed``, B's
        transpose stored n x k there (K rows for q @ k^T)."""
        g = self.g
        if not self.emulated:
            ma = gpu.subgroup_mma_load_matrix(self.a_t, a, list(a_at), _lead(a))
            mb = gpu.subgroup_mma_load_matrix(self.b_t, b, list(b_at), _lead(b),
                                              **({"transpose": True} if b_transposed else {}))
            return [gpu.subgroup_mma_compute(ma, mb, acc[0])]

        def step(kk, sums):
            out = []
            for (r, c), s in zip(self.owned, sums):
                x = memref.load(a, [arith.addi(a_at[0], r), arith.addi(a_at[1], kk)])
                at = [arith.addi(b_at[0], c), arith.addi(b_at[1], kk)] if b_transposed else \
                    [arith.addi(b_at[0], kk), arith.addi(b_at[1], c)]
                y = memref.load(b, at)
                out.append(mmath.fma(arith.extf(g.f32, x), arith.extf(g.f32, y), s))
            return out

        return g.loop(0, self.k, 1, acc, step)

    def store(self, acc: list[ir.Value], c: ir.Value, at: Sequence[ir.Value]) -> None:
        """The m x n tile into f32 memref ``c`` at ``at`` (row, column)."""
        if not self.emulated:
            gpu.subgroup_mma_store_matrix(acc[0], c, list(at), _lead(c))
            return
        for (r, col), v in zip(self.owned, acc):
            memref.store(v, c, [arith.addi(at[0], r), arith.addi(at[1], col)])


def _lead(mem: ir.Value) -> int:
    """The leading dimension (row length) of a 2-D workgroup tile."""
    return ir.MemRefType(mem.type).shape[-1]
