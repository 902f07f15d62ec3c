"""kf-split-reductions: reductions over many elements as stages of reductions over few,
so that no GPU thread walks a long sequential chain.

Why, three reasons with one cure:

- precision: a sequential f32 sum of n elements can lose n/2 ulps of its result (the sum
  of ``ones(2**25)`` stops growing at 2^24); in stages of at most ``ROW`` elements the
  error bound is a few ``ROW`` ulps;
- parallelism: kf-fuse gives a reduction over all dims (or over leading dims) to the
  generic strategy, where one thread computes each output element -- for a full
  reduction one thread walks the whole tensor. fp8's amax (``max(abs(x))``,
  passes/apply_precision.py and kf.fp8_amax) over a 4x32x2048x128 tensor is then 2^25
  elements in one thread. Rows are what the rowwise strategy reduces in parallel (a
  workgroup a row);
- bounded loops: Mesa's lavapipe stops every shader invocation after 65535 loop
  iterations in all (llvmpipe's loop limiter), so a longer loop silently drops the rest
  of the elements (``torch.ones(65537).sum()`` gave 65535). After this pass a reduction
  loop of a generic thread runs at most ``ROW`` times, and a rowwise thread at most
  ``ROWWISE_ROW`` / threads times.

What it changes (test/passes/kf-split-reductions.mlir): ``kf.sum``, ``kf.mean``,
``kf.var``, ``kf.reduce_max``, ``kf.reduce_min`` (and ``kf.argmax``, below) whose reduced
element count n is above the op's stage bound: ``ROWWISE_ROW`` for a float reduction over trailing dims
that keeps some dims (the rowwise strategy's rows: a workgroup shares each row, so
layer norms over wide rows stay one kernel), ``ROW`` for every other one.

- Column reductions beside a row kernel (``column_block``): a float sum or mean over the
  leading dims of a tensor that a reduction over trailing dims reads too -- a norm's
  weight and bias gradients beside dx -- becomes ``[R, cols] -> [G, B, cols]``, the sums
  of each block of B rows (f32), then the sum of the G partial results, for any R with
  a divisor B in ``[R / (8 groups), R / groups]`` (``column-groups``: 256). kf-fuse
  gives the blocks' sums to the row kernel (``kf.passes.fuse.column_partial``), whose
  groups of threads each walk a block; the last stage reads G rows, not R. Without the
  split, one generic thread a column walked all R rows beside the row kernel.
- Full reductions: the tensor as rows ``[N / C, C]`` (C: the largest divisor of N up to
  ``ROW``, at least ``MIN_ROW``) reduced along the rows, repeated on the ``N / C``
  partial results until at most ``LAST_ROW`` are left, which one last row reduction
  (``[1, n]``) combines. The reshape goes below the cheap producers of the reduced
  tensor (``_producers``): a chain of elementwise ops, each with one operand of the full
  shape (the others rank 0), and the transposes and reshapes under it (a full reduction
  does not see the order of the elements) are rebuilt on the reshaped source. Why:
  kf-fuse keeps reshapes in the schedule as views, so a reshape between
  ``abs(cast(x))`` and the row reduction made fp8's amax write ``cast(x)`` and
  ``abs(cast(x))`` as f32 tensors for the row reductions to read; rebuilt, the first
  row reduction reads ``x`` once and fuses the chain. The original chain stays where
  something else uses it, and is erased where nothing does.
- Other reductions: runs of adjacent reduced dims are merged (a reshape), then the
  reduced dim r of largest extent E is split into ``[E / c, c]`` blocks with c such
  that the blocks' reduction (c times the other reduced dims' extent) stays within the
  bound; the partial results, with ``E / c`` in place of r, are then reduced over it.
  Where the other reduced dims alone exceed the bound, they are reduced first and r
  after. Every stage is split again while it is over its bound.
- Sizes with no divisor in ``[MIN_ROW, ROW]`` (primes, say): the first ``(E // c) * c``
  elements are split (``kf.slice``, then reshape) and the tail is reduced on its own and
  combined with the rest.
- ``kf.mean`` is the staged sum divided by n; ``kf.var`` two staged sums (the mean,
  then the squared deviations from it, as every kf kernel computes a variance).
- ``kf.argmax`` along a dim of more than ``ROW``: each block's maximum and argmax, then
  the argmax of the blocks' maxima, offset by the chosen block's own (``_argmax_stages``:
  the first occurrence, NaN the largest, as kf.argmax has it).

Partial results are f32 for f16/bf16/fp8 inputs (kf's policy: reductions accumulate in
f32, the result is rounded once) and i64 for sums of integers and booleans. Sums change
their order of additions (as any parallel reduction does); max and min are exact.
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir

from kf.dialects import BY_NAME, defining, spec_of
from kf.dialects import builders as kb
from kf.dialects.attrs import op_attrs
from kf.dialects.elements import LOW_PRECISION as _LOW_PRECISION

from .base import KfPass, PassError, user_functions

#: The longest reduction a generic thread runs, and the longest row of a full
#: reduction's stages. 8192: of rows of 4096, 8192 and 16384, the fastest and steadiest
#: for the seed's attention under precision="fp8" (4x32x2048x128, three amaxes of 2^25
#: elements: 4096 rows, then one row of the 4096 partials); bench/amax_stages.py measures
#: it, bench/RESULTS.md ("The amax's stages") has the numbers.
ROW = 8192
#: The most partial results the last stage of a full reduction reduces in one row (one
#: workgroup).
LAST_ROW = ROW
#: The longest row a rowwise kernel reduces as it is (its threads share it: 256 a row on
#: Vulkan, so at most 256 elements a thread and phase).
ROWWISE_ROW = 1 << 16
#: The shortest row worth a reshape into blocks (below it a slice and a tail are made).
MIN_ROW = 64

_SPLIT = ("kf.sum", "kf.mean", "kf.var", "kf.reduce_max", "kf.reduce_min")
#: Layout ops that only reorder the elements (a full reduction reads them in any order).
_REORDER = ("kf.transpose", "kf.reshape")
#: The longest producer chain rebuilt on the reshaped source.
MAX_CHAIN = 16


def _numel(shape) -> int:
    return math.prod(shape)


def _shape(v: ir.Value) -> list[int]:
    return list(spec_of(v.type).shape)


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


def _apply_chain(v: ir.Value, chain: list[ir.Operation]) -> ir.Value:
    """The chain's ops applied to v (some of the source's elements, in any shape)."""
    shape = _shape(v)
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


def _blocks(e: int, bound: int) -> tuple[int, int, int]:
    """(c, e // c, tail): blocks of c < e elements over an extent e, c at most bound:
    the largest divisor of e there if it is at least MIN_ROW (or half the bound, when
    that is smaller), else bound with a tail of e % bound elements."""
    for c in range(min(bound, e - 1), min(MIN_ROW, max(2, bound // 2)) - 1, -1):
        if e % c == 0:
            return c, e // c, 0
    return bound, e // bound, e % bound


def _reshape(v: ir.Value, shape: list[int]) -> ir.Value:
    """v in shape: v itself when it has it, else one kf.reshape (of v's own source when v
    is a reshape, which goes when nothing else uses it)."""
    if _shape(v) == list(shape):
        return v
    op = defining(v)
    if op is not None and op.name == "kf.reshape":
        out = _reshape(op.operands[0], shape)
        if not any(True for _ in v.uses):
            op.erase()
        return out
    return kb.reshape(v, shape)


class _Stages:
    """Builds the staged form of one reduction kind ("sum", "reduce_max", "reduce_min")
    at the insertion point, with partial results of element type elem."""

    def __init__(self, kind: str, elem: str):
        self.kind, self.elem = kind, elem

    def one(self, x: ir.Value, dims: list[int]) -> ir.Value:
        """One reduction op over dims (keepdim false)."""
        if self.kind == "sum":
            return kb.sum(x, dims=dims, keepdim=False, elem=self.elem)
        return getattr(kb, self.kind)(x, dims=dims, keepdim=False)

    def combine(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return {"sum": kb.add, "reduce_max": kb.max, "reduce_min": kb.min}[self.kind](a, b)

    @staticmethod
    def bound(x: ir.Value, dims: list[int]) -> int:
        spec = spec_of(x.type)
        trailing = dims == list(range(spec.rank - len(dims), spec.rank)) and len(dims) < spec.rank
        return ROWWISE_ROW if trailing and spec.is_float else ROW

    def reduce(self, x: ir.Value, dims: list[int]) -> ir.Value:
        """x reduced over dims (keepdim false), every stage within its bound."""
        shape = _shape(x)
        dims = sorted(dims)
        if _numel(shape[d] for d in dims) <= self.bound(x, dims):
            return self.one(x, dims)
        x, dims = _merge_adjacent(x, dims)
        shape = _shape(x)
        if len(dims) == len(shape):
            return self.full(x)
        r = max(dims, key=lambda d: (shape[d], d))
        e = shape[r]
        others = _numel(shape[d] for d in dims if d != r)
        pos = sum(1 for d in range(r) if d not in dims)  # r's place among the kept dims
        if others > self.bound(x, dims) // 2:  # even two slices along r are over the bound
            part = self.reduce(x, [d for d in dims if d != r])
            return self.reduce(part, [pos])
        c, o, tail = _blocks(e, self.bound(x, dims) // others)
        main = kb.slice(x, dim=r, start=0, end=o * c) if tail else x
        main = _reshape(main, shape[:r] + [o, c] + shape[r + 1:])
        part = self.reduce(main, [d + (d > r) for d in dims if d != r] + [r + 1])
        out = self.reduce(part, [pos])
        if tail:
            out = self.combine(out, self.reduce(kb.slice(x, dim=r, start=o * c, end=e), dims))
        return out

    def full(self, x: ir.Value, chain: list[ir.Operation] = ()) -> ir.Value:
        """A rank-0 reduction of all of x's elements (with the chain applied to them):
        rows of up to ROW elements, then the partial results the same way, then one row
        of at most LAST_ROW."""
        n = _numel(_shape(x))
        if n <= LAST_ROW:
            row = _apply_chain(_reshape(x, [1, n]), list(chain))
            return _reshape(self.one(row, [1]), [])
        c, o, tail = _blocks(n, ROW)
        flat = _reshape(x, [n]) if tail else x
        rows = _reshape(kb.slice(flat, dim=0, start=0, end=o * c) if tail else x, [o, c])
        out = self.full(self.one(_apply_chain(rows, list(chain)), [1]))
        if tail:
            rest = self.one(_apply_chain(kb.slice(flat, dim=0, start=o * c, end=n), list(chain)), [0])
            out = self.combine(out, rest)
        return out


def _argmax_stages(x: ir.Value, dim: int) -> tuple[ir.Value, ir.Value]:
    """(maximum, index of its first occurrence) along dim (keepdim false), in blocks of at
    most ROW: each block's maximum and argmax, then the argmax over the blocks' maxima
    picks the block (the first of equal maxima: the first occurrence; NaN counts as the
    largest, as kf.argmax and reduce_max have it), whose own argmax it offsets; a tail
    wins only with a larger maximum (or a first NaN)."""
    shape = _shape(x)
    e = shape[dim]
    if e <= ROW:
        return kb.reduce_max(x, dims=[dim], keepdim=False), kb.argmax(x, dim=dim, keepdim=False)
    c, o, tail = _blocks(e, ROW)
    main = kb.slice(x, dim=dim, start=0, end=o * c) if tail else x
    block_max, block_arg = _argmax_stages(_reshape(main, shape[:dim] + [o, c] + shape[dim + 1:]), dim + 1)
    best, which = _argmax_stages(block_max, dim)
    kept = shape[:dim] + [1] + shape[dim + 1:]
    inner = _reshape(kb.gather(block_arg, _reshape(which, kept), dim=dim), shape[:dim] + shape[dim + 1:])
    index = kb.add(kb.mul(which, kb.scalar(float(c), "i64")), inner)
    if not tail:
        return best, index
    t_max, t_arg = _argmax_stages(kb.slice(x, dim=dim, start=o * c, end=e), dim)
    larger = kb.cmp(t_max, best, predicate="gt")
    first_nan = kb.min(kb.cmp(t_max, t_max, predicate="ne"), kb.cmp(best, best, predicate="eq"))  # and
    take = kb.max(larger, first_nan)  # or
    return (kb.select(take, t_max, best),
            kb.select(take, kb.add(t_arg, kb.scalar(float(o * c), "i64")), index))


def _split_argmax(op: ir.Operation) -> bool:
    """kf.argmax along a dim longer than ROW as ``_argmax_stages``."""
    x = op.operands[0]
    spec = spec_of(x.type)
    if spec.rank == 0:
        return False
    dim = op_attrs(op)["dim"] % spec.rank
    if spec.shape[dim] <= ROW:
        return False
    with ir.InsertionPoint(op), op.location:
        best, index = _argmax_stages(x, dim)
        index = _reshape(index, list(spec_of(op.result.type).shape))
    op.result.replace_all_uses_with(index)
    op.erase()
    _erase_dead(best)  # the last stage's maximum: only the index is asked for
    return True


def _erase_dead(v: ir.Value) -> None:
    """Erase v's producer if nothing uses it, then the producers that leaves unused."""
    op = defining(v)
    if op is None or any(True for r in op.results for _ in r.uses):
        return
    inputs = list(op.operands)
    op.erase()
    for a in inputs:
        _erase_dead(a)


def _merge_adjacent(x: ir.Value, dims: list[int]) -> tuple[ir.Value, list[int]]:
    """x reshaped so that each run of adjacent reduced dims is one dim (a full reduction:
    1-D), with the reduced dims of the new shape."""
    shape = _shape(x)
    if len(dims) == len(shape):
        return _reshape(x, [_numel(shape)]), [0]
    new_shape, new_dims = [], []
    for d, s in enumerate(shape):
        if d in dims and d - 1 in dims:
            new_shape[-1] *= s
            continue
        if d in dims:
            new_dims.append(len(new_shape))
        new_shape.append(s)
    return _reshape(x, new_shape), new_dims


def _partial_elem(op: ir.Operation) -> str:
    """The element type of the partial results: f32 for narrow floats, i64 for sums of
    integers, the result's otherwise."""
    out = spec_of(op.result.type).elem
    if out in _LOW_PRECISION:
        return "f32"
    if op.name == "kf.sum" and out in ("i1", "i32"):
        return "i64"
    return out


def row_spaces(f: ir.Operation) -> set[tuple[int, ...]]:
    """The shapes that a float reduction over trailing dims of f reduces (softmax and
    log_softmax along the last dim included): the rows of f's rowwise kernels."""
    out = set()
    for op in f.regions[0].blocks[0].operations:
        op = op.operation
        if op.name not in _SPLIT and op.name not in ("kf.softmax", "kf.log_softmax"):
            continue
        spec = spec_of(op.operands[0].type)
        if spec.rank == 0 or not spec.is_float:
            continue
        attrs = op_attrs(op)
        if op.name in _SPLIT:
            dims = sorted({d % spec.rank for d in (attrs.get("dims") or range(spec.rank))})
        else:
            dims = [attrs["dim"] % spec.rank]
        if len(dims) < spec.rank and dims == list(range(spec.rank - len(dims), spec.rank)):
            out.add(tuple(spec.shape))
    return out


def column_block(op: ir.Operation, groups: int, spaces: set = frozenset()) -> int:
    """The rows of a block of a column reduction (``_split``'s first rule), or 0 where it
    is not one or its rows are too few to split: a float kf.sum or kf.mean over the
    leading dims of a tensor of rank >= 2 whose shape is one of ``spaces``, the rows a
    rowwise kernel reduces too (a norm's weight and bias gradients, ``sum(dy * xhat,
    0)``, beside dx: that kernel computes the blocks' sums), R rows in all, blocks of B
    rows with B the largest divisor of R up to R / groups, at least 2 and giving at most
    8 x groups blocks (a prime count of rows stays whole: blocks of one row would be
    partial results as large as the tensor). Other column reductions stay one generic
    kernel's (bias + GELU's bias gradient: kf-fuse gives it the elementwise chain)."""
    x = op.operands[0]
    spec = spec_of(x.type)
    if op.name not in ("kf.sum", "kf.mean") or spec.rank < 2 or not spec.is_float or groups < 1 \
            or tuple(spec.shape) not in spaces:
        return 0
    dims = sorted({d % spec.rank for d in (op_attrs(op).get("dims") or range(spec.rank))})
    if dims != list(range(len(dims))) or len(dims) == spec.rank:
        return 0
    rows = _numel(spec.shape[:len(dims)])
    for b in range(rows // groups, max(1, -(-rows // (8 * groups)) - 1), -1):
        if rows % b == 0:
            return b
    return 0


def _split(op: ir.Operation, groups: int = 0, spaces: set = frozenset()) -> bool:
    """Rewrite one reduction (at its own insertion point); False where it is within its
    stage bound and no column reduction to split (``column_block``)."""
    x = op.operands[0]
    spec = spec_of(x.type)
    if op.name not in _SPLIT or spec.rank == 0:
        return False
    attrs = op_attrs(op)
    dims = sorted({d % spec.rank for d in (attrs.get("dims") or range(spec.rank))})
    n = _numel(spec.shape[d] for d in dims)
    block = column_block(op, groups, spaces)
    if n <= _Stages.bound(x, dims) and not block:
        return False
    out = spec_of(op.result.type)
    elem = _partial_elem(op)
    full = len(dims) == spec.rank
    with ir.InsertionPoint(op), op.location:
        if block:
            # [R, cols] as [R / B, B, cols]: each block's column sums (the partial results,
            # what a rowwise kernel computes beside its rows: kf-fuse), then their sum
            cols = list(spec.shape[len(dims):])
            blocks = _reshape(x, [n // block, block] + cols)
            v = _Stages("sum", elem).reduce(kb.sum(blocks, dims=[1], keepdim=False, elem=elem), [0])
            if op.name == "kf.mean":
                v = kb.div(v, kb.scalar(float(n), elem))
        elif op.name in ("kf.sum", "kf.reduce_max", "kf.reduce_min"):
            stages = _Stages(op.name.removeprefix("kf."), elem)
            if full:
                source, chain = _producers(x)
                v = stages.full(source, chain)
            else:
                v = stages.reduce(x, dims)
        else:
            stages = _Stages("sum", elem)
            mean = kb.div(stages.reduce(x, dims), kb.scalar(float(n), elem))
            if op.name == "kf.mean":
                v = mean
            else:
                kept = [1 if d in dims else s for d, s in enumerate(spec.shape)]
                dev = kb.sub(kb.cast(x, elem) if spec.elem != elem else x, _reshape(mean, kept))
                dof = n - float(attrs.get("correction", 1.0))
                v = kb.div(stages.reduce(kb.mul(dev, dev), dims), kb.scalar(dof, elem))
        if spec_of(v.type).elem != out.elem:
            v = kb.cast(v, out.elem)
        v = _reshape(v, list(out.shape))
    op.result.replace_all_uses_with(v)
    op.erase()
    _erase_unused(x)
    return True


@dataclasses.dataclass(frozen=True)
class SplitReductionsPass(KfPass):
    NAME = "kf-split-reductions"
    DESCRIPTION = "reductions over many elements as stages of short ones (reshape into blocks, reduce, reduce the partials)"

    #: the blocks a column reduction's rows are split into, at most (``column_block``):
    #: a rowwise kernel beside it computes one block's partial sums a group of its
    #: threads, so the blocks are the groups it has to spread over the GPU, and their
    #: partial results what the last stage reads (0: column reductions are split only
    #: where they are over the stage bound, as any reduction)
    column_groups: int = 256

    def run(self, module: ir.Operation) -> None:
        if self.column_groups < 0:
            raise PassError(f"column-groups must be 0 (no column blocks) or positive, got {self.column_groups}",
                            module.location)
        for f in user_functions(module):
            spaces = row_spaces(f)
            for op in list(f.regions[0].blocks[0].operations):
                op = op.operation
                if op.name in _SPLIT:
                    _split(op, self.column_groups, spaces)
                elif op.name == "kf.argmax":
                    _split_argmax(op)
