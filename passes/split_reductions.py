"""kf-split-reductions: a reduction over every element of a large tensor as reductions
over rows, so that GPU kernels reduce it in parallel.

Why: kf-fuse gives a reduction over all dims to the generic strategy, where one thread
computes each output element -- for a full reduction one thread walks the whole tensor.
fp8's amax (``max(abs(x))``, passes/apply_precision.py and kf.fp8_amax) over a
4x32x2048x128 tensor took ~0.56 s a tensor that way on the H200 (the seed's attention
under ``precision="fp8"``: 1.69 s a call, bench/fp8_attention.py). Rows are what the
rowwise strategy reduces in parallel (a workgroup a row).

What it changes (test/passes/kf-split-reductions.mlir): ``kf.sum``, ``kf.reduce_max``
and ``kf.reduce_min`` over every dim of a float tensor of at least ``MIN_ELEMENTS``
elements become ``reshape`` to ``[N / C, C]`` (C: the largest divisor of N up to
``ROW``, at least ``MIN_ROW``) and the same reduction over the last dim, repeated on the
``N / C`` partial results until at most ``ROW`` are left, which one last row reduction
(``[1, n]``) combines; the result is reshaped to the original result's shape (rank 0,
or all ones with keepdim). Sums change their order of additions (as any parallel
reduction does); max and min are exact. Tensors whose element count has no divisor in
``[MIN_ROW, ROW]`` are left alone.
"""

from __future__ import annotations

import dataclasses

from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs

from .base import KfPass

#: Elements below which a full reduction stays one generic kernel.
MIN_ELEMENTS = 1 << 16
#: The longest row of a split (a workgroup reduces one).
ROW = 4096
#: The shortest row worth a split.
MIN_ROW = 64

_SPLIT = ("kf.sum", "kf.reduce_max", "kf.reduce_min")


def _row_length(n: int) -> int | None:
    for c in range(min(ROW, n), MIN_ROW - 1, -1):
        if n % c == 0:
            return c
    return None


def _split(op: ir.Operation) -> bool:
    """Rewrite one full reduction (at its own insertion point); False where it does not apply."""
    x = op.operands[0]
    spec = spec_of(x.type)
    if op.name not in _SPLIT or not spec.is_float or spec.rank == 0:
        return False
    dims = sorted(d % spec.rank for d in (op_attrs(op).get("dims") or range(spec.rank)))
    n = _numel(spec.shape)
    if dims != list(range(spec.rank)) or n < MIN_ELEMENTS:
        return False
    name = op.name.removeprefix("kf.")
    rows, m = [], n
    while m > ROW:  # the row length of each stage, decided before anything is built
        c = _row_length(m)
        if c is None:
            return False
        rows.append(c)
        m //= c
    v, m = x, n
    with ir.InsertionPoint(op), op.location:
        for c in rows:
            v = getattr(kb, name)(kb.reshape(v, [m // c, c]), dims=[1], keepdim=False)
            m //= c
        v = getattr(kb, name)(kb.reshape(v, [1, m]), dims=[1], keepdim=False)
        v = kb.reshape(v, list(spec_of(op.result.type).shape))
    op.result.replace_all_uses_with(v)
    op.erase()
    return True


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclasses.dataclass(frozen=True)
class SplitReductionsPass(KfPass):
    NAME = "kf-split-reductions"
    DESCRIPTION = "full reductions of large tensors as parallel row reductions (reshape, reduce rows, reduce the partials)"

    def run(self, module: ir.Operation) -> None:
        body = module.regions[0].blocks[0]
        for f in list(body.operations):
            f = f.operation
            if f.name != "func.func" or "kf.kernel" in f.attributes or not f.regions[0].blocks:
                continue
            for op in list(f.regions[0].blocks[0].operations):
                op = op.operation
                if op.name in _SPLIT:
                    _split(op)
