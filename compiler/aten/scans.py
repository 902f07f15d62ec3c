"""Handlers of the scans: cumsum, cumprod and logcumsumexp as kf.scan (any dim, dtype=),
computed in the result's type (f32 for f16/bf16, rounded once per element)."""

from __future__ import annotations

from kf.dialects import builders as kb

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
