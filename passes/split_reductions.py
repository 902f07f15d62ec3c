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
``N / C`` partial results until at most ``LAST_ROW`` are left, which one last row reduction
(``[1, n]``) combines; the result is reshaped to the original result's shape (rank 0,
or all ones with keepdim). Sums change their order of additions (as any parallel
reduction does); max and min are exact. Tensors whose element count has no divisor in
``[MIN_ROW, ROW]`` are left alone.

The reshape goes below the cheap producers of the reduced tensor: a chain of
elementwise ops, each with one operand of the full shape (the others rank 0), and the
transposes and reshapes under it (a full reduction does not see the order of the
elements) are rebuilt on the reshaped source. Why: kf-fuse keeps reshapes in the
schedule as views, so a reshape between ``abs(cast(x))`` and the row reduction made
fp8's amax write ``cast(x)`` and ``abs(cast(x))`` as f32 tensors (2.5x the bytes of a bf16
``x``) for the row reductions to read, and its transposed V took its own transpose
kernel; rebuilt, the first row reduction reads ``x`` once and fuses the chain. The
original chain stays where something else uses it (the quantization's ``cast(x)``), and
is erased where nothing does.
"""

from __future__ import annotations

import dataclasses

from mlir import ir

from kf.dialects import BY_NAME, defining, spec_of
from kf.dialects import builders as kb
from kf.dialects.attrs import op_attrs

from .base import KfPass, user_functions

#: Elements below which a full reduction stays one generic kernel.
MIN_ELEMENTS = 1 << 16
#: The longest row of a split (a workgroup reduces one). 8192: the seed's attention
#: under precision="fp8" (4x32x2048x128, three amaxes of 2^25 elements: 4096 rows, then
#: one row of the 4096 partials) took 0.696 ms a call in both repetitions of a same-process
#: A/B on the H200, against 0.707-0.753 with rows of 4096 (three stages), 0.729-0.732
#: with 4096 and a last row of up to 16384, 0.695-0.722 with 16384
#: (bench/amax_stages.py; bench/results/amax-stages-ab-2026-12-04.json).
ROW = 8192
#: The most partial results the last stage reduces in one row (one workgroup).
LAST_ROW = ROW
#: The shortest row worth a split.
MIN_ROW = 64

_SPLIT = ("kf.sum", "kf.reduce_max", "kf.reduce_min")
#: Layout ops that only reorder the elements (a full reduction reads them in any order).
_REORDER = ("kf.transpose", "kf.reshape")
#: The longest producer chain rebuilt on the reshaped source.
MAX_CHAIN = 16


def _producers(x: ir.Value) -> tuple[ir.Value, list[ir.Operation]]:
    """(source, elementwise chain from source to x): the values of x are those of the
    chain applied to source's elements, in some order."""
    chain: list[ir.Operation] = []
    v = x
    while len(chain) < MAX_CHAIN:
        op = defining(v)
        if op is None:
            break
        if op.name in _REORDER:
            v = op.operands[0]
            continue
        spec = BY_NAME.get(op.name)
        if spec is None or spec.category != "elementwise" or len(op.results) != 1:
            break
        n = _numel(spec_of(v.type).shape)
        full = [a for a in op.operands if _numel(spec_of(a.type).shape) == n and spec_of(a.type).rank > 0]
        rest = [a for a in op.operands if spec_of(a.type).rank > 0 and a not in full]
        if len(full) != 1 or rest or spec_of(full[0].type).shape != spec_of(v.type).shape:
            break
        chain.append(op)
        v = full[0]
    return v, chain[::-1]


def _rebuild(source: ir.Value, chain: list[ir.Operation], shape: list[int]) -> ir.Value:
    """source reshaped to shape with the chain applied (new ops, at the insertion point)."""
    v = kb.reshape(source, shape)
    for op in chain:
        full = _numel(spec_of(op.result.type).shape)
        operands = [v if spec_of(a.type).rank > 0 and _numel(spec_of(a.type).shape) == full else a
                    for a in op.operands]
        v = kb.build(op.name, operands, op_attrs(op), [spec_of(op.result.type).with_shape(shape)]).result
    return v


def _erase_unused(v: ir.Value) -> None:
    """Erase v's producers (elementwise and reorderings) that nothing uses any more."""
    op = defining(v)
    while op is not None and not any(True for r in op.results for _ in r.uses) and (
            op.name in _REORDER or getattr(BY_NAME.get(op.name), "category", "") == "elementwise"):
        inputs = list(op.operands)
        op.erase()
        nxt = [a for a in inputs if spec_of(a.type).rank > 0]
        op = defining(nxt[0]) if len(nxt) == 1 else None


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
    while m > LAST_ROW or not rows:  # each stage's row length, decided before anything is built
        c = _row_length(m)
        if c is None:
            return False
        rows.append(c)
        m //= c
    source, chain = _producers(x)
    stages = rows + [m]  # the last stage: one row of what is left
    v, m = x, n
    with ir.InsertionPoint(op), op.location:
        for i, c in enumerate(stages):
            shape = [m // c, c]
            v = getattr(kb, name)(_rebuild(source, chain, shape) if i == 0 else kb.reshape(v, shape),
                                  dims=[1], keepdim=False)
            m //= c
        v = kb.reshape(v, list(spec_of(op.result.type).shape))
    op.result.replace_all_uses_with(v)
    op.erase()
    _erase_unused(x)
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
        for f in user_functions(module):
            for op in list(f.regions[0].blocks[0].operations):
                op = op.operation
                if op.name in _SPLIT:
                    _split(op)
