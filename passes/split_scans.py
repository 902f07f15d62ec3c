"""kf-split-scans: a scan along many elements as a scan of blocks, a scan of the blocks'
totals and one combine, so that no GPU thread walks a long sequential chain.

A ``kf.scan`` (cumsum, cumprod, cummax/cummin, logcumsumexp) is a generic kernel whose
output element i walks elements 0..i: O(n^2) work a row, and for a cumsum over a
100,000-element vector a last thread of 100,000 dependent steps. That is slow on every
GPU, loses precision (a sequential f32 sum of n elements drifts by up to n/2 ulps) and
on Mesa's lavapipe is refused outright (llvmpipe stops a shader invocation after 65535
loop iterations).

The two-pass scan (as CUB's and Thrust's block scans reduce then scan the block totals),
for a scan of n > ``MAX_LENGTH`` elements along dim d:

1. blocks of B elements: B the largest divisor of n in ``[MIN_BLOCK, BLOCK]``, else
   ``BLOCK`` with the dim padded to a multiple of it by zeros (they come after every
   kept element, so no kept result reads them); the dim as ``[.., n / B, B, ..]`` (a
   reshape), scanned along the block (B steps a thread, a thread a block);
2. each block's total (its scan's last element) scanned along the blocks, and shifted
   by one block: what comes before each block, and before the first the scan's start
   (0, 1, -inf; for max and min the row's first element, which the first block's
   running values already hold: exact in every type, where int64's bounds are not
   numbers a fill holds);
3. every element combined with what comes before its block (one elementwise kernel),
   the padding sliced off.

The scan of the totals (n / B elements) is split again while it is longer than
``MAX_LENGTH``. Combining is the scan's own step: add, mul, max, min, or for logsumexp
``hi + log(1 + exp(lo - hi))`` (``hi`` itself where it is infinite, as kf.scan's step
and torch.logcumsumexp have it). f16 and bf16 scans are computed in f32 and rounded once
(kf.scan accumulates them in f32 too); integer scans are exact in any order; float sums
and products change their order of operations, as any parallel scan does.

Scans whose dim is a run-time size are left as they are (the blocks need its length).
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.elements import LOW_PRECISION
from kf.dialects.types import DYN

from .base import KfPass, user_functions

#: The longest scan left as it is (one thread's loop), and the blocks' length: at most
#: BLOCK, at least MIN_BLOCK where a divisor of the length is taken.
MAX_LENGTH = 2048
BLOCK = 256
MIN_BLOCK = 128


def _combine(kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """a (the running value before) combined with b by a scan of kind (a broadcasts)."""
    if kind == "sum":
        return kb.add(a, b)
    if kind == "prod":
        return kb.mul(a, b)
    if kind in ("max", "min"):
        return getattr(kb, kind)(a, b)
    # logsumexp: max + log(1 + exp(min - max)); the max itself where it is infinite
    hi, lo = kb.max(a, b), kb.min(a, b)
    elem = spec_of(hi.type).elem
    r = kb.add(hi, kb.log(kb.add(kb.scalar(1.0, elem), kb.exp(kb.sub(lo, hi)))))
    infinite = kb.cmp(kb.abs(hi), kb.scalar(math.inf, elem), predicate="eq")
    return kb.select(infinite, hi, r)


def _scan(x: ir.Value, dim: int, kind: str) -> ir.Value:
    return kb.build("scan", [x], {"dim": dim, "kind": kind}).result


#: what comes before the first block, for the scans whose start is a number
_START = {"sum": 0.0, "prod": 1.0, "logsumexp": -math.inf}


def block_length(n: int) -> int:
    """The blocks' length for a scan of n elements: the largest divisor of n in
    [MIN_BLOCK, BLOCK], else BLOCK (and padding)."""
    for b in range(BLOCK, MIN_BLOCK - 1, -1):
        if n % b == 0:
            return b
    return BLOCK


def blocked_scan(x: ir.Value, dim: int, kind: str) -> ir.Value:
    """The inclusive scan of kind along dim of a static x, in blocks (the module
    docstring's steps), at the current insertion point."""
    spec = spec_of(x.type)
    shape = list(spec.shape)
    n = shape[dim]
    if n <= MAX_LENGTH:
        return _scan(x, dim, kind)
    b = block_length(n)
    blocks = -(-n // b)
    one = shape[:dim] + [1] + shape[dim + 1:]
    first = kb.slice(x, dim=dim, start=0, end=1, step=1) if kind in ("max", "min") else \
        kb.fill(one, spec.elem, _START[kind])
    if blocks * b != n:
        x = kb.concat([x, kb.fill(shape[:dim] + [blocks * b - n] + shape[dim + 1:], spec.elem, 0.0)], dim=dim)
    inner = _scan(kb.reshape(x, shape[:dim] + [blocks, b] + shape[dim + 1:]), dim + 1, kind)
    last = kb.slice(inner, dim=dim + 1, start=b - 1, end=b, step=1)
    totals = blocked_scan(kb.reshape(last, shape[:dim] + [blocks] + shape[dim + 1:]), dim, kind)
    before = kb.concat([first, kb.slice(totals, dim=dim, start=0, end=blocks - 1, step=1)], dim=dim)
    before = kb.reshape(before, shape[:dim] + [blocks, 1] + shape[dim + 1:])
    out = kb.reshape(_combine(kind, before, inner), shape[:dim] + [blocks * b] + shape[dim + 1:])
    return out if blocks * b == n else kb.slice(out, dim=dim, start=0, end=n, step=1)


def split_scan(op: ir.Operation) -> bool:
    """Rewrite one kf.scan in blocks where its dim is static and longer than MAX_LENGTH."""
    x = op.operands[0]
    spec = spec_of(x.type)
    attrs = op_attrs(op)
    dim = int(attrs["dim"]) % spec.rank
    if DYN in spec.shape or spec.shape[dim] <= MAX_LENGTH:
        return False
    kind = str(attrs["kind"])
    with ir.InsertionPoint(op), op.location:
        wide = spec.elem in LOW_PRECISION
        v = blocked_scan(kb.cast(x, "f32") if wide else x, dim, kind)
        if wide:
            v = kb.cast(v, spec.elem)
    op.result.replace_all_uses_with(v)
    op.erase()
    return True


@dataclasses.dataclass(frozen=True)
class SplitScansPass(KfPass):
    NAME = "kf-split-scans"
    DESCRIPTION = "scans along many elements as a scan of blocks, a scan of their totals and a combine"

    def run(self, module: ir.Operation) -> None:
        for f in user_functions(module):
            for op in list(f.regions[0].blocks[0].operations):
                op = op.operation
                if op.name == "kf.scan":
                    split_scan(op)
