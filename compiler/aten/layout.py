"""Handlers of layout ops: transpose, permute, reshape/view, expand, slices, cat,
stack, split, unbind, meshgrid, roll, and their ``*_copy`` forms (a kf value is never a view)."""

from __future__ import annotations

import math

from kf.dialects import builders as kb

from .core import fake_value, handles, rank_of, shape_of


@handles("aten.t.default", "aten.numpy_T.default")
def _t(c, node, args, kwargs):
    x = args[0]
    r = rank_of(x)
    if r < 2:
        return x
    return kb.transpose(x, perm=list(reversed(range(r))))


@handles("aten.transpose.int", "aten.swapaxes.default")
def _transpose(c, node, args, kwargs):
    x, d0, d1 = args
    r = rank_of(x)
    if r == 0:  # transpose(0, 0) or (0, -1) of a 0-dim tensor is the tensor
        return x
    perm = list(range(r))
    d0, d1 = d0 % r, d1 % r
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return kb.transpose(x, perm=perm)


@handles("aten.permute.default", "aten.permute_copy.default")
def _permute(c, node, args, kwargs):
    x, perm = args
    return kb.transpose(x, perm=[p % rank_of(x) for p in perm])


@handles("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
         "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints",
         "aten.unflatten.int", "aten.view_as.default", "aten.reshape_as.default", "aten.view_copy.default",
         "aten._reshape_copy.default")
def _reshape(c, node, args, kwargs):
    return kb.reshape(args[0], tuple(fake_value(node).shape))


@handles("aten.expand.default", "aten.expand_as.default", "aten.broadcast_to.default")
def _expand(c, node, args, kwargs):
    return kb.broadcast_to(args[0], tuple(fake_value(node).shape))


@handles("aten.slice.Tensor")
def _slice(c, node, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else 0
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    size = shape_of(x)[dim % rank_of(x)]
    start, end, step = slice(start, end, step).indices(size)
    end = max(end, start)
    if (start, end, step) == (0, size, 1):
        # the whole dim (``h[:, :16]`` slices dim 0 to the end): x itself, a view as in
        # eager, with no bound that a run-time size would be written into
        return x
    return kb.slice(x, dim=dim % rank_of(x), start=start, end=end, step=step)


@handles("aten.select.int")
def _select_int(c, node, args, kwargs):
    x, dim, index = args
    dim = dim % rank_of(x)
    index = index % shape_of(x)[dim]
    s = kb.slice(x, dim=dim, start=index, end=index + 1, step=1)
    return kb.reshape(s, tuple(fake_value(node).shape))


@handles("aten.narrow.default", "aten.narrow_copy.default")
def _narrow(c, node, args, kwargs):
    x, dim, start, length = args
    dim = dim % rank_of(x)
    if start < 0:  # counts from the end, as torch's
        start += shape_of(x)[dim]
    return kb.slice(x, dim=dim, start=start, end=start + length, step=1)


@handles("aten.unbind.int", "aten.unbind_copy.int")
def _unbind(c, node, args, kwargs):
    x = args[0]
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % rank_of(x)
    shape = [n for d, n in enumerate(shape_of(x)) if d != dim]
    return tuple(kb.reshape(kb.slice(x, dim=dim, start=i, end=i + 1, step=1), shape)
                 for i in range(shape_of(x)[dim]))


@handles("aten.cat.default", "aten.concat.default")
def _cat(c, node, args, kwargs):
    xs = [x for x in args[0] if math.prod(shape_of(x)) > 0 or rank_of(x) > 1]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    elem = c.out_elem(node)
    return kb.concat([c.tensor(x, elem) for x in xs], dim=dim % rank_of(xs[0]))


@handles("aten.stack.default")
def _stack(c, node, args, kwargs):
    xs = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    r = rank_of(xs[0]) + 1
    dim = dim % r
    parts = []
    for x in xs:
        shape = list(shape_of(x))
        shape.insert(dim, 1)
        parts.append(kb.reshape(x, shape))
    return kb.concat(parts, dim=dim)


@handles("aten.meshgrid.default", "aten.meshgrid.indexing")
def _meshgrid(c, node, args, kwargs):
    xs = [kb.reshape(x, [math.prod(shape_of(x))]) for x in args[0]]
    indexing = args[1] if len(args) > 1 else kwargs.get("indexing", "ij")
    shape = [shape_of(x)[0] for x in xs]
    order = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:  # the first two grids' axes swapped
        shape[0], shape[1] = shape[1], shape[0]
        order[0], order[1] = 1, 0
    outs = []
    for k, x in enumerate(xs):
        at = [1] * len(xs)
        at[order[k]] = shape[order[k]]
        outs.append(kb.broadcast_to(kb.reshape(x, at), shape))
    return tuple(outs)


@handles("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unsafe_split.Tensor",
         "aten.unsafe_split_with_sizes.default", "aten.unsafe_chunk.default")
def _split(c, node, args, kwargs):
    x = args[0]
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % rank_of(x)
    outs, start = [], 0
    for v in fake_value(node):
        n = v.shape[dim]
        outs.append(kb.slice(x, dim=dim, start=start, end=start + n, step=1))
        start += n
    return tuple(outs)


@handles("aten.roll.default")
def _roll(c, node, args, kwargs):
    """roll: along each dim the last ``shift % n`` elements moved to the front (two slices
    joined); with no dims, over the flattened tensor."""
    x, shifts = args[0], args[1]
    dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    shape = tuple(fake_value(node).shape)
    if not dims:
        x, dims, shifts = kb.reshape(x, [math.prod(shape)]), [0], shifts[:1]
    for shift, dim in zip(shifts, dims):
        dim %= rank_of(x)
        n = shape_of(x)[dim]
        s = shift % n if n else 0
        if s:
            x = kb.concat([kb.slice(x, dim=dim, start=n - s, end=n, step=1),
                           kb.slice(x, dim=dim, start=0, end=n - s, step=1)], dim=dim)
    return kb.reshape(x, shape) if shape_of(x) != shape else x


@handles("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(c, node, args, kwargs):
    """diagonal(x, offset, dim1, dim2): the two dims moved last and merged, then the
    elements i * m + i + offset picked (an index_select of constant indices); the
    diagonal is the last dim of the result, as torch's."""
    import torch

    names = ["self", "offset", "dim1", "dim2"]
    p = {**dict(zip(names, args)), **kwargs}
    x, offset = p["self"], int(p.get("offset", 0))
    r = rank_of(x)
    d1, d2 = int(p.get("dim1", 0)) % r, int(p.get("dim2", 1)) % r
    perm = [d for d in range(r) if d not in (d1, d2)] + [d1, d2]
    t = kb.transpose(x, perm=perm) if perm != list(range(r)) else x
    shape = shape_of(t)
    n, m = shape[-2], shape[-1]
    picks = [i * m + i + offset for i in range(n) if 0 <= i + offset < m]
    out = tuple(fake_value(node).shape)
    if not picks or 0 in shape[:-2]:
        return kb.fill(out, c.out_elem(node), 0.0)
    flat = kb.reshape(t, shape[:-2] + (n * m,))
    return kb.index_select(flat, c.constant_tensor(torch.tensor(picks, dtype=torch.int64)), dim=r - 2)


@handles("aten.constant_pad_nd.default")
def _constant_pad_nd(c, node, args, kwargs):
    """pad = (before, after) pairs from the last dim backward: a negative amount slices
    the dim, a positive one joins fills of value on that side."""
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    elem = c.out_elem(node)
    r = rank_of(x)
    for k in range(len(pad) // 2):
        dim = r - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        n = shape_of(x)[dim]
        start, end = max(-before, 0), n - max(-after, 0)
        if (start, end) != (0, n):
            x = kb.slice(x, dim=dim, start=start, end=max(end, start), step=1)
        parts = []
        for amount in (before, after):
            if amount > 0:
                shape = list(shape_of(x))
                shape[dim] = amount
                parts.append(kb.fill(shape, elem, float(value)))
            else:
                parts.append(None)
        joined = [p for p in (parts[0], x, parts[1]) if p is not None]
        x = kb.concat(joined, dim=dim) if len(joined) > 1 else x
    return x


@handles("aten.flip.default")
def _flip(c, node, args, kwargs):
    """Each listed dim read backward: an index_select of n - 1 - i."""
    x, dims = args[0], args[1]
    r = rank_of(x)
    for d in sorted({d % max(r, 1) for d in dims}) if r else []:
        n = shape_of(x)[d]
        if n < 2:
            continue
        backward = kb.sub(kb.scalar(float(n - 1), "i64"), kb.iota([n], 0, "i64"))
        x = kb.index_select(x, backward, dim=d)
    return x
