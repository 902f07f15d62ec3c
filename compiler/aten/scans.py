"""Handlers of the scans: cumsum, cumprod and logcumsumexp as kf.scan (any dim, dtype=),
computed in the result's type (f32 for f16/bf16, rounded once per element); cummax and
cummin as max / min scans of the values and of their positions."""

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
