"""Handlers of functionalized writes: copy, fill, select/slice_scatter, index_put,
_unsafe_masked_index_put_accumulate, index_copy, index_fill, masked_scatter,
diagonal_scatter."""

from __future__ import annotations

import math

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..dtypes import kf_elem
from ..errors import Unsupported
from .core import as_vector, fake_value, handles, rank_of, shape_of
from .indexing import _dim


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
    over x's leading dims with one value, or a 1-D integer index along one dim (negative
    indices from the end). Where a non-accumulating index repeats, the last write wins,
    as in torch's CPU kernel."""
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
        index, v = _flat_index(index, v, shape, d)
    if shape[d] >= 0:  # negative indices count from the end, as torch's do (below -size: still an error)
        index = kb.select(kb.cmp(index, kb.scalar(0.0, ispec.elem), predicate="lt"),
                          kb.add(index, kb.scalar(float(shape[d]), ispec.elem)), index)
    return _put_rows(c, x, d, index, v, accumulate)


def _flat_index(index, v, shape: tuple, d: int):
    """(the index as 1-D, the values at its rows) for a k-d integer index along dim d
    (an embedding's gradient: ``x[tokens] += dy`` with tokens [batch, seq]): x[index]
    is x.shape[:d] + index.shape + x.shape[d + 1:], whose index dims flatten into one."""
    ishape = spec_of(index.type).shape
    if any(n < 0 for n in ishape):
        raise Unsupported(f"x[index] = v with a {len(ishape)}-d index of run-time sizes is not supported by kf",
                          cause="flatten the index (and the values) to 1-D")
    full = tuple(shape[:d]) + tuple(ishape) + tuple(shape[d + 1:])
    n = math.prod(ishape)
    v = kb.broadcast_to(v, full) if shape_of(v) != full else v
    return kb.reshape(index, [n]), kb.reshape(v, list(shape[:d]) + [n] + list(shape[d + 1:]))


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


@handles("aten._unsafe_masked_index_put_accumulate.default")
def _unsafe_masked_index_put_accumulate(c, node, args, kwargs):
    """x with values added at its indexed elements where mask is true: the leading
    indexed dims flattened into one, each index checked against its own dim (an index
    table's index_select) before it joins the flat index, one index_add."""
    from .indexing import masked_indices

    x, mask, indices, values = args
    elem, shape = spec_of(x.type).elem, shape_of(x)
    k = sum(i is not None for i in indices)
    rest = shape[k:]
    bshape, safe = masked_indices(c, "_unsafe_masked_index_put_accumulate", x, mask, list(indices), rest)
    n = math.prod(bshape)
    flat = None
    for d, i in enumerate(safe):
        i = kb.reshape(kb.cast(i, "i64"), [n])
        negative = kb.cmp(i, kb.scalar(0.0, "i64"), predicate="lt")
        wrapped = kb.select(negative, kb.add(i, kb.scalar(float(shape[d]), "i64")), i)
        checked = kb.index_select(c.constant_tensor(torch.arange(shape[d], dtype=torch.int64)), wrapped, dim=0)
        stride = math.prod(shape[d + 1:k])
        term = kb.mul(checked, kb.scalar(float(stride), "i64")) if stride != 1 else checked
        flat = term if flat is None else kb.add(flat, term)
    full = tuple(bshape) + tuple(rest)
    v = c.tensor(values, elem)
    v = kb.broadcast_to(v, full) if shape_of(v) != full else v
    m = kb.broadcast_to(mask, full) if shape_of(mask) != full else mask
    v = kb.reshape(kb.select(m, v, kb.scalar(0.0, elem)), (n, *rest))
    lead = math.prod(shape[:k])
    out = kb.index_add(kb.reshape(x, (lead, *rest)), flat, v, dim=0)
    return kb.reshape(out, shape)


@handles("aten.index_copy.default")
def _index_copy(c, node, args, kwargs):
    # a 0-dim x (and source) counts as 1-D, as torch's indexing ops take it
    x, dim, index, source = args[:4]
    source = as_vector(c.tensor(source, spec_of(x.type).elem)) if rank_of(x) == 0 else source
    out = _put_rows(c, as_vector(x), _dim(dim, x), as_vector(index), source, accumulate=False)
    return kb.reshape(out, tuple(fake_value(node).shape))


@handles("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def _index_fill(c, node, args, kwargs):
    x, dim, index, value = args[:4]
    index = as_vector(index)
    elem = spec_of(x.type).elem
    value = kb.reshape(c.tensor(value, elem), ()) if isinstance(value, ir.Value) else kb.scalar(float(value), elem)
    out = kb.select(_rows_hit(c, as_vector(x), _dim(dim, x), index), value, as_vector(x))
    return kb.reshape(out, tuple(fake_value(node).shape))


@handles("aten.masked_scatter.default")
def _masked_scatter(c, node, args, kwargs):
    """masked_scatter: the source's elements, in order, at the true places of the mask
    (broadcast to x); place k takes source element k, its number a sum scan of the mask,
    read through an index_select that checks the source holds that many."""
    x, mask, source = args
    elem, shape = spec_of(x.type).elem, tuple(fake_value(node).shape)  # x and mask broadcast together
    n = math.prod(shape)
    x = kb.broadcast_to(x, shape) if shape_of(x) != shape else x
    m = kb.reshape(kb.broadcast_to(mask, shape) if shape_of(mask) != shape else mask, [n])
    count = kb.build("scan", [kb.cast(m, "i64")], {"dim": 0, "kind": "sum"}).result
    at = kb.select(m, kb.sub(count, kb.scalar(1.0, "i64")), kb.scalar(0.0, "i64"))
    src = kb.reshape(c.tensor(source, elem), [math.prod(shape_of(source))])
    if not shape_of(src)[0]:  # nothing to take: any true place is out of range
        src = kb.fill((1,), elem, 0.0)
        at = kb.select(m, kb.scalar(1.0, "i64"), at)
    return kb.reshape(kb.select(m, kb.index_select(src, at, dim=0), kb.reshape(x, [n])), shape)


@handles("aten.diagonal_scatter.default")
def _diagonal_scatter(c, node, args, kwargs):
    """diagonal_scatter: x with its diagonal (offset, dim1, dim2) replaced by src: the two
    dims moved last, src spread over them by a constant index (each element's place along
    the diagonal) and chosen by a constant mask of the diagonal."""
    from .reductions import bound_args

    p = bound_args(node, args, kwargs)
    x, src = p["self"], p["src"]
    r = rank_of(x)
    d1, d2, offset = p["dim1"] % r, p["dim2"] % r, int(p["offset"])
    elem = spec_of(x.type).elem
    src = c.tensor(src, elem)
    n1, n2 = shape_of(x)[d1], shape_of(x)[d2]
    length = shape_of(src)[-1]
    if length == 0:
        return x
    perm = [d for d in range(r) if d not in (d1, d2)] + [d1, d2]
    xt = kb.transpose(x, perm=perm) if perm != list(range(r)) else x
    i, j = torch.arange(n1)[:, None], torch.arange(n2)[None, :]
    on = (j - i) == offset
    place = (i if offset >= 0 else j).expand(n1, n2).clamp(0, length - 1)
    spread = kb.index_select(src, c.constant_tensor(place.reshape(-1)), dim=rank_of(src) - 1)
    spread = kb.reshape(spread, shape_of(xt))
    out = kb.select(mask_constant(c, on), spread, xt)
    return kb.transpose(out, perm=[perm.index(d) for d in range(r)]) if perm != list(range(r)) else out
