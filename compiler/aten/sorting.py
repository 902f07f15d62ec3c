"""Handlers of sort and argsort (stable, descending, NaN ordered as torch orders it:
greater than every number) from kf ops that compile on every target: each element's
rank along the dim (how many elements come before it) from an all-pairs comparison,
then the elements and their positions scattered to their ranks (kf.scatter_reduce).
O(n^2) per row in work and in the comparison tensor, so rows are limited to
``SORT_ROW_LIMIT``."""

from __future__ import annotations

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import fake_value, handles, rank_of, shape_of
from .reductions import bound_args

#: the longest row sort compiles (its all-pairs comparison holds row * row booleans per row)
SORT_ROW_LIMIT = 4096


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
    j = kb.reshape(keys, (*lead, n, 1))   # the element ranked
    k = kb.reshape(keys, (*lead, 1, n))   # every element it is compared with
    kj, kk = kb.iota((n, 1), 0), kb.iota((1, n), 1)
    before = _or(_comes_first(k, j, descending), _and(_ties(k, j), kb.cmp(kk, kj, predicate="lt")))
    rank = kb.sum(kb.cast(before, "i64"), dims=[r], keepdim=False, elem="i64")
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
