"""Handlers of selection and indexing: topk, gather, combinations, index_select, embedding,
index_add, scatter_add, scatter_reduce, index_reduce, advanced indexing, take, one_hot, nll_loss."""

from __future__ import annotations

import math

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import _target_name, as_vector, elem_of, fake_value, handles, rank_of, shape_of


#: The most steps (k times the row's length) a kf.topk may take per row; a larger top-k
#: takes the first k of a stable sort of the row (``sorting.sorted_along``), where the
#: row is short enough for it.
TOPK_STEPS = 1 << 16


@handles("aten.topk.default")
def _topk(c, node, args, kwargs):
    """kf.topk (output position p selects the p-th element in p + 1 passes over the row:
    k * n steps, cheap for the small k of a MoE gate or a sampler), or, for a large k
    (``TOPK_STEPS``), the first k elements of a stable sort of the row (each element's
    rank by an all-pairs comparison, n steps a thread). Both order ties by position and
    NaN as the largest value, as torch.topk does."""
    from .sorting import SORT_ROW_LIMIT, sorted_along

    x, k = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
    if rank_of(x) == 0:
        values, indices = kb.topk(as_vector(x), k=k, dim=0, largest=bool(largest))
        shapes = [tuple(v.shape) for v in fake_value(node)]
        return kb.reshape(values, shapes[0]), kb.reshape(indices, shapes[1])
    dim %= rank_of(x)
    n = shape_of(x)[dim]
    if k * n > TOPK_STEPS and 0 < n <= SORT_ROW_LIMIT:
        values, positions = sorted_along(x, dim, bool(largest))
        return (kb.slice(values, dim=dim, start=0, end=k, step=1),
                kb.slice(positions, dim=dim, start=0, end=k, step=1))
    return kb.topk(x, k=k, dim=dim, largest=bool(largest))


def _dim(dim: int, x: ir.Value) -> int:
    """dim of x in [0, rank), a 0-dim tensor counting as 1-D (torch's rule for the
    indexing ops); an IndexError-like Unsupported out of range."""
    r = max(rank_of(x), 1)
    if not -r <= dim < r:
        raise Unsupported(f"dimension {dim} is out of range for a tensor of rank {rank_of(x)}")
    return dim % r


def _wrap_negative(i: ir.Value, size: int) -> ir.Value:
    """Python's rule for negative indices, as advanced indexing and take apply it:
    ``i + size`` where ``-size <= i < 0``. What is still out of range is left so: the
    kernel that uses the index reports it as the user wrote it (-11, not -1, at size 10)."""
    elem = spec_of(i.type).elem
    zero, n, minus_n = (kb.fill((), elem, float(v)) for v in (0, size, -size))
    in_range = kb.select(kb.cmp(i, minus_n, predicate="lt"), i, kb.add(i, n))
    return kb.select(kb.cmp(i, zero, predicate="lt"), in_range, i)


def _as_shape(c, node, v: ir.Value) -> ir.Value:
    return kb.reshape(v, tuple(fake_value(node).shape))


@handles("aten.gather.default")
def _gather(c, node, args, kwargs):
    x, dim, index = args[:3]
    return _as_shape(c, node, kb.gather(as_vector(x), as_vector(index), dim=_dim(dim, x)))


@handles("aten.combinations.default")
def _combinations(c, node, args, kwargs):
    """torch.combinations of a 1-d tensor: the r-element combinations (with replacement:
    multisets) of its positions in lexicographic order, which depend on its length only,
    so they are a constant index of an index_select (torch's own lowering masks a grid of
    every r-tuple, a result shape that export takes as data-dependent)."""
    import itertools

    names = ("self", "r", "with_replacement")
    p = dict(zip(names, args))
    p.update(kwargs)
    x, r, replace = p["self"], p.get("r", 2), p.get("with_replacement", False)
    shape = tuple(fake_value(node).shape)
    n = shape_of(x)[0]
    pick = itertools.combinations_with_replacement if replace else itertools.combinations
    positions = [i for combo in pick(range(n), r) for i in combo]
    if not positions:
        return kb.fill(shape, elem_of(x), 0.0)
    index = c.constant_tensor(torch.tensor(positions, dtype=torch.int64))
    return kb.reshape(kb.index_select(x, index, dim=0), shape)


@handles("aten.index_select.default")
def _index_select(c, node, args, kwargs):
    x, dim, index = args
    return _as_shape(c, node, kb.index_select(as_vector(x), kb.reshape(index, [math.prod(shape_of(index))]),
                                              dim=_dim(dim, x)))


@handles("aten.embedding.default")
def _embedding(c, node, args, kwargs):
    weight, indices = args[0], args[1]
    flat = kb.reshape(indices, [math.prod(shape_of(indices))])
    rows = kb.index_select(weight, flat, dim=0)
    return kb.reshape(rows, tuple(fake_value(node).shape))


@handles("aten.index_add.default")
def _index_add(c, node, args, kwargs):
    x, dim, index, source = args[:4]
    alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
    elem = spec_of(x.type).elem
    source = c.tensor(source, elem)
    if alpha != 1:
        source = kb.mul(source, c.tensor(alpha, elem))
    d = _dim(dim, x)
    index = kb.reshape(index, [math.prod(shape_of(index))])
    source = as_vector(source) if rank_of(x) == 0 else source
    return _as_shape(c, node, kb.index_add(as_vector(x), index, source, dim=d))


@handles("aten.scatter_add.default")
def _scatter_add(c, node, args, kwargs):
    x, dim, index, src = args
    src = c.tensor(src, spec_of(x.type).elem)
    return _as_shape(c, node, kb.scatter_add(as_vector(x), as_vector(index), as_vector(src), dim=_dim(dim, x)))


@handles("aten.scatter.src", "aten.scatter.value", "aten.scatter.reduce", "aten.scatter.value_reduce",
         "aten.scatter_reduce.two")
def _scatter(c, node, args, kwargs):
    """scatter (a source tensor or one value; reduce="add"/"multiply") and scatter_reduce
    (sum, prod, amax, amin, mean; include_self) as kf.scatter_reduce: deterministic (no
    atomics), each index checked; where indices repeat in a plain scatter the last write
    in index order wins, as torch's CPU kernel."""
    from .reductions import bound_args

    p = bound_args(node, args, kwargs)
    x, index = p["self"], p["index"]
    elem = spec_of(x.type).elem
    src = p.get("src", p.get("value"))
    if isinstance(src, ir.Value):
        src = c.tensor(src, elem)
    else:  # one value for every index position
        src = kb.fill(shape_of(index), elem, float(src))
    reduce = p.get("reduce")
    reduce = {None: "none", "add": "sum", "multiply": "prod"}.get(reduce, reduce)
    include = bool(p.get("include_self", True))
    out = kb.build("scatter_reduce", [as_vector(x), as_vector(index), as_vector(src)],
                   {"dim": _dim(p["dim"], x), "reduce": reduce, "include_self": include}).result
    return _as_shape(c, node, out)


@handles("aten.index_reduce.default")
def _index_reduce(c, node, args, kwargs):
    """index_reduce (prod, mean, amax, amin; include_self) as the kf.scatter_reduce of
    the 1-D index spread over the source's shape: row p of the source lands on row
    index[p] of self along dim, each index checked against that dim."""
    from .reductions import bound_args

    p = bound_args(node, args, kwargs)
    x, index = as_vector(p["self"]), p["index"]
    elem = spec_of(x.type).elem
    d = _dim(p["dim"], p["self"])
    src = as_vector(c.tensor(p["source"], elem))
    n = math.prod(shape_of(index))
    along = [1] * rank_of(x)
    along[d] = n
    spread = kb.broadcast_to(kb.reshape(index, along), shape_of(src))
    out = kb.build("scatter_reduce", [x, spread, src], {"dim": d, "reduce": p["reduce"],
                                                        "include_self": bool(p["include_self"])}).result
    return _as_shape(c, node, out)


@handles("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index_tensor(c, node, args, kwargs):
    """Advanced indexing ``x[i, j]`` with integer index tensors (a None is a ``:``): the
    index tensors broadcast together and wrap negative values as Python does; the first
    indexed dim is an index_select, each further one a gather along it, so every index
    is checked against its own dimension by the kernel that uses it. The broadcast
    dims go where the indexed ones were when these are adjacent, else first (torch's
    rule)."""
    x, indices = args[0], list(args[1])
    xs = shape_of(x)
    pos = [d for d, i in enumerate(indices) if i is not None]
    if not pos or any(elem_of(indices[d]) not in ("i32", "i64") for d in pos):
        raise Unsupported("indexing with boolean masks or non-integer tensors is not supported by kf",
                          cause="index with integer tensors, or use torch.where / masked_fill")
    bshape = _broadcast([shape_of(indices[d]) for d in pos])
    n = math.prod(bshape)
    wrapped = []
    for d in pos:
        i = indices[d]
        if shape_of(i) != bshape:
            i = kb.broadcast_to(i, bshape)
        wrapped.append(kb.reshape(_wrap_negative(i, xs[d]), [n]))
    others = [d for d in range(len(xs)) if d not in pos]
    perm = pos + others
    t = kb.transpose(x, perm=perm) if perm != list(range(len(xs))) else x
    r = kb.index_select(t, wrapped[0], dim=0)  # [n, the other indexed dims, the rest]
    for w in wrapped[1:]:
        rest = list(shape_of(r)[2:])
        at = kb.broadcast_to(kb.reshape(w, [n, 1] + [1] * len(rest)), [n, 1] + rest)
        r = kb.reshape(kb.gather(r, at, dim=1), [n] + rest)
    rest = [xs[d] for d in others]
    r = kb.reshape(r, list(bshape) + rest)
    if pos == list(range(pos[0], pos[0] + len(pos))) and pos[0] > 0:
        nb, before = len(bshape), pos[0]
        r = kb.transpose(r, perm=list(range(nb, nb + before)) + list(range(nb)) +
                         list(range(nb + before, nb + len(rest))))
    return r


def masked_indices(c, name: str, x, mask, indices: list, rest: tuple[int, ...]):
    """(the broadcast index shape, each index tensor broadcast to it with 0 wherever
    mask, broadcast to that shape plus ``rest``, is false at all of its positions) of
    the unsafe masked indexing ops: an index no unmasked element reads may be anything
    (torch does not read through it), an index one does read is checked by the kernel
    that uses it. Only leading indexed dims are taken: mask then lines up with them."""
    pos = [d for d, i in enumerate(indices) if i is not None]
    if pos != list(range(len(pos))) or not pos:
        raise Unsupported(f"{name} with indices for dims {pos} is not supported by kf",
                          cause="kf takes index tensors for the leading dims only")
    if any(elem_of(indices[d]) not in ("i32", "i64") for d in pos):
        raise Unsupported(f"{name} with boolean or non-integer indices is not supported by kf")
    bshape = _broadcast([shape_of(indices[d]) for d in pos])
    full = tuple(bshape) + tuple(rest)
    m = kb.broadcast_to(mask, full) if shape_of(mask) != full else mask
    if rest:  # an index is read where any of its elements is unmasked
        m = kb.cmp(kb.reduce_max(kb.cast(m, "i32"), dims=list(range(len(bshape), len(full))), keepdim=False),
                   kb.scalar(0.0, "i32"), predicate="ne")
    safe = []
    for d in pos:
        i = indices[d]
        i = kb.broadcast_to(i, bshape) if shape_of(i) != tuple(bshape) else i
        safe.append(kb.select(m, i, kb.scalar(0.0, elem_of(i))))
    return tuple(bshape), safe


@handles("aten._unsafe_masked_index.default")
def _unsafe_masked_index(c, node, args, kwargs):
    """where(mask, x[indices], fill): x indexed only through the indices some unmasked
    element reads (``masked_indices``), every one of those checked."""
    x, mask, indices, fill = args
    out = tuple(fake_value(node).shape)
    k = sum(i is not None for i in indices)
    _, safe = masked_indices(c, "_unsafe_masked_index", x, mask, list(indices), shape_of(x)[k:])
    r = _index_tensor(c, node, [x, safe + [None] * (len(indices) - k)], {})
    elem = spec_of(r.type).elem
    m = kb.broadcast_to(mask, out) if shape_of(mask) != out else mask
    return kb.select(m, r, kb.reshape(c.tensor(fill, elem), ()) if isinstance(fill, ir.Value)
                     else kb.scalar(float(fill), elem))


def _broadcast(shapes) -> tuple[int, ...]:
    from kf.dialects.types import broadcast_shapes

    return broadcast_shapes(*shapes)


@handles("aten.take.default")
def _take(c, node, args, kwargs):
    x, index = args
    n = math.prod(shape_of(x))
    flat_index = _wrap_negative(kb.reshape(index, [math.prod(shape_of(index))]), n)
    return _as_shape(c, node, kb.index_select(kb.reshape(x, [n]), flat_index, dim=0))


@handles("aten.take_along_dim.default")
def _take_along_dim(c, node, args, kwargs):
    x, index = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is None:
        return _take(c, node, [x, index], {})
    d = _dim(dim, x)
    x, index = as_vector(x), as_vector(index)
    # torch broadcasts the two in every dim but dim
    outside = [shape_of(t)[:d] + (1,) + shape_of(t)[d + 1:] for t in (x, index)]
    shape = list(_broadcast(outside))
    xb, ib = list(shape), list(shape)
    xb[d], ib[d] = shape_of(x)[d], shape_of(index)[d]
    x = kb.broadcast_to(x, xb) if list(shape_of(x)) != xb else x
    index = kb.broadcast_to(index, ib) if list(shape_of(index)) != ib else index
    return _as_shape(c, node, kb.gather(x, _wrap_negative(index, xb[d]), dim=d))


@handles("aten.one_hot.default")
def _one_hot(c, node, args, kwargs):
    """``one_hot(i, C)``: each index is checked (torch refuses classes outside [0, C))
    by an index_select from ``arange(C)``, then compared with every class."""
    i = args[0]
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    n = math.prod(shape_of(i))
    table = c.constant_tensor(torch.arange(classes, dtype=torch.int64))
    checked = kb.index_select(table, kb.cast(kb.reshape(i, [n]), "i64") if elem_of(i) != "i64"
                              else kb.reshape(i, [n]), dim=0)
    hot = kb.cmp(kb.reshape(checked, [n, 1]), kb.reshape(table, [1, classes]), predicate="eq")
    return _as_shape(c, node, kb.cast(hot, "i64"))


@handles("aten.cross_entropy_loss.default", "aten.nll_loss_nd.default", "aten.nll_loss.default",
         "aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll(c, node, args, kwargs):
    """cross_entropy / nll_loss with class indices: the picked log-probability of each
    target (a gather, so each target is checked against the classes; targets equal to
    ignore_index are left out and never read), weighted, then reduced as torch does.
    cross_entropy also takes class probabilities as the target (``_soft_cross_entropy``)
    and label smoothing, with torch's formulas for both."""
    cross = node.target._opname == "cross_entropy_loss"
    names = ["self", "target", "weight", "reduction", "ignore_index"] + (["label_smoothing"] if cross else [])
    p = dict(zip(names, args))
    p.update(kwargs)
    x, target = p["self"], p["target"]
    weight, reduction = p.get("weight"), p.get("reduction", 1)
    ignore = p.get("ignore_index", -100)
    smoothing = float(p.get("label_smoothing", 0.0) or 0.0) if cross else 0.0
    if isinstance(reduction, str):
        reduction = {"none": 0, "mean": 1, "sum": 2}[reduction]
    if cross and isinstance(target, ir.Value) and spec_of(target.type).is_float:
        return _soft_cross_entropy(c, node, x, target, weight, reduction, smoothing)
    if not isinstance(target, ir.Value) or not elem_of(target) in ("i32", "i64"):
        given = elem_of(target) if isinstance(target, ir.Value) else type(target).__name__
        raise Unsupported(f"{_target_name(node.target)} with a target of {given} is not supported by kf",
                          cause="give class indices or, to cross_entropy, class probabilities")
    elem = spec_of(x.type).elem
    logp = kb.log_softmax(x, dim=0 if rank_of(x) == 1 else 1) if cross else x
    if rank_of(logp) == 1:
        logp, target = kb.reshape(logp, [1, shape_of(logp)[0]]), kb.reshape(target, [1])
    ts = shape_of(target)
    t_elem = elem_of(target)
    valid = kb.cmp(target, kb.fill((), t_elem, float(ignore)), predicate="ne")
    safe = kb.select(valid, target, kb.fill((), t_elem, 0.0))  # ignored targets read class 0, weighted 0
    at = kb.reshape(safe, [ts[0], 1, *ts[1:]])
    picked = kb.reshape(kb.gather(logp, at, dim=1), list(ts))
    w = kb.cast(valid, elem)
    if weight is not None:
        w = kb.mul(w, kb.reshape(kb.index_select(weight, kb.reshape(safe, [math.prod(ts)]), dim=0), list(ts)))
    loss = kb.neg(kb.mul(picked, w))
    dims = list(range(len(ts)))
    if node.target._opname in ("nll_loss_forward", "nll_loss2d_forward"):
        total = kb.sum(w, dims=dims)
        out = loss if reduction == 0 else kb.sum(loss, dims=dims)
        if reduction == 1:
            out = kb.div(out, total)
        return (_as_shape(c, node, out) if reduction == 0 else out, total)
    out = loss if reduction == 0 else kb.sum(loss, dims=dims)
    if reduction == 1:
        out = kb.div(out, kb.sum(w, dims=dims))
    if smoothing:
        # torch: (1 - s) * nll + s / C * the loss of a uniform target, -sum_c w_c logp_c,
        # 0 where the target is ignored, its mean over the same weights as nll's
        classes = shape_of(logp)[1]
        wl = logp if weight is None else kb.mul(logp, kb.reshape(weight, [1, classes] + [1] * (len(ts) - 1)))
        uniform = kb.select(valid, kb.neg(kb.sum(wl, dims=[1])), kb.fill((), elem, 0.0))
        smooth = uniform if reduction == 0 else kb.sum(uniform, dims=dims)
        if reduction == 1:
            smooth = kb.div(smooth, kb.sum(w, dims=dims))
        out = kb.add(kb.mul(out, kb.fill((), elem, 1.0 - smoothing)),
                     kb.mul(smooth, kb.fill((), elem, smoothing / classes)))
    return _as_shape(c, node, out) if reduction == 0 else out


def _soft_cross_entropy(c, node, x, target, weight, reduction: int, smoothing: float):
    """cross_entropy with class probabilities as the target, as torch computes it:
    ``-sum_c w_c * target_c * log_softmax(x)_c`` per sample (the target smoothed to
    ``target * (1 - s) + s / C`` first); the mean divides the sum by the number of
    samples (``numel / C``, not the weights' sum: torch's rule for this form; NaN when
    there are none)."""
    if shape_of(target) != shape_of(x):
        raise Unsupported(f"cross_entropy with class probabilities needs the target of the input's shape "
                          f"{list(shape_of(x))}, got {list(shape_of(target))}")
    elem = spec_of(x.type).elem
    class_dim = 0 if rank_of(x) == 1 else 1
    classes = shape_of(x)[class_dim]
    logp = kb.log_softmax(x, dim=class_dim)
    if elem_of(target) != elem:
        target = kb.cast(target, elem)
    if smoothing:
        target = kb.add(kb.mul(target, kb.fill((), elem, 1.0 - smoothing)), kb.fill((), elem, smoothing / classes))
    terms = kb.mul(logp, target)
    if weight is not None:
        view = [classes] if rank_of(x) == 1 else [1, classes] + [1] * (rank_of(x) - 2)
        terms = kb.mul(terms, kb.reshape(weight, view))
    if reduction == 0:
        return _as_shape(c, node, kb.neg(kb.sum(terms, dims=[class_dim])))
    out = kb.neg(kb.sum(terms, dims=list(range(rank_of(x)))))
    if reduction == 1:
        out = kb.div(out, kb.fill((), elem, float(math.prod(shape_of(x)) // max(classes, 1)) if classes else 0.0))
    return out


_SEGMENT_REDUCE = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}


@handles("aten.segment_reduce.default")
def _segment_reduce(c, node, args, kwargs):
    """segment_reduce with lengths or offsets (batched over the dims before axis): each
    element's segment is how many segment starts it has reached, less one; elements in
    no segment (before the first start or past the last end, which torch does not read)
    land in an extra segment that is dropped; one kf.scatter_reduce from the initial
    value (sum 0, prod 1, max -inf, min inf, mean 0), then the mean divides by the
    segment's length (NaN for an empty one without initial). Every offset is checked
    to lie in [0, size] and every length to be >= 0, as torch's checks (which it leaves
    out with unsafe=True, reading out of bounds)."""
    from .reductions import bound_args

    p = bound_args(node, args, kwargs)
    data, reduce, axis = p["data"], p["reduce"], int(p["axis"]) % max(rank_of(p["data"]), 1)
    if reduce not in _SEGMENT_REDUCE:
        raise Unsupported(f"segment_reduce with reduce={reduce!r} is not supported by kf")
    if p.get("indices") is not None:
        raise Unsupported("segment_reduce with indices is not supported by kf (nor by torch)")
    elem = spec_of(data.type).elem
    shape = shape_of(data)
    lead, n, tail = shape[:axis], shape[axis], shape[axis + 1:]
    checks = c.constant_tensor(torch.arange(n + 1, dtype=torch.int64))

    def checked(v):  # v itself, each element checked to lie in [0, n]
        flat = kb.reshape(kb.cast(v, "i64"), [math.prod(shape_of(v))])
        return kb.reshape(kb.index_select(checks, flat, dim=0), shape_of(v))

    if p.get("offsets") is not None:
        given = kb.cast(p["offsets"], "i64")
        s = shape_of(given)[-1] - 1
        first = checked(kb.slice(given, dim=len(lead), start=0, end=1, step=1))
        lengths = kb.sub(kb.slice(given, dim=len(lead), start=1, end=s + 1, step=1),
                         kb.slice(given, dim=len(lead), start=0, end=s, step=1))
    else:
        lengths = kb.cast(p["lengths"], "i64")
        s = shape_of(lengths)[-1]
        first = kb.fill((*lead, 1), "i64", 0.0)
    # the offsets again from the checked lengths (each >= 0), then checked (each <= n):
    # every check feeds the result
    lengths = checked(lengths) if s else lengths
    ends = [kb.add(first, kb.build("scan", [lengths], {"dim": len(lead), "kind": "sum"}).result)] if s else []
    offsets = checked(kb.concat([first, *ends], dim=len(lead)))
    out = tuple(fake_value(node).shape)
    init = p.get("initial")
    start = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[reduce] if init is None \
        else float(init)
    if s == 0 or n == 0:
        filled = kb.fill(out, elem, start)
        if reduce == "mean" and init is None:
            return kb.fill(out, elem, math.nan)
        return filled
    # segment of element j: starts reached - 1, or s (dropped) outside [offsets[0], offsets[s])
    j = kb.iota((*lead, n, 1), len(lead))
    reached = kb.sum(kb.cast(kb.cmp(kb.reshape(offsets, (*lead, 1, s + 1)), j, predicate="le"), "i64"),
                     dims=[len(lead) + 1], keepdim=False, elem="i64")
    seg = kb.sub(reached, kb.scalar(1.0, "i64"))
    inside = kb.select(kb.cmp(seg, kb.scalar(0.0, "i64"), predicate="ge"),
                       kb.cmp(seg, kb.scalar(float(s), "i64"), predicate="lt"), kb.scalar(False, "i1"))
    seg = kb.select(inside, seg, kb.scalar(float(s), "i64"))
    index = kb.broadcast_to(kb.reshape(seg, (*lead, n, *(1,) * len(tail))), shape)
    acc = kb.fill((*lead, s + 1, *tail), elem, start)
    acc = kb.build("scatter_reduce", [acc, index, data], {"dim": axis, "reduce": _SEGMENT_REDUCE[reduce],
                                                           "include_self": True}).result
    r = kb.slice(acc, dim=axis, start=0, end=s, step=1)
    if reduce == "mean":
        count = kb.reshape(kb.cast(lengths, elem), (*lead, s, *(1,) * len(tail)))
        empty = kb.cmp(count, kb.scalar(0.0, elem), predicate="eq")
        r = kb.select(empty, kb.scalar(math.nan if init is None else float(init), elem),
                      kb.div(r, kb.select(empty, kb.scalar(1.0, elem), count)))
    return kb.reshape(r, out)
