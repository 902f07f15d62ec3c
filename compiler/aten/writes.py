"""Handlers of functionalized writes: copy, fill, select/slice_scatter, index_put,
index_copy, index_fill."""

from __future__ import annotations

import math

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..dtypes import kf_elem
from ..errors import Unsupported
from .core import fake_value, handles, rank_of, shape_of


@handles("aten.copy.default")
def _copy(c, node, args, kwargs):
    """copy(self, src): src cast to self's dtype and broadcast to its shape."""
    val = fake_value(node)
    src = c.tensor(args[1], kf_elem(val.dtype))
    return src if shape_of(src) == tuple(val.shape) else kb.broadcast_to(src, tuple(val.shape))


@handles("aten.fill.Scalar", "aten.fill.Tensor", "aten.zero.default")
def _fill(c, node, args, kwargs):
    val = fake_value(node)
    shape, elem = tuple(val.shape), kf_elem(val.dtype)
    value = 0.0 if node.target._opname == "zero" else args[1]
    if isinstance(value, ir.Value):
        return kb.broadcast_to(c.tensor(value, elem), shape)
    return kb.fill(shape, elem, float(value))


@handles("aten.select_scatter.default")
def _select_scatter(c, node, args, kwargs):
    x, src, dim, index = args[:4]
    dim = dim % rank_of(x)
    index = index % shape_of(x)[dim]
    shape = list(shape_of(src))
    shape.insert(dim, 1)
    return _scatter_slice(c, x, kb.reshape(c.tensor(src, spec_of(x.type).elem), shape), dim, index, index + 1, 1)


@handles("aten.slice_scatter.default")
def _slice_scatter(c, node, args, kwargs):
    names = ("self", "src", "dim", "start", "end", "step")
    p = {"dim": 0, "start": None, "end": None, "step": 1, **dict(zip(names, args)), **kwargs}
    x = p["self"]
    dim = p["dim"] % rank_of(x)
    start, end, step = slice(p["start"], p["end"], p["step"]).indices(shape_of(x)[dim])
    return _scatter_slice(c, x, c.tensor(p["src"], spec_of(x.type).elem), dim, start, max(end, start), step)


def _scatter_slice(c, x, src, dim: int, start: int, end: int, step: int):
    """x with x[start:end:step] along dim replaced by src (of that slice's shape)."""
    n = shape_of(x)[dim]
    count = shape_of(src)[dim]
    if count == 0:
        return x
    if step == 1:
        parts = [kb.slice(x, dim=dim, start=0, end=start, step=1)] if start > 0 else []
        parts.append(src)
        if end < n:
            parts.append(kb.slice(x, dim=dim, start=end, end=n, step=1))
        return kb.concat(parts, dim=dim)
    # every step-th element: src's rows spread out by a constant index, chosen by a mask
    rows = torch.arange(n)
    hit = (rows >= start) & (rows < end) & ((rows - start) % step == 0)
    pick = ((rows - start) // step).clamp(0, count - 1)
    spread = kb.index_select(src, c.constant_tensor(pick), dim=dim)
    mask_shape = [1] * rank_of(x)
    mask_shape[dim] = n
    return kb.select(mask_constant(c, hit.reshape(mask_shape)), spread, x)


def mask_constant(c, mask: torch.Tensor) -> ir.Value:
    """A boolean kf constant (built from i32: dense i1 attributes want packed bits)."""
    return kb.cmp(c.constant_tensor(mask.to(torch.int32)), kb.scalar(0.0, "i32"), predicate="ne")


#: The most indices a non-accumulating index_put takes: its repeated indices are found
#: by comparing every pair of them.
INDEX_PUT_PAIRS_LIMIT = 4096


@handles("aten.index_put.default")
def _index_put(c, node, args, kwargs):
    """``x[index] = values`` (and ``+=`` with accumulate) for one index: a boolean mask
    over x's leading dims with one value, or a 1-D integer index along one dim. Where a
    non-accumulating index repeats, the last write wins, as in torch's CPU kernel."""
    x, indices, values = args[:3]
    accumulate = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    elem, shape, rank = spec_of(x.type).elem, shape_of(x), rank_of(x)
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or not isinstance(given[0][1], ir.Value):
        raise Unsupported("x[i, j, ...] = v with more than one index tensor is not supported by kf",
                          cause="index one dimension at a time, or use torch.where with a mask")
    d, index = given[0]
    ispec = spec_of(index.type)
    v = c.tensor(values, elem)
    if ispec.elem == "i1":
        if d != 0 or ispec.shape != shape[:ispec.rank]:
            raise Unsupported(f"a boolean index of shape {list(ispec.shape)} for a tensor of shape {list(shape)} "
                              f"is not supported by kf", cause="the mask must cover the tensor's leading dims")
        if math.prod(shape_of(v)) != 1:
            raise Unsupported("x[mask] = values with more than one value is not supported by kf",
                              cause="how many elements the mask selects is known only at run time; "
                                    "use torch.where(mask, values, x)")
        mask = kb.reshape(index, ispec.shape + (1,) * (rank - ispec.rank))
        v = kb.reshape(v, ())
        if accumulate:
            return kb.add(x, kb.select(mask, v, kb.scalar(0.0, elem)))
        return kb.select(mask, v, x)
    if ispec.rank != 1:
        raise Unsupported(f"x[index] = v with a {ispec.rank}-d index is not supported by kf",
                          cause="flatten the index (and the values) to 1-D")
    return _put_rows(c, x, d, index, v, accumulate)


def _rows_hit(c, x, d: int, index):
    """i1 of shape (1, .., size of dim d, .., 1): whether index names each row."""
    rows_n = [1] * rank_of(x)
    rows_n[d] = shape_of(x)[d]
    ones = [1] * rank_of(x)
    ones[d] = shape_of(index)[0]
    hit = kb.index_add(kb.fill(rows_n, "f32", 0.0), index, kb.fill(ones, "f32", 1.0), dim=d)
    return kb.cmp(hit, kb.scalar(0.0, "f32"), predicate="ne")


def _put_rows(c, x, d: int, index, v, accumulate: bool):
    """x with rows index[p] along dim d replaced by v's rows p (added with accumulate);
    where an index repeats the last write wins, as in torch's CPU kernels."""
    elem, shape, rank = spec_of(x.type).elem, shape_of(x), rank_of(x)
    m = shape_of(index)[0]
    if m == 0:
        return x
    rows = list(shape)
    rows[d] = m
    v = c.tensor(v, elem)
    v = kb.broadcast_to(v, tuple(rows)) if shape_of(v) != tuple(rows) else v
    if accumulate:
        return kb.index_add(x, index, v, dim=d)
    if m > INDEX_PUT_PAIRS_LIMIT:
        raise Unsupported(f"writing {m} indexed rows is not supported by kf (at most {INDEX_PUT_PAIRS_LIMIT})",
                          cause="repeated indices are found by comparing every pair; use index_put_ with "
                                "accumulate=True on unique indices")
    # keep[p]: no later position writes the same row (the last write wins); computed in
    # the layout of the rows (m along d, a trailing dim over the other positions q), so
    # that nothing is reshaped after a reduction
    along = [1] * rank
    along[d] = m
    same = kb.cmp(kb.reshape(index, along + [1]), kb.reshape(index, [1] * rank + [m]), predicate="eq")
    later = mask_constant(c, (torch.arange(m)[None, :] > torch.arange(m)[:, None]).reshape(along + [m]))
    overwritten = kb.sum(kb.cast(kb.select(later, same, kb.scalar(0.0, "i1")), "f32"), dims=[rank], keepdim=False)
    v = kb.select(kb.cmp(overwritten, kb.scalar(0.0, "f32"), predicate="eq"), v, kb.scalar(0.0, elem))
    # the rows some position writes are cleared first (a select: NaN rows clear too)
    return kb.index_add(kb.select(_rows_hit(c, x, d, index), kb.scalar(0.0, elem), x), index, v, dim=d)


@handles("aten.index_copy.default")
def _index_copy(c, node, args, kwargs):
    x, dim, index, source = args[:4]
    if rank_of(x) == 0:  # a 0-d tensor indexes as its one element
        one = _put_rows(c, kb.reshape(x, (1,)), 0, kb.reshape(index, (1,)),
                        kb.reshape(c.tensor(source, spec_of(x.type).elem), (1,)), accumulate=False)
        return kb.reshape(one, ())
    return _put_rows(c, x, dim % rank_of(x), index, source, accumulate=False)


@handles("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def _index_fill(c, node, args, kwargs):
    x, dim, index, value = args[:4]
    index = kb.reshape(index, (1,)) if rank_of(index) == 0 else index
    elem = spec_of(x.type).elem
    value = kb.reshape(c.tensor(value, elem), ()) if isinstance(value, ir.Value) else kb.scalar(float(value), elem)
    if rank_of(x) == 0:  # a 0-d tensor indexes as its one element
        return kb.reshape(kb.select(_rows_hit(c, kb.reshape(x, (1,)), 0, index), value, kb.reshape(x, (1,))), ())
    return kb.select(_rows_hit(c, x, dim % rank_of(x), index), value, x)
