"""Handlers of the scans: cumsum, cumprod and logcumsumexp as kf.scan (any dim, dtype=),
and linalg.vander as a cumulative product,
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
