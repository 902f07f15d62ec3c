"""Handlers of reductions (sum, mean, amax, argmax, argmin, aminmax, all/any, prod,
var/std, logsumexp, vector norms, cdist), softmax and the norms (layer, RMS, batch,
group), with the statistics the backward reads."""

from __future__ import annotations

import math

import torch

from kf.dialects import builders as kb
from kf.dialects import spec_of
from kf.dialects.elements import LOW_PRECISION

from ..dtypes import kf_elem
from ..errors import Unsupported
from .core import _target_name, fake_value, handles, norm_dims, rank_of, shape_of


@handles("aten.sum.dim_IntList", "aten.sum.default")
def _sum(c, node, args, kwargs):
    x = args[0]
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), rank_of(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    elem = c.out_elem(node)
    if spec_of(x.type).is_float or elem == spec_of(x.type).elem:
        return kb.sum(c.tensor(x, elem), dims=dims, keepdim=keep)
    return kb.sum(c.tensor(x, elem), dims=dims, keepdim=keep)


@handles("aten.mean.dim", "aten.mean.default")
def _mean(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), rank_of(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    return kb.mean(x, dims=dims, keepdim=keep)


@handles("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")
def _amax(c, node, args, kwargs):
    x = args[0]
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), rank_of(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    is_max = node.target._opname in ("amax", "max")
    return (kb.reduce_max if is_max else kb.reduce_min)(x, dims=dims, keepdim=keep)


@handles("aten.max.dim", "aten.min.dim")
def _max_dim(c, node, args, kwargs):
    x, dim = args[0], args[1]
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if node.target._opname == "max":
        values = kb.reduce_max(x, dims=[dim], keepdim=keep)
        indices = kb.argmax(x, dim=dim, keepdim=keep)
    else:
        values = kb.reduce_min(x, dims=[dim], keepdim=keep)
        indices = kb.argmax(reversed_order(x), dim=dim, keepdim=keep)
    return (values, indices)


def reversed_order(x):
    """A tensor whose argmax is x's argmin: -x for floats (NaN stays NaN, the greatest
    for both), -1 - x for integers (no overflow at the type's minimum, where -x wraps),
    booleans as i32."""
    elem = spec_of(x.type).elem
    if spec_of(x.type).is_float:
        return kb.neg(x)
    if elem == "i1":
        x, elem = kb.cast(x, "i32"), "i32"
    return kb.sub(kb.scalar(-1.0, elem), x)


@handles("aten.argmin.default")
def _argmin(c, node, args, kwargs):
    """argmin as the argmax of x in reversed order (the first minimum; a NaN first)."""
    p = bound_args(node, args, kwargs)
    x, dim = p["self"], p["dim"]
    if dim is None or rank_of(x) == 0:
        x, dim = kb.reshape(x, [math.prod(shape_of(x))]), 0
    out = kb.argmax(reversed_order(x), dim=dim % rank_of(x), keepdim=bool(p["keepdim"]))
    return kb.reshape(out, tuple(fake_value(node).shape))


@handles("aten.aminmax.default")
def _aminmax(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    x = p["self"]
    if rank_of(x) == 0:
        x = kb.reshape(x, [1])
    dims = norm_dims(p["dim"], rank_of(x))
    keep = bool(p["keepdim"])
    shapes = [tuple(v.shape) for v in fake_value(node)]
    return (kb.reshape(kb.reduce_min(x, dims=dims, keepdim=keep), shapes[0]),
            kb.reshape(kb.reduce_max(x, dims=dims, keepdim=keep), shapes[1]))


@handles("aten.all.dims", "aten.all.dim", "aten.all.default", "aten.any.dims", "aten.any.dim", "aten.any.default")
def _all_any(c, node, args, kwargs):
    """all / any over dims (all of them for None; none for an empty list, as torch): the
    minimum (maximum) of x != 0 over them; over no elements true (false)."""
    p = bound_args(node, args, kwargs)
    x, dim, is_all = p["self"], p.get("dim"), node.target._opname == "all"
    shape, elem = tuple(fake_value(node).shape), c.out_elem(node)
    nonzero = kb.cmp(x, kb.scalar(0.0, spec_of(x.type).elem), predicate="ne")
    if dim is not None and not isinstance(dim, int) and not dim:
        return kb.reshape(c.tensor(nonzero, elem), shape)
    dims = norm_dims(dim, rank_of(x))
    if rank_of(x) and math.prod(shape_of(x)[d] for d in dims) == 0:
        return kb.fill(shape, elem, 1.0 if is_all else 0.0)
    if rank_of(x) == 0:
        nonzero, dims = kb.reshape(nonzero, [1]), [0]
    reduce = kb.reduce_min if is_all else kb.reduce_max
    out = reduce(kb.cast(nonzero, "i32"), dims=dims, keepdim=bool(p.get("keepdim") or False))
    out = kb.cmp(out, kb.scalar(0.0, "i32"), predicate="ne")
    return kb.reshape(c.tensor(out, elem), shape)


@handles("aten.prod.default", "aten.prod.dim_int")
def _prod(c, node, args, kwargs):
    """prod over one dim (or all): the last element of a product kf.scan along it, in
    the result's type (1 over an empty dim)."""
    p = bound_args(node, args, kwargs)
    elem = c.out_elem(node)
    x = c.tensor(p["self"], elem)
    dim = p.get("dim")
    if dim is None or rank_of(x) == 0:
        x, dim = kb.reshape(x, [math.prod(shape_of(x))]), 0
    dim %= rank_of(x)
    n = shape_of(x)[dim]
    out = tuple(fake_value(node).shape)
    if n == 0:
        return kb.fill(out, elem, 1.0)
    scan = kb.build("scan", [x], {"dim": dim, "kind": "prod"}).result
    return kb.reshape(kb.slice(scan, dim=dim, start=n - 1, end=n, step=1), out)


@handles("aten.argmax.default")
def _argmax(c, node, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dim is None:
        x, dim = kb.reshape(x, [math.prod(shape_of(x))]), 0
    return kb.argmax(x, dim=dim, keepdim=keep)


def bound_args(node, args, kwargs) -> dict:
    """The call's arguments by their schema names, defaults filled in: overloads such
    as ``var.default(self, unbiased)`` and ``var.dim(self, dim, unbiased, keepdim)`` put
    different things at one position."""
    return bind_schema(node.target, args, kwargs)


def bind_schema(func: torch._ops.OpOverload, args, kwargs) -> dict:
    """``func``'s arguments by their schema names, defaults filled in."""
    p = {}
    for i, a in enumerate(func._schema.arguments):
        if not a.kwarg_only and i < len(args):
            p[a.name] = args[i]
        elif a.name in kwargs:
            p[a.name] = kwargs[a.name]
        else:
            p[a.name] = a.default_value if a.has_default_value() else None
    return p


#: the element type statistics are computed in: f16/bf16 (and fp8) inputs in f32, rounded once
def stat_elem(elem: str) -> str:
    return "f32" if elem in LOW_PRECISION else elem


def _variance(c, node, args, kwargs):
    """(variance, mean, keepdim, the result element type) of var/std/var_mean/std_mean,
    in the statistics' precision: torch's correction (``unbiased``: 1 or 0; neither: 1),
    all dims for ``dim=None`` or ``[]``; over no elements both are NaN, and where the
    correction leaves no degrees of freedom the variance is m2 / 0 (inf, NaN for m2 = 0),
    as torch's max(0, N - correction)."""
    p = bound_args(node, args, kwargs)
    out = fake_value(node)
    elem = kf_elem((out[0] if isinstance(out, (tuple, list)) else out).dtype)
    x = c.tensor(p["self"], stat_elem(elem))
    dims = norm_dims(p.get("dim"), rank_of(x))
    keep = bool(p.get("keepdim") or False)
    if p.get("correction") is not None:
        corr = float(p["correction"])
    elif p.get("unbiased") is not None:
        corr = 1.0 if p["unbiased"] else 0.0
    else:
        corr = 1.0
    n = math.prod(shape_of(x)[d] for d in dims) if rank_of(x) else 1
    shape = tuple(1 if i in dims else s for i, s in enumerate(shape_of(x)) if keep or i not in dims)
    st = spec_of(x.type).elem
    if n == 0:
        nan = kb.fill(shape, st, math.nan)
        return nan, nan, keep, elem
    return kb.var(x, dims=dims, correction=corr, keepdim=keep), kb.mean(x, dims=dims, keepdim=keep), keep, elem


@handles("aten.var.correction", "aten.var.dim", "aten.var.default")
def _var(c, node, args, kwargs):
    var, _, _, elem = _variance(c, node, args, kwargs)
    return c.tensor(var, elem)


@handles("aten.std.correction", "aten.std.dim", "aten.std.default")
def _std(c, node, args, kwargs):
    var, _, _, elem = _variance(c, node, args, kwargs)
    return c.tensor(kb.sqrt(var), elem)


@handles("aten.var_mean.correction", "aten.var_mean.dim", "aten.var_mean.default",
         "aten.std_mean.correction", "aten.std_mean.dim", "aten.std_mean.default")
def _var_mean(c, node, args, kwargs):
    var, mean, _, elem = _variance(c, node, args, kwargs)
    if node.target._opname == "std_mean":
        var = kb.sqrt(var)
    return c.tensor(var, elem), c.tensor(mean, elem)


@handles("aten.logsumexp.default")
def _logsumexp(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), rank_of(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    out = kb.logsumexp(x, dims=dims, keepdim=keep)
    return out if spec_of(out.type).elem == spec_of(x.type).elem else kb.cast(out, elem=spec_of(x.type).elem)


@handles("kf.logsumexp.default")
def _row_logsumexp(c, node, args, kwargs):
    """kf's own op (compiler/partition.py): the statistic in f32, whatever the input's type."""
    x = args[0]
    return kb.logsumexp(x, dims=norm_dims(args[1], rank_of(x)), keepdim=bool(args[2]))


@handles("aten.softmax.int", "aten._softmax.default")
def _softmax(c, node, args, kwargs):
    return kb.softmax(c.tensor(args[0], c.out_elem(node)), dim=args[1])


@handles("aten.log_softmax.int", "aten._log_softmax.default")
def _log_softmax(c, node, args, kwargs):
    return kb.log_softmax(c.tensor(args[0], c.out_elem(node)), dim=args[1])


def _normalize(c, xs, mean, var, eps: float, weight, bias, param_shape: tuple | None, elem: str):
    """(xs - mean) * rsqrt(var + eps) [* weight] [+ bias] in xs's (statistics) type,
    rounded once to elem; weight and bias reshaped to param_shape (None: as they are);
    returns (y, rstd)."""
    st = spec_of(xs.type).elem
    rstd = kb.rsqrt(kb.add(var, kb.scalar(float(eps), st)))
    y = kb.mul(kb.sub(xs, mean), rstd)
    for p, op in ((weight, kb.mul), (bias, kb.add)):
        if p is not None:
            p = c.tensor(p, st)
            y = op(y, kb.reshape(p, param_shape) if param_shape and shape_of(p) != param_shape else p)
    return c.tensor(y, elem), rstd


@handles("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    x, normalized_shape = p["input"], p["normalized_shape"]
    elem = spec_of(x.type).elem
    xs = c.tensor(x, stat_elem(elem))
    dims = list(range(rank_of(x) - len(normalized_shape), rank_of(x)))
    mean = kb.mean(xs, dims=dims, keepdim=True)
    var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    y, rstd = _normalize(c, xs, mean, var, p["eps"], p.get("weight"), p.get("bias"), None, elem)
    if node.target._opname == "native_layer_norm":
        val = fake_value(node)
        return (y, c.tensor(mean, kf_elem(val[1].dtype)), c.tensor(rstd, kf_elem(val[2].dtype)))
    return y


@handles("aten.rms_norm.default")
def _rms_norm(c, node, args, kwargs):
    """x * rsqrt(mean(x²) + eps) * weight; eps None: the machine epsilon of the type
    the statistics are computed in, as torch."""
    p = bound_args(node, args, kwargs)
    x = p["input"]
    elem = spec_of(x.type).elem
    st = stat_elem(elem)
    xs = c.tensor(x, st)
    eps = p.get("eps")
    eps = torch.finfo(torch.float64 if st == "f64" else torch.float32).eps if eps is None else float(eps)
    dims = list(range(rank_of(x) - len(p["normalized_shape"]), rank_of(x)))
    ms = kb.mean(kb.mul(xs, xs), dims=dims, keepdim=True)
    y = kb.mul(xs, kb.rsqrt(kb.add(ms, kb.scalar(eps, st))))
    if p.get("weight") is not None:
        y = kb.mul(y, c.tensor(p["weight"], st))
    return c.tensor(y, elem)


def _channel_shape(x) -> tuple[int, ...]:
    """Where a per-channel tensor (dim 1 of x) broadcasts against x: (1, C, 1, ...)."""
    return (1, shape_of(x)[1]) + (1,) * (rank_of(x) - 2)


def _batch_norm(c, x, weight, bias, running_mean, running_var, training: bool, momentum, eps: float):
    """Batch norm as torch's kernels compute it: (out, mean, rstd, new running mean, new
    running var) in the statistics' type (the last two None without running stats).
    Training normalizes by the batch's statistics over every dim but the channels (the
    biased variance), and moves the running ones towards them: ``(1 - momentum) *
    running + momentum * batch``, with the unbiased variance; otherwise it normalizes by
    the running statistics."""
    elem = spec_of(x.type).elem
    st = stat_elem(elem)
    xs = c.tensor(x, st)
    ch = _channel_shape(x)
    C = ch[1]
    if training:
        dims = [0] + list(range(2, rank_of(x)))
        mean = kb.mean(xs, dims=dims, keepdim=True)
        var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    elif running_mean is None or running_var is None:
        raise Unsupported("batch norm in evaluation mode needs running_mean and running_var")
    else:
        mean = kb.reshape(c.tensor(running_mean, st), ch)
        var = kb.reshape(c.tensor(running_var, st), ch)
    y, rstd = _normalize(c, xs, mean, var, eps, weight, bias, ch, elem)
    new_mean = new_var = None
    if training and running_mean is not None and running_var is not None:
        n = math.prod(shape_of(x)) // max(C, 1)
        m = 0.1 if momentum is None else float(momentum)
        batch_var = kb.mul(var, kb.scalar(n / (n - 1), st)) if n > 1 else kb.mul(var, kb.scalar(math.inf, st))
        moved = []
        for running, batch in ((running_mean, mean), (running_var, batch_var)):
            r_elem = spec_of(running.type).elem
            r = kb.add(kb.mul(c.tensor(running, st), kb.scalar(1.0 - m, st)),
                       kb.mul(kb.reshape(batch, (C,)), kb.scalar(m, st)))
            moved.append(c.tensor(r, r_elem))
        new_mean, new_var = moved
    return y, mean, rstd, new_mean, new_var


def _saved(c, node, i: int, stat):
    """Output i of a batch norm node (a saved mean or rstd): the statistic reshaped to the
    shape torch gives (C; 0 elements in evaluation mode) and its type."""
    val = fake_value(node)[i]
    if math.prod(val.shape) == 0:
        return kb.fill(tuple(val.shape), kf_elem(val.dtype), 0.0)
    return c.tensor(kb.reshape(stat, tuple(val.shape)), kf_elem(val.dtype))


@handles("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.default",
         "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_no_training.default",
         "aten.native_batch_norm.default", "aten._batch_norm_with_update_functional.default",
         "aten._batch_norm_with_update.default")
def _native_batch_norm(c, node, args, kwargs):
    """The ATen batch norms of a functionalized graph: (out, save_mean, save_rstd), then
    for ``_batch_norm_with_update_functional`` (a training norm) the reserve (a uint8
    tensor of no elements on the CPU), and the new running statistics for the
    ``_functional`` forms (which capture copies back into the caller's tensors). The forms
    that write to their running statistics themselves appear only in a graph capture did
    not functionalize: they are refused."""
    p = bound_args(node, args, kwargs)
    name = _target_name(node.target)
    with_update = name.startswith("aten._batch_norm_with_update")
    training = name == "aten._native_batch_norm_legit.no_stats" or bool(p.get("training")) or with_update
    rm, rv = p.get("running_mean"), p.get("running_var")
    writes = name in ("aten._native_batch_norm_legit.default", "aten.native_batch_norm.default",
                      "aten._batch_norm_with_update.default")
    if writes and training and rm is not None:
        raise Unsupported(f"{name} writes to its running statistics in a graph kf did not functionalize",
                          cause="an internal error in kf's capture")
    y, mean, rstd, new_mean, new_var = _batch_norm(c, p["input"], p.get("weight"), p.get("bias"), rm, rv,
                                                   training, p.get("momentum"), float(p["eps"]))
    outs = (y, _saved(c, node, 1, mean), _saved(c, node, 2, rstd))
    if with_update:
        outs += (_saved(c, node, 3, None),)
    if name.endswith("_functional.default"):
        outs += (new_mean, new_var)
    return outs


@handles("aten.batch_norm.default", "aten.instance_norm.default")
def _batch_norm_op(c, node, args, kwargs):
    """F.batch_norm / F.instance_norm as one op (a graph capture did not functionalize, or
    instance norm, which torch.export keeps whole). The running statistics a training
    norm would update are refused: the graph has no output to write them back from."""
    p = bound_args(node, args, kwargs)
    x, rm, rv = p["input"], p.get("running_mean"), p.get("running_var")
    training = bool(p["training"] if "training" in p else p["use_input_stats"])
    name = node.target._opname
    if training and (rm is not None or rv is not None):
        raise Unsupported(f"{name} with running statistics in training mode is not supported by kf",
                          cause="kf does not update the running statistics of this form; pass "
                                "running_mean=None and running_var=None (track_running_stats=False)"
                          if name == "instance_norm" else "an internal error in kf's capture")
    if name == "batch_norm":
        return _batch_norm(c, x, p.get("weight"), p.get("bias"), rm, rv, training, p.get("momentum"),
                           float(p["eps"]))[0]
    if not training:  # instance norm by the running statistics: a batch norm in evaluation
        return _batch_norm(c, x, p.get("weight"), p.get("bias"), rm, rv, False, None, float(p["eps"]))[0]
    elem = spec_of(x.type).elem
    xs = c.tensor(x, stat_elem(elem))
    dims = list(range(2, rank_of(x)))
    mean = kb.mean(xs, dims=dims, keepdim=True)
    var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    return _normalize(c, xs, mean, var, float(p["eps"]), p.get("weight"), p.get("bias"), _channel_shape(x),
                      elem)[0]


@handles("aten.group_norm.default", "aten.native_group_norm.default")
def _group_norm(c, node, args, kwargs):
    """Statistics over each group of channels (and every spatial dim), computed on x
    viewed as (N, G, C / G, spatial): the reductions are over trailing dims, and the
    per-channel weight and bias are applied in that view."""
    p = bound_args(node, args, kwargs)
    x = p["input"]
    shape = shape_of(x)
    if node.target._opname == "native_group_norm":
        g = p["group"]
    else:
        g = p["num_groups"]
    n, ch = shape[0], shape[1]
    if g <= 0 or ch % g:
        raise Unsupported(f"group_norm of {ch} channels in {g} groups")
    elem = spec_of(x.type).elem
    st = stat_elem(elem)
    spatial = math.prod(shape[2:])
    eps = float(p["eps"])
    if ch // g * spatial == 1:
        # groups of one element, (N, C) with C groups: each is its own mean, its variance
        # is 0 (in x's own layout: no reduction whose result a reshape would carry)
        xs = c.tensor(kb.reshape(x, (n, g)), st)
        y, rstd = _normalize(c, xs, xs, kb.fill((n, g), st, 0.0), eps, p.get("weight"), p.get("bias"), None, elem)
        mean, y = xs, kb.reshape(y, shape)
    else:
        grouped = (n, g, ch // g, spatial)
        xs = c.tensor(kb.reshape(x, grouped), st)
        mean = kb.mean(xs, dims=[2, 3], keepdim=True)
        var = kb.var(xs, dims=[2, 3], correction=0.0, keepdim=True)
        y, rstd = _normalize(c, xs, mean, var, eps, p.get("weight"), p.get("bias"), (1, g, ch // g, 1), elem)
        y = kb.reshape(y, shape)
    if node.target._opname == "native_group_norm":
        val = fake_value(node)
        return (y, c.tensor(kb.reshape(mean, (n, g)), kf_elem(val[1].dtype)),
                c.tensor(kb.reshape(kb.broadcast_to(rstd, shape_of(mean)), (n, g)), kf_elem(val[2].dtype)))
    return y


@handles("aten.linalg_vector_norm.default", "aten.norm.Scalar", "aten.norm.ScalarOpt_dim",
         "aten.norm.ScalarOpt_dim_dtype", "aten.norm.ScalarOpt_dtype")
def _vector_norm(c, node, args, kwargs):
    """Vector norms over dims (all for None or []): ord inf / -inf the largest / smallest
    |x|, 0 the count of nonzeros, 1 the sum of |x|, 2 the square root of the sum of
    squares, any other p (sum |x|^p)^(1/p); in the statistics' type (f32 for 16-bit
    inputs), rounded once to the result's."""
    p = bound_args(node, args, kwargs)
    order = p.get("ord", p.get("p"))
    order = 2.0 if order is None else float(order)
    elem = c.out_elem(node)
    st = stat_elem(elem)
    x = c.tensor(p["self"], st)
    out = tuple(fake_value(node).shape)
    if rank_of(x) == 0:
        x = kb.reshape(x, [1])
    dims = norm_dims(p.get("dim"), rank_of(x))
    keep = bool(p.get("keepdim") or False)
    if math.prod(shape_of(x)[d] for d in dims) == 0:
        if math.isinf(order):
            raise Unsupported(f"a vector norm of order {order} over no elements", cause="torch refuses it too")
        return kb.fill(out, elem, 0.0)
    return kb.reshape(c.tensor(p_norm(x, order, dims, keep), elem), out)


def p_norm(x, order: float, dims: list[int], keep: bool):
    """The vector norm of x of an order over dims (not empty), in x's type."""
    st = spec_of(x.type).elem
    a = kb.abs(x)
    if order == math.inf:
        r = kb.reduce_max(a, dims=dims, keepdim=keep)
    elif order == -math.inf:
        r = kb.reduce_min(a, dims=dims, keepdim=keep)
    elif order == 0:
        r = kb.sum(kb.cast(kb.cmp(x, kb.scalar(0.0, st), predicate="ne"), st), dims=dims, keepdim=keep)
    elif order == 1:
        r = kb.sum(a, dims=dims, keepdim=keep)
    elif order == 2:
        r = kb.sqrt(kb.sum(kb.mul(x, x), dims=dims, keepdim=keep))
    else:
        r = kb.pow(kb.sum(kb.pow(a, kb.scalar(order, st)), dims=dims, keepdim=keep), kb.scalar(1.0 / order, st))
    return r


@handles("aten.cdist.default", "aten._cdist_forward.default")
def _cdist(c, node, args, kwargs):
    """cdist: the p-norm of every row of x1 less every row of x2 (batch dims broadcast),
    computed directly (torch's mm-based Euclidean form rounds more)."""
    p = bound_args(node, args, kwargs)
    x1, x2, order = p["x1"], p["x2"], float(p["p"])
    elem = c.out_elem(node)
    st = stat_elem(elem)
    out = tuple(fake_value(node).shape)
    m = shape_of(x1)[-1]
    if m == 0:
        return kb.fill(out, elem, 0.0)
    a = kb.reshape(c.tensor(x1, st), (*shape_of(x1)[:-1], 1, m))
    b = kb.reshape(c.tensor(x2, st), (*shape_of(x2)[:-2], 1, *shape_of(x2)[-2:]))
    diff = kb.sub(a, b)
    return kb.reshape(c.tensor(p_norm(diff, order, [rank_of(diff) - 1], False), elem), out)


@handles("aten.linalg_norm.default", "aten.linalg_matrix_norm.default", "aten.linalg_norm.ord_str",
         "aten.linalg_matrix_norm.str_ord")
def _linalg_norm(c, node, args, kwargs):
    """linalg.norm and linalg.matrix_norm: over one dim (or a 1-D input) a vector norm;
    over two a matrix norm: 'fro' (and no ord) the vector 2-norm of the elements, inf /
    -inf the largest / smallest row sum of |x|, 1 / -1 the largest / smallest column
    sum. The orders made of singular values (2, -2, 'nuc') are refused; over no elements
    torch's value (it depends on the shape alone)."""
    name = _target_name(node.target)
    p = bound_args(node, args, kwargs)
    order = p.get("ord")
    elem = c.out_elem(node)
    x = c.tensor(p["self"], stat_elem(elem))
    dim = p.get("dim")
    if dim is None:
        dims = list(range(rank_of(x))) if order is None or rank_of(x) <= 2 else None
        if dims is None:
            raise Unsupported(f"{name} of a {rank_of(x)}-d tensor with ord={order} and no dim",
                              cause="torch refuses it too")
    else:
        dims = norm_dims(dim, rank_of(x))
    out = tuple(fake_value(node).shape)
    if rank_of(x) and math.prod(shape_of(x)) == 0:  # depends on the shape alone: torch's value, a constant
        self = fake_value(node.args[0])
        return c.constant_tensor(node.target(torch.empty(tuple(self.shape), dtype=self.dtype), *args[1:], **kwargs))
    if rank_of(x) == 0:
        x, dims = kb.reshape(x, [1]), [0]
    if order is None or order == "fro" or (len(dims) == 1 and not isinstance(order, str)) or \
            (dim is None and order is None):
        vector_order = 2.0 if order is None or order == "fro" else float(order)
        return kb.reshape(c.tensor(p_norm(x, vector_order, dims, True), elem), out)
    if len(dims) != 2 or isinstance(order, str) or float(order) not in (math.inf, -math.inf, 1.0, -1.0):
        raise Unsupported(f"{name} with ord={order!r} over dims {dims} is not supported by kf",
                          cause="the spectral and nuclear norms need singular values")
    d_rows, d_cols = dims
    summed, over = (d_cols, d_rows) if abs(float(order)) == math.inf else (d_rows, d_cols)
    sums = kb.sum(kb.abs(x), dims=[summed], keepdim=True)
    r = (kb.reduce_max if float(order) > 0 else kb.reduce_min)(sums, dims=[over], keepdim=True)
    return kb.reshape(c.tensor(r, elem), out)


def _covariance(c, x, correction: float, elem: str):
    """torch.cov's (variables, variables) matrix of x (rows are variables, columns
    observations; a tensor of rank < 2 is one variable) without weights, in the
    statistics' precision: the deviations from each row's mean times their transpose,
    over max(0, N - correction) (torch's degrees of freedom: 0 gives inf and NaN)."""
    st = stat_elem(elem)
    x = c.tensor(x, st)
    shape = shape_of(x)
    rows, cols = shape if len(shape) == 2 else (1, math.prod(shape))
    x = kb.reshape(x, (rows, cols))
    dev = kb.sub(x, kb.mean(x, dims=[1], keepdim=True))
    prod = kb.matmul(dev, kb.transpose(dev, perm=[1, 0]))
    return kb.div(prod, kb.scalar(float(max(0.0, cols - correction)), st)), rows


def _refuse_weights(name: str, p: dict) -> None:
    if p.get("fweights") is not None or p.get("aweights") is not None:
        raise Unsupported(f"{name} with fweights or aweights is not supported by kf",
                          cause="torch checks the weights' values (non-negative, a nonzero sum), which a "
                                "compiled function cannot")


@handles("aten.cov.default")
def _cov(c, node, args, kwargs):
    p = bound_args(node, args, kwargs)
    _refuse_weights("torch.cov", p)
    if rank_of(p["self"]) > 2:
        raise Unsupported("torch.cov of a tensor of more than 2 dims")
    elem = c.out_elem(node)
    cov, _ = _covariance(c, p["self"], float(p["correction"]), elem)
    return c.tensor(kb.reshape(cov, tuple(fake_value(node).shape)), elem)


@handles("aten.corrcoef.default")
def _corrcoef(c, node, args, kwargs):
    """torch.corrcoef: the covariance over the outer product of the variables' standard
    deviations (its diagonal's square roots), clipped to [-1, 1]; one variable gives
    c / c (1, or NaN where the variance is 0, inf or NaN)."""
    x = args[0]
    if rank_of(x) > 2:
        raise Unsupported("torch.corrcoef of a tensor of more than 2 dims")
    elem = c.out_elem(node)
    cov, rows = _covariance(c, x, 1.0, elem)
    if rows == 1:
        return c.tensor(kb.reshape(kb.div(cov, cov), ()), elem)
    diagonal = c.constant_tensor(torch.arange(rows, dtype=torch.int64) * (rows + 1))
    std = kb.sqrt(kb.index_select(kb.reshape(cov, (rows * rows,)), diagonal, dim=0))
    out = kb.div(kb.div(cov, kb.reshape(std, (rows, 1))), kb.reshape(std, (1, rows)))
    st = spec_of(out.type).elem
    out = kb.min(kb.max(out, kb.scalar(-1.0, st)), kb.scalar(1.0, st))
    return c.tensor(out, elem)


@handles("aten.histc.default")
def _histc(c, node, args, kwargs):
    """torch.histc: counts of x's elements in ``bins`` equal bins over [min, max] (both
    0: the elements' own minimum and maximum, widened by 1 each way where they are
    equal), as torch's CPU kernel bins them: elements outside the range (and NaN) count
    nowhere, element e falls in bin ``trunc((e - min) * bins / (max - min))`` computed in
    x's type, max itself in the last bin. The counts are a kf.scatter_add of ones, the
    elements outside routed to one bin past the end and dropped."""
    p = bound_args(node, args, kwargs)
    x, bins = p["self"], int(p.get("bins", 100))
    elem = spec_of(x.type).elem
    if not spec_of(x.type).is_float:
        raise Unsupported(f"histc of {elem} tensors is not supported by kf (torch computes it for floats)")
    lo, hi = float(p.get("min", 0)), float(p.get("max", 0))
    if lo > hi:
        raise Unsupported(f"histc with min {lo} greater than max {hi}", cause="torch refuses it too")
    n = math.prod(shape_of(x))
    flat = kb.reshape(x, (n,))
    if lo == hi:
        if n == 0:
            return kb.fill((bins,), elem, 0.0)
        low = kb.reduce_min(flat, dims=[0], keepdim=False)
        high = kb.reduce_max(flat, dims=[0], keepdim=False)
        same = kb.cmp(low, high, predicate="eq")
        low = kb.select(same, kb.sub(low, kb.scalar(1.0, elem)), low)
        high = kb.select(same, kb.add(high, kb.scalar(1.0, elem)), high)
    else:
        low, high = kb.scalar(lo, elem), kb.scalar(hi, elem)
    if n == 0:
        return kb.fill((bins,), elem, 0.0)
    pos = kb.cast(kb.div(kb.mul(kb.sub(flat, low), kb.scalar(float(bins), elem)), kb.sub(high, low)), "i64")
    pos = kb.select(kb.cmp(pos, kb.scalar(float(bins), "i64"), predicate="eq"), kb.scalar(float(bins - 1), "i64"), pos)
    inside = kb.select(kb.cmp(flat, low, predicate="ge"), kb.cmp(flat, high, predicate="le"),
                       kb.scalar(False, "i1"))
    pos = kb.select(inside, pos, kb.scalar(float(bins), "i64"))
    counts = kb.scatter_add(kb.fill((bins + 1,), elem, 0.0), pos, kb.fill((n,), elem, 1.0), dim=0)
    return kb.slice(counts, dim=0, start=0, end=bins, step=1)
