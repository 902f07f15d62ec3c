"""Handlers of the scans: cumsum, cumprod and logcumsumexp as kf.scan (any dim, dtype=),
computed in the result's type (f32 for f16/bf16, rounded once per element); cummax and
cummin as max / min scans of the values and of their positions; linalg.vander as a
cumulative product and cumulative_trapezoid as a cumulative sum."""

from __future__ import annotations

from kf.dialects import builders as kb
from kf.dialects import spec_of

from .core import fake_value, handles, rank_of, shape_of
from .reductions import bound_args


def _scan(kind: str):
    def handler(c, node, args, kwargs):
        p = bound_args(node, args, kwargs)
        x = c.tensor(p["self"], c.out_elem(node))
        shape = shape_of(x)
        if not shape:  # a 0-d tensor scans as its one element
            x = kb.reshape(x, (1,))
        out = kb.build("scan", [x], {"dim": int(p["dim"]) % max(rank_of(x), 1), "kind": kind}).result
        return kb.reshape(out, tuple(fake_value(node).shape)) if not shape else out

    return handler


handles("aten.cumsum.default")(_scan("sum"))
handles("aten.cumprod.default")(_scan("prod"))
handles("aten.logcumsumexp.default")(_scan("logsumexp"))


@handles("aten.cummax.default", "aten.cummin.default")
def _cummax(c, node, args, kwargs):
    """cummax / cummin: the values a max (min) kf.scan; the index of each the last
    position j <= i where x[j] equals the running value there (or is NaN), which is a
    max scan of those positions: the running value changes only at such a j, and a tie
    or a NaN moves the index on, as in torch's kernels."""
    p = bound_args(node, args, kwargs)
    x = p["self"]
    shape = shape_of(x)
    elem = spec_of(x.type).elem
    if not shape:
        x = kb.reshape(x, (1,))
    dim = int(p["dim"]) % max(rank_of(x), 1)
    keys = kb.cast(x, "i32") if elem == "i1" else x  # kf.scan takes no booleans
    kind = "max" if node.target._opname == "cummax" else "min"
    values = kb.build("scan", [keys], {"dim": dim, "kind": kind}).result
    hit = kb.cmp(keys, values, predicate="eq")
    if spec_of(keys.type).is_float:
        hit = kb.select(kb.cmp(keys, keys, predicate="ne"), kb.scalar(True, "i1"), hit)
    where = kb.select(hit, kb.iota(shape_of(x), dim), kb.scalar(0.0, "i64"))
    indices = kb.build("scan", [where], {"dim": dim, "kind": "max"}).result
    if elem == "i1":
        values = kb.cast(values, "i1")
    if not shape:
        values, indices = kb.reshape(values, ()), kb.reshape(indices, ())
    return values, indices


@handles("aten.linalg_vander.default")
def _vander(c, node, args, kwargs):
    """torch.linalg.vander: the powers x^0 .. x^(N-1) along a new last dim, the way torch
    computes them (a row of ones, then the cumulative product of x repeated N - 1 times,
    so each power rounds as torch's does)."""
    p = bound_args(node, args, kwargs)
    shape = tuple(fake_value(node).shape)
    elem = c.out_elem(node)
    x = c.tensor(p["x"], elem)
    n = shape[-1]
    powers = kb.broadcast_to(kb.reshape(x, shape_of(x) + (1,)), shape[:-1] + (n - 1,))
    powers = kb.build("scan", [powers], {"dim": len(shape) - 1, "kind": "prod"}).result
    return kb.concat([kb.fill(shape[:-1] + (1,), elem, 1.0), powers], dim=len(shape) - 1)


@handles("aten.cumulative_trapezoid.x", "aten.cumulative_trapezoid.dx")
def _cumulative_trapezoid(c, node, args, kwargs):
    """torch.cumulative_trapezoid of float samples: the cumulative sum of the trapezoids
    along dim, each computed as torch does (``dx / 2 * (left + right)`` for a spacing,
    ``dx * (left + right) / 2`` with ``dx`` the differences of the sample points x)."""
    from ..errors import Unsupported
    from .core import elem_of

    p = bound_args(node, args, kwargs)
    elem = c.out_elem(node)
    y = p["y"]
    if elem_of(y) != elem:
        raise Unsupported("torch.cumulative_trapezoid of an integer tensor is not supported by kf")
    rank = rank_of(y)
    dim = int(p["dim"]) % rank
    n = shape_of(y)[dim]
    shape = tuple(fake_value(node).shape)
    if n <= 1:
        return kb.fill(shape, elem, 0.0)
    pair = kb.add(kb.slice(y, dim=dim, start=0, end=n - 1, step=1), kb.slice(y, dim=dim, start=1, end=n, step=1))
    if "x" in p and p["x"] is not None:
        x = c.tensor(p["x"], elem)
        if rank_of(x) == 1:
            x = kb.reshape(x, tuple(n if i == dim else 1 for i in range(rank)))
        elif rank_of(x) < rank:
            x = kb.reshape(x, (1,) * (rank - rank_of(x)) + shape_of(x))
        m = shape_of(x)[dim]
        dx = kb.sub(kb.slice(x, dim=dim, start=1, end=m, step=1), kb.slice(x, dim=dim, start=0, end=m - 1, step=1))
        areas = kb.div(kb.mul(dx, pair), kb.scalar(2.0, elem))
    else:
        areas = kb.mul(kb.scalar(float(p["dx"]) / 2.0, elem), pair)
    if shape_of(areas) != shape:
        areas = kb.broadcast_to(areas, shape)
    return kb.build("scan", [areas], {"dim": dim, "kind": "sum"}).result
