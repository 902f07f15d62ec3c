"""Handlers of sort and argsort (stable, descending, NaN ordered as torch orders it:
greater than every number) from kf ops that compile on every target: each element's
rank along the dim (how many elements come before it) from an all-pairs comparison,
then the elements and their positions scattered to their ranks (kf.scatter_reduce).
O(n^2) per row in work, so rows are limited to ``SORT_ROW_LIMIT``. Each rank's sum
reads its comparisons as they are computed (nothing of n x n in memory): a row of up
to ``ROW_BLOCK`` in one sum, a longer one as sums over blocks of ``ROW_BLOCK`` elements
and a sum of those (kf-split-reductions would split a longer sum itself, but after the
comparisons, which it would then read as an n x n tensor)."""

from __future__ import annotations

import math

import torch

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..dtypes import kf_elem
from ..errors import Unsupported
from .core import fake_value, handles, rank_of, shape_of
from .reductions import bound_args

#: the longest row sort compiles (n^2 comparisons a row: 4.3e9 at 65536, a vocabulary's
#: logits for top-p sampling)
SORT_ROW_LIMIT = 1 << 16
#: the most comparisons one sum of a rank reads: kf-split-reductions' ``ROW``, the
#: longest sum it leaves whole
ROW_BLOCK = 8192


def _and(a, b):
    return kb.select(a, b, kb.scalar(False, "i1"))


def _or(a, b):
    return kb.select(a, kb.scalar(True, "i1"), b)


def _comes_first(a, b, descending: bool):
    """a sorts strictly before b (NaN above every number, as torch.sort places it)."""
    op = "gt" if descending else "lt"
    if not spec_of(a.type).is_float:
        return kb.cmp(a, b, predicate=op)
    a_nan, b_nan = kb.cmp(a, a, predicate="ne"), kb.cmp(b, b, predicate="ne")
    # descending: a NaN before any number; ascending: any number before a NaN
    nan_first = _and(a_nan, kb.cmp(b_nan, kb.scalar(False, "i1"), predicate="eq")) if descending else \
        _and(kb.cmp(a_nan, kb.scalar(False, "i1"), predicate="eq"), b_nan)
    return _or(kb.cmp(a, b, predicate=op), nan_first)


def _ties(a, b):
    same = kb.cmp(a, b, predicate="eq")
    if not spec_of(a.type).is_float:
        return same
    return _or(same, _and(kb.cmp(a, a, predicate="ne"), kb.cmp(b, b, predicate="ne")))


def _before(k, j, kk, kj, descending: bool):
    """Element k (at position kk) sorts before element j (at kj): stably, a tie before it
    in the row does."""
    return _or(_comes_first(k, j, descending), _and(_ties(k, j), kb.cmp(kk, kj, predicate="lt")))


def _ranks(keys, lead: tuple, n: int, descending: bool):
    """Each element's rank along the last dim of keys (``lead + (n,)``): how many elements
    sort before it (stably: a tie earlier in the row does), i64 of keys' shape."""
    r = len(lead) + 1
    blocks = -(-n // ROW_BLOCK)
    # the positions are iotas of the keys' own lead dims, so that their comparison fuses
    # into the sum as the keys' do
    if blocks == 1:
        j = kb.reshape(keys, (*lead, n, 1))   # the element ranked
        k = kb.reshape(keys, (*lead, 1, n))   # every element it is compared with
        kj, kk = kb.iota((*lead, n, 1), r - 1), kb.iota((*lead, 1, n), r)
        before = _before(k, j, kk, kj, descending)
        return kb.sum(kb.cast(before, "i64"), dims=[r], keepdim=False, elem="i64")
    # the compared elements as blocks of ROW_BLOCK (the last padded; padding never counts)
    pad = blocks * ROW_BLOCK - n
    elem = spec_of(keys.type).elem
    padded = kb.concat([keys, kb.fill((*lead, pad), elem, 0.0)], dim=r - 1) if pad else keys
    j = kb.reshape(keys, (*lead, n, 1, 1))
    k = kb.reshape(padded, (*lead, 1, blocks, ROW_BLOCK))
    kj = kb.iota((*lead, n, 1, 1), r - 1)
    kk = kb.add(kb.mul(kb.iota((*lead, 1, blocks, ROW_BLOCK), r), kb.scalar(float(ROW_BLOCK), "i64")),
                kb.iota((*lead, 1, blocks, ROW_BLOCK), r + 1))
    before = _before(k, j, kk, kj, descending)
    if pad:
        before = _and(kb.cmp(kk, kb.scalar(float(n), "i64"), predicate="lt"), before)
    partial = kb.sum(kb.cast(before, "i64"), dims=[r + 1], keepdim=False, elem="i64")
    return kb.sum(partial, dims=[r], keepdim=False, elem="i64")


def sorted_along(x, dim: int, descending: bool):
    """(values, int64 positions) of x sorted stably along dim."""
    r = rank_of(x)
    if r == 0:
        return x, kb.fill((), "i64", 0.0)
    n = shape_of(x)[dim]
    if n > SORT_ROW_LIMIT:
        raise Unsupported(f"sort of rows of {n} elements is not supported by kf (at most {SORT_ROW_LIMIT})",
                          cause="kf sorts a row by comparing every pair of its elements")
    perm = [d for d in range(r) if d != dim] + [dim]
    inverse = [perm.index(d) for d in range(r)]
    xt = kb.transpose(x, perm=perm) if dim != r - 1 else x
    lead = shape_of(xt)[:-1]
    keys = kb.cast(xt, "i32") if spec_of(xt.type).elem == "i1" else xt  # i1 compares signed: true < false
    rank = _ranks(keys, lead, n, descending)
    where = kb.broadcast_to(kb.iota((n,), 0), shape_of(xt)) if lead else kb.iota((n,), 0)

    def scatter(src):
        return kb.build("scatter_reduce", [src, rank, src], {"dim": r - 1, "reduce": "none",
                                                             "include_self": True}).result

    values, positions = scatter(xt), scatter(where)
    if dim != r - 1:
        values, positions = kb.transpose(values, perm=inverse), kb.transpose(positions, perm=inverse)
    return values, positions


@handles("aten.sort.default", "aten.sort.stable")
def _sort(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    x = p["self"]
    dim = int(p.get("dim", -1)) % max(rank_of(x), 1)
    return sorted_along(x, dim, bool(p.get("descending") or False))


@handles("aten.argsort.default", "aten.argsort.stable")
def _argsort(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    x = p["self"]
    dim = int(p.get("dim", -1)) % max(rank_of(x), 1)
    positions = sorted_along(x, dim, bool(p.get("descending") or False))[1]
    return kb.reshape(positions, tuple(fake_value(node).shape)) if rank_of(x) == 0 else positions


@handles("aten.msort.default")
def _msort(c, node, args, kwargs):
    """torch.msort: the values of a sort along dim 0."""
    return sorted_along(args[0], 0, False)[0]


def _rows_last(x, dim):
    """x with dim moved last (a 0-d x as one element) and that dim's index."""
    if rank_of(x) == 0:
        return kb.reshape(x, (1,)), 0
    dim %= rank_of(x)
    r = rank_of(x)
    if dim == r - 1:
        return x, r - 1
    return kb.transpose(x, perm=[d for d in range(r) if d != dim] + [dim]), r - 1


def _pick(node, values, positions, at):
    """(value, position) at sorted position ``at`` (i64, the rows' shape with a last dim
    of 1) of each row, shaped as torch's results (keepdim or not)."""
    out = fake_value(node)
    shapes = [tuple(v.shape) for v in out] if isinstance(out, (tuple, list)) else [tuple(out.shape)]
    picked = [kb.gather(values, at, dim=rank_of(values) - 1), kb.gather(positions, at, dim=rank_of(values) - 1)]
    return [kb.reshape(v, s) for v, s in zip(picked, shapes)]


def _nan_count(x):
    """How many NaNs each row (last dim) holds, i64 with a last dim of 1."""
    r = rank_of(x)
    if not spec_of(x.type).is_float:
        return kb.fill(shape_of(x)[:-1] + (1,), "i64", 0.0)
    return kb.sum(kb.cast(kb.cmp(x, x, predicate="ne"), "i64"), dims=[r - 1], keepdim=True, elem="i64")


def _row_constant(x, value: int):
    return kb.fill(shape_of(x)[:-1] + (1,), "i64", float(value))


@handles("aten.kthvalue.default")
def _kthvalue(c, node, args, kwargs):
    """kthvalue: the k-th smallest of each row (NaN the greatest) and its position, from
    kf's stable sort."""
    p = bound_args(node, args, kwargs)
    x, dim = _rows_last(p["self"], int(p["dim"]))
    k, n = int(p["k"]), shape_of(x)[-1]
    if not 1 <= k <= n:
        raise Unsupported(f"kthvalue: k={k} is out of range for a dimension of size {n}",
                          cause="k counts from 1 to the dimension's size")
    values, positions = sorted_along(x, dim, False)
    return tuple(_pick(node, values, positions, _row_constant(x, k - 1)))


@handles("aten.median.dim", "aten.median.default", "aten.nanmedian.dim", "aten.nanmedian.default")
def _median(c, node, args, kwargs):
    """median / nanmedian: the lower median, element (n - 1) // 2 of each sorted row, and
    its position. median: a row with a NaN gives its first NaN (sorted last, in order);
    nanmedian: the lower median of the row's numbers (a NaN if it has none). Over no
    elements (the whole-tensor forms) the value is NaN, as torch's."""
    p = bound_args(node, args, kwargs)
    whole = p.get("dim") is None
    x = kb.reshape(p["self"], (math.prod(shape_of(p["self"])),)) if whole else p["self"]
    x, dim = _rows_last(x, 0 if whole else int(p["dim"]))
    n = shape_of(x)[-1]
    if n == 0:
        return kb.fill((), spec_of(x.type).elem, math.nan)
    values, positions = sorted_along(x, dim, False)
    nans, size = _nan_count(x), _row_constant(x, n)
    one = kb.scalar(1.0, "i64")
    if node.target._opname == "median":
        lower = _row_constant(x, (n - 1) // 2)
        at = kb.select(kb.cmp(nans, kb.scalar(0.0, "i64"), predicate="gt"), kb.sub(size, nans), lower)
    else:  # (numbers - 1) // 2 of numbers >= 1 (0 for none); exact in f32 for rows this short
        numbers = kb.sub(size, nans)
        half = kb.mul(kb.cast(kb.max(kb.sub(numbers, one), kb.scalar(0.0, "i64")), "f32"), kb.scalar(0.5, "f32"))
        at = kb.cast(half, "i64")
    picked = _pick(node, values, positions, at)
    return picked[0] if whole else tuple(picked)


@handles("aten.mode.default")
def _mode(c, node, args, kwargs):
    """mode: the most frequent value of each row (the smallest of those that tie) and
    the position of its last occurrence (torch names no particular one): in the stably
    sorted row, each element's count of equal elements (all pairs compared), the first
    element with the greatest count, and the end of its run."""
    p = bound_args(node, args, kwargs)
    x, dim = _rows_last(p["self"], int(p["dim"]))
    n = shape_of(x)[-1]
    values, positions = sorted_along(x, dim, False)
    lead = shape_of(values)[:-1]
    keys = kb.cast(values, "i32") if spec_of(values.type).elem == "i1" else values
    same = _ties(kb.reshape(keys, (*lead, n, 1)), kb.reshape(keys, (*lead, 1, n)))
    count = kb.sum(kb.cast(same, "i64"), dims=[len(lead) + 1], keepdim=False, elem="i64")
    first = kb.argmax(count, dim=len(lead), keepdim=True)
    best = kb.reduce_max(count, dims=[len(lead)], keepdim=True)
    at = kb.sub(kb.add(first, best), kb.scalar(1.0, "i64"))
    return tuple(_pick(node, values, positions, at))


@handles("aten.searchsorted.Tensor", "aten.searchsorted.Scalar", "aten.bucketize.Tensor")
def _searchsorted(c, node, args, kwargs):
    """torch.searchsorted / torch.bucketize as torch's kernels search: a binary search of
    each value in its row of the sorted sequence, ceil(log2(n + 1)) steps of kf ops (a
    checked gather of the middle elements, then the halving), stepping right where
    ``!(middle >= value)`` (``side='left'``) or ``!(middle > value)`` (``right``) -- so a
    NaN value is placed after every element, and a NaN in the sequence counts as smaller
    where the search meets it, as in torch. ``sorter`` orders the sequence first."""
    p = bound_args(node, args, kwargs)
    name = node.target._opname
    seq, values = (p["boundaries"], p["self"]) if name == "bucketize" else (p["sorted_sequence"], p["self"])
    right = bool(p.get("right")) or p.get("side") == "right"
    out = fake_value(node)
    raw = bound_args(node, node.args, node.kwargs)  # the fx nodes, for their dtypes

    def dtype(a):
        return fake_value(a).dtype if isinstance(a, torch.fx.Node) else torch.tensor(a).dtype

    seq_arg = raw["boundaries" if name == "bucketize" else "sorted_sequence"]
    elem = kf_elem(torch.promote_types(dtype(seq_arg), dtype(raw["self"])))
    seq = c.tensor(seq, elem)
    if p.get("sorter") is not None:
        seq = kb.gather(seq, p["sorter"], dim=-1)
    out_shape = tuple(out.shape)
    values = kb.reshape(c.tensor(values, elem), out_shape)
    n = shape_of(seq)[-1]
    start = kb.fill(out_shape, "i64", 0.0)
    if n == 0 or math.prod(out_shape) == 0:
        return c.tensor(start, kf_elem(out.dtype))
    end = kb.fill(out_shape, "i64", float(n))
    one_row = rank_of(seq) == 1
    v_nan = kb.cmp(values, values, predicate="ne")
    for _ in range(n.bit_length()):
        active = kb.cmp(start, end, predicate="lt")
        half = kb.cast(kb.mul(kb.cast(kb.sub(end, start), "f64"), kb.scalar(0.5, "f64")), "i64")
        mid = kb.min(kb.add(start, half), kb.scalar(float(n - 1), "i64"))
        if one_row:
            m = kb.reshape(kb.index_select(seq, kb.reshape(mid, (math.prod(out_shape),)), dim=0), out_shape)
        else:
            m = kb.gather(seq, mid, dim=-1)
        step = _or(_or(kb.cmp(m, values, predicate="le" if right else "lt"), kb.cmp(m, m, predicate="ne")), v_nan)
        start = kb.select(_and(active, step), kb.add(mid, kb.scalar(1.0, "i64")), start)
        end = kb.select(_and(active, kb.cmp(step, kb.scalar(False, "i1"), predicate="eq")), mid, end)
    return c.tensor(start, kf_elem(out.dtype))
