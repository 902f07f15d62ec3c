"""Handlers of pooling (avg_pool, adaptive_avg_pool, max_unpool) and embedding bags."""

from __future__ import annotations

import itertools
import math
import operator

import torch

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import fake_value, handles, rank_of, shape_of
from .reductions import bound_args, stat_elem
from .writes import mask_constant


def _windows(size: int, out: int, kernel: int, stride: int, pad: int) -> tuple[list, list, list]:
    """torch's avg_pool windows along one dim: (first index, end, window size counting
    padding) per output, the indices clipped to the input."""
    los, his, sizes = [], [], []
    for o in range(out):
        start = o * stride - pad
        end = min(start + kernel, size + pad)
        sizes.append(end - start)
        los.append(max(start, 0))
        his.append(min(end, size))
    return los, his, sizes


def _window_sum(c, x, dim: int, los: list, his: list):
    """out[.., o, ..] = sum of x[.., lo[o]:hi[o], ..] along dim (0 for an empty window)."""
    size, out = shape_of(x)[dim], len(los)
    elem = spec_of(x.type).elem
    along = [1] * rank_of(x)
    along[dim] = out
    total = None
    for j in range(max((h - lo for lo, h in zip(los, his)), default=0)):
        pos = torch.tensor([lo + j for lo in los])
        valid = torch.tensor([lo + j < h for lo, h in zip(los, his)])
        if pos.tolist() == list(range(size)) and bool(valid.all()):
            term = x
        else:
            term = kb.index_select(x, c.constant_tensor(pos.clamp(0, size - 1)), dim=dim)
        if not bool(valid.all()):
            term = kb.select(mask_constant(c, valid.reshape(along)), term, kb.scalar(0.0, elem))
        total = term if total is None else kb.add(total, term)
    if total is None:
        shape = list(shape_of(x))
        shape[dim] = out
        return kb.fill(shape, elem, 0.0)
    return total


def _pool_mean(c, x, windows: list[tuple[list, list]], divisor: torch.Tensor):
    """x summed over the windows of its last len(windows) dims, divided by divisor (the
    outputs' spatial shape), in the statistics' type and rounded once."""
    elem = spec_of(x.type).elem
    xs = c.tensor(x, stat_elem(elem))
    k = len(windows)
    for i, (los, his) in enumerate(windows):
        xs = _window_sum(c, xs, rank_of(x) - k + i, los, his)
    if not spec_of(xs.type).is_float:
        # integers (torch's CPU kernels): the sum divided by the count as C divides, toward zero
        return c.tensor(kb.div(xs, c.tensor(c.constant_tensor(divisor.to(torch.int64)), spec_of(xs.type).elem)),
                        elem)
    out = kb.div(xs, c.constant_tensor(divisor.to(torch.float64 if stat_elem(elem) == "f64" else torch.float32)))
    return c.tensor(out, elem)


def _triple(v, k: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * k if len(v) == 1 else v


@handles("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(c, node, args, kwargs):
    """torch's avg_pool: windows of kernel_size every stride, padding counted in the
    divisor with count_include_pad (up to the padded input's end, so that ceil_mode's
    extra window is not), divisor_override instead of either."""
    p = bound_args(node, args, kwargs)
    x = p["self"]
    k = int(node.target._opname[-2])
    kernel = _triple(p["kernel_size"], k)
    stride = _triple(p.get("stride") or kernel, k)
    pad = _triple(p.get("padding") or 0, k)
    out = tuple(fake_value(node).shape[-k:])
    windows, factors = [], []
    for d in range(k):
        los, his, sizes = _windows(shape_of(x)[rank_of(x) - k + d], out[d], kernel[d], stride[d], pad[d])
        windows.append((los, his))
        factors.append(torch.tensor(sizes if p.get("count_include_pad", True) else
                                    [h - lo for lo, h in zip(los, his)], dtype=torch.float64))
    counts = _outer([torch.tensor([h - lo for lo, h in zip(*w)], dtype=torch.float64) for w in windows])
    if p.get("divisor_override"):
        divisor = torch.full(out, float(p["divisor_override"]), dtype=torch.float64)
    else:
        divisor = _outer(factors)
    divisor = torch.where(counts > 0, divisor, 1.0)  # an empty window's output is 0, as torch's
    return _pool_mean(c, x, windows, divisor)


@handles("aten.adaptive_avg_pool1d.default", "aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default",
         "aten.adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(c, node, args, kwargs):
    """torch's adaptive windows: output o of n over an input of size s averages
    [floor(o * s / n), ceil((o + 1) * s / n))."""
    x = args[0]
    k = int(node.target._opname[-2])
    out = tuple(fake_value(node).shape[-k:])
    windows, factors = [], []
    for d in range(k):
        s = shape_of(x)[rank_of(x) - k + d]
        los = [(o * s) // out[d] for o in range(out[d])]
        his = [-((-(o + 1) * s) // out[d]) for o in range(out[d])]
        windows.append((los, his))
        factors.append(torch.tensor([h - lo for lo, h in zip(los, his)], dtype=torch.float64))
    divisor = _outer(factors)
    return _pool_mean(c, x, windows, torch.where(divisor > 0, divisor, 1.0))


def _outer(factors: list[torch.Tensor]) -> torch.Tensor:
    """The product of one factor per dim, over the grid of the dims."""
    out = torch.ones(())
    for f in factors:
        out = out.unsqueeze(-1) * f.to(out.dtype)
    return out


@handles("aten.embedding_bag.default", "aten.embedding_bag.padding_idx", "aten._embedding_bag.default")
def _embedding_bag(c, node, args, kwargs):
    """F.embedding_bag's sums and means (max: not supported): each index's row of the
    weight, times its per_sample_weight (sum only, as torch), rows equal to padding_idx
    left out (of the mean's count too), added into its bag. Bag b holds the positions from
    offsets[b] on; a position's bag is how many offsets it has reached, less one. Empty
    bags give zeros. Only the first result (the bags) is computed. Finding the bags
    compares every position with every offset (n x bags comparisons)."""
    p = bound_args(node, args, kwargs)
    weight, idx, offsets, mode = p["weight"], p["indices"], p["offsets"], int(p["mode"])
    for user in node.users:
        if user.target is operator.getitem and user.args[1] != 0 and user.users:
            raise Unsupported("embedding_bag's offset2bag, bag_size and max_indices results are not computed by kf")
    if mode == 2:
        raise Unsupported("embedding_bag with mode='max' is not supported by kf", cause="use mode='sum' or 'mean'")
    if rank_of(idx) != 1:
        raise Unsupported(f"embedding_bag of {rank_of(idx)}-d indices with offsets")
    psw = p.get("per_sample_weights")
    if psw is not None and mode != 0:
        raise Unsupported("embedding_bag's per_sample_weights need mode='sum' (as torch)")
    pad = p.get("padding_idx")
    pad = None if pad is None or pad < 0 else pad
    elem = spec_of(weight.type).elem
    st = stat_elem(elem)
    n, dim = shape_of(idx)[0], shape_of(weight)[1]
    bags = shape_of(offsets)[0] - (1 if p.get("include_last_offset") else 0)
    out = kb.fill((bags, dim), st, 0.0)
    if n == 0 or bags <= 0:
        return c.tensor(out, elem), None, None, None
    rows = c.tensor(kb.index_select(weight, idx, dim=0), st)
    if psw is not None:
        rows = kb.mul(rows, kb.reshape(c.tensor(psw, st), (n, 1)))
    kept = None
    if pad is not None:
        kept = kb.reshape(kb.cmp(idx, kb.scalar(float(pad), spec_of(idx.type).elem), predicate="ne"), (n, 1))
        rows = kb.select(kept, rows, kb.scalar(0.0, st))
    starts = kb.slice(offsets, dim=0, start=0, end=bags, step=1)
    reached = kb.cmp(c.constant_tensor(torch.arange(n).reshape(n, 1)), kb.reshape(c.tensor(starts, "i64"), (1, bags)),
                     predicate="ge")
    bag = kb.sum(kb.cast(reached, "f32"), dims=[1], keepdim=False)
    # offsets that break torch's rules (offsets[0] != 0) cannot index outside the bags
    bag = kb.cast(kb.min(kb.max(kb.sub(bag, kb.scalar(1.0, "f32")), kb.scalar(0.0, "f32")),
                         kb.scalar(float(bags - 1), "f32")), "i64")
    out = kb.index_add(out, bag, rows, dim=0)
    if mode == 1:
        ones = kb.fill((n, 1), st, 1.0) if kept is None else kb.cast(kept, st)
        count = kb.index_add(kb.fill((bags, 1), st, 0.0), bag, ones, dim=0)
        out = kb.div(out, kb.max(count, kb.scalar(1.0, st)))
    return c.tensor(out, elem), None, None, None


@handles("aten.max_unpool2d.default", "aten.max_unpool3d.default")
def _max_unpool(c, node, args, kwargs):
    """max_unpool (F.max_unpool1d runs as max_unpool2d): zeros of the output's shape with
    each input element written at its index into the flattened spatial dims of its own
    (batch, channel) plane, a kf.scatter_reduce: every index is checked against the plane
    (torch refuses one outside it), and where indices repeat the last write in index
    order wins, as in torch's CPU kernel. ``stride`` and ``padding`` only shape torch's
    checks: the indices say where each value goes."""
    x, indices = args[0], args[1]
    k = int(node.target._opname[-2])
    out = tuple(fake_value(node).shape)
    lead, plane = out[:-k], math.prod(out[-k:])
    rows = math.prod(lead)
    span = math.prod(shape_of(x)[len(lead):])
    if shape_of(indices) != shape_of(x):
        raise Unsupported(f"max_unpool with indices of shape {list(shape_of(indices))} for an input of shape "
                          f"{list(shape_of(x))}", cause="torch requires the two shapes to be equal")
    zeros = kb.fill((rows, plane), spec_of(x.type).elem, 0.0)
    if rows == 0 or span == 0:
        return kb.reshape(zeros, out)
    flat = kb.build("scatter_reduce", [zeros, kb.reshape(indices, (rows, span)), kb.reshape(x, (rows, span))],
                    {"dim": 1, "reduce": "none", "include_self": True}).result
    return kb.reshape(flat, out)


def _max_windows(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> list[list[int]]:
    """The input positions each of max_pool's ``out`` windows along one dim reads, a
    position outside [0, size) being padding (it takes no part)."""
    return [[o * stride - pad + j * dilation for j in range(kernel)] for o in range(out)]


def _adaptive_windows(size: int, out: int) -> list[list[int]]:
    """adaptive_max_pool's windows: output o of n reads [floor(o * s / n), ceil((o + 1) * s / n))."""
    return [list(range((o * size) // out, -((-(o + 1) * size) // out))) for o in range(out)]


def _pool_max(c, x, windows: list[list[list[int]]]):
    """(values, indices) of max pooling x's last len(windows) dims, ``windows[d][o]`` the
    positions output o reads along spatial dim d (outside the dim: padding, which takes
    no part): each window's maximum and its position in the input's flattened spatial
    dims, as torch's kernels scan a window (in order, from -inf at its first position; an
    element replaces the best so far where it is greater or NaN): the first of equal
    maxima, the last NaN. One gather reads every window's K positions into a (rows, K,
    outputs) tensor, padding masked to -inf; the maximum and the argmax reduce over K,
    a window's last NaN is the largest of (k + 1) where NaN."""
    elem = spec_of(x.type).elem
    if not spec_of(x.type).is_float:
        raise Unsupported(f"max pooling of {elem} tensors is not supported by kf")
    k = len(windows)
    lead = tuple(shape_of(x)[:rank_of(x) - k])
    sizes = shape_of(x)[len(lead):]
    out = tuple(len(w) for w in windows)
    rows, plane, n_out = math.prod(lead), math.prod(sizes), math.prod(out)
    if rows == 0 or n_out == 0:
        return kb.fill(lead + out, elem, 0.0), kb.fill(lead + out, "i64", 0.0)
    strides = [math.prod(sizes[d + 1:]) for d in range(k)]
    longest = [max(len(p) for p in w) for w in windows]
    firsts = [[min((q for q in w if 0 <= q < sizes[d]), default=0) for w in windows[d]] for d in range(k)]
    positions, valid = [], []
    for combo in itertools.product(*[range(n) for n in longest]):
        pos, ok = torch.zeros(out, dtype=torch.int64), torch.ones(out, dtype=torch.bool)
        first = torch.zeros(out, dtype=torch.int64)
        for d, j in enumerate(combo):
            shape = [1] * k
            shape[d] = out[d]
            p = torch.tensor([w[j] if j < len(w) else -1 for w in windows[d]])
            here = (p >= 0) & (p < sizes[d])
            ok = ok & here.reshape(shape)
            pos = pos + p.clamp(0, sizes[d] - 1).reshape(shape) * strides[d]
            first = first + torch.tensor(firsts[d]).reshape(shape) * strides[d]
        positions.append(torch.where(ok, pos, first).reshape(-1))  # padding: where the scan starts
        valid.append(ok.reshape(-1))
    K = len(positions)
    table = torch.stack(positions)  # (K, outputs)
    mask = torch.stack(valid)
    flat = kb.reshape(x, (rows, plane))
    index = kb.broadcast_to(c.constant_tensor(table.reshape(1, K * n_out)), (rows, K * n_out))
    g = kb.reshape(kb.gather(flat, index, dim=1), (rows, K, n_out))
    if not bool(mask.all()):
        g = kb.select(mask_constant(c, mask.reshape(1, K, n_out)), g, kb.scalar(-math.inf, elem))
    values = kb.reduce_max(g, dims=[1], keepdim=False)
    best = kb.argmax(g, dim=1, keepdim=True)
    nan = kb.cast(kb.cmp(g, g, predicate="ne"), "i64")
    last_nan = kb.reduce_max(kb.mul(nan, c.constant_tensor(torch.arange(1, K + 1).reshape(1, K, 1))), dims=[1],
                             keepdim=True)
    any_nan = kb.cmp(last_nan, kb.scalar(0.0, "i64"), predicate="gt")
    best = kb.select(any_nan, kb.sub(last_nan, kb.scalar(1.0, "i64")), best)
    indices = kb.gather(kb.broadcast_to(c.constant_tensor(table.reshape(1, K, n_out)), (rows, K, n_out)), best, dim=1)
    return kb.reshape(values, lead + out), kb.reshape(indices, lead + out)


@handles("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default",
         "aten.max_pool1d_with_indices.default", "aten.max_pool2d_with_indices.default",
         "aten.max_pool3d_with_indices.default")
def _max_pool(c, node, args, kwargs):
    """torch's max_pool: windows of kernel_size every stride (kernel_size when empty),
    positions ``dilation`` apart, padding that takes no part; the output's size (ceil_mode
    included) is torch's. The ``_with_indices`` forms return each maximum's position in
    the flattened spatial dims too."""
    p = bound_args(node, args, kwargs)
    x = p["self"]
    name = node.target._opname
    k = int(name.removeprefix("max_pool")[0])
    kernel = _triple(p["kernel_size"], k)
    stride = _triple(p.get("stride") or kernel, k)
    pad = _triple(p.get("padding") or 0, k)
    dilation = _triple(p.get("dilation") or 1, k)
    val = fake_value(node)
    out = tuple((val[0] if isinstance(val, (list, tuple)) else val).shape[-k:])
    sizes = shape_of(x)[rank_of(x) - k:]
    windows = [_max_windows(sizes[d], out[d], kernel[d], stride[d], pad[d], dilation[d]) for d in range(k)]
    values, indices = _pool_max(c, x, windows)
    return (values, indices) if name.endswith("_with_indices") else values


@handles("aten.adaptive_max_pool1d.default", "aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def _adaptive_max_pool(c, node, args, kwargs):
    """torch's adaptive_max_pool: (values, indices) over adaptive windows."""
    x = args[0]
    k = int(node.target._opname[-2])
    out = tuple(fake_value(node)[0].shape[-k:])
    sizes = shape_of(x)[rank_of(x) - k:]
    return _pool_max(c, x, [_adaptive_windows(sizes[d], out[d]) for d in range(k)])


@handles("aten.max_pool2d_with_indices_backward.default", "aten.max_pool3d_with_indices_backward.default")
def _max_pool_backward(c, node, args, kwargs):
    """The gradient of max_pool: each output's gradient added at its index into its
    (batch, channel) plane (a kf.scatter_add, its indices checked against the plane)."""
    p = bound_args(node, args, kwargs)
    grad, x, indices = p["grad_output"], p["self"], p["indices"]
    k = int(node.target._opname.removeprefix("max_pool")[0])
    shape = tuple(shape_of(x))
    lead, plane = shape[:-k], math.prod(shape[-k:])
    rows, span = math.prod(lead), math.prod(shape_of(grad)[len(lead):])
    zeros = kb.fill((rows, plane), spec_of(grad.type).elem, 0.0)
    if rows == 0 or span == 0 or plane == 0:
        return kb.reshape(zeros, shape)
    flat = kb.scatter_add(zeros, kb.reshape(indices, (rows, span)), kb.reshape(grad, (rows, span)), dim=1)
    return kb.reshape(flat, shape)
