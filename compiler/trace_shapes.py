"""The light tracer's shape rules: per ATen op kf lowers, its result's shape and, where
the op fixes them, its dtype and strides (trace.py runs the op on tiny CPU tensors for
the dtype otherwise). A rule takes the call's arguments by schema name and raises
Fallback (``need``) for anything it is not sure of.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import aten_to_kf
from .trace_tensor import Shape, Traced, contiguous_strides, need



@dataclass
class Out:
    """One result of an op: its shape, dtype and strides."""

    shape: Shape
    dtype: torch.dtype | None = None  # None: the dtype the op gives on tiny CPU tensors
    strides: Any = "auto"  # "auto": contiguous where every tensor operand is, else unknown


def _dim(d: Any, rank: int) -> int:
    r = max(rank, 1)
    need(isinstance(d, int) and -r <= d < r, f"dim {d} out of range for rank {rank}")
    return d % r


def _broadcast(shapes: list[Shape]) -> Shape:
    out = []
    for sizes in itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        other = {s for s in sizes if s != 1}
        need(len(other) <= 1, f"shapes {shapes} do not broadcast")
        out.append(other.pop() if other else 1)
    return tuple(reversed(out))


def _infer_size(size: Any, numel: int) -> Shape:
    size = list(size)
    unknown = [i for i, s in enumerate(size) if s == -1]
    need(len(unknown) <= 1 and all(s >= 0 for s in size if s != -1), f"invalid shape {size}")
    known = math.prod(s for s in size if s != -1)
    if unknown:
        need(known != 0 and numel % known == 0, f"shape {size} is invalid for {numel} elements")
        size[unknown[0]] = numel // known
    need(math.prod(size) == numel, f"shape {size} is invalid for {numel} elements")
    return tuple(size)


def _view_strides(shape: Shape, strides: tuple[int, ...], new: Shape) -> "tuple[int, ...] | None":
    """The strides of a view of (shape, strides) as new, or None where none exists
    (at::detail::computeStride)."""
    if not shape:
        return (1,) * len(new)
    numel = math.prod(shape)
    if numel == 0:
        return tuple(strides) if tuple(shape) == tuple(new) else contiguous_strides(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk_base, tensor_numel, view_numel = strides[-1], 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk_base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return tuple(out) if view_d == -1 else None


def _first(p: dict) -> Traced:
    return next(v for v in p.values() if isinstance(v, Traced))


def _elementwise(p: dict) -> Out:
    return Out(_broadcast([v.shape for v in p.values() if isinstance(v, Traced)]))


#: memory_format arguments as the caller writes them, and as schema defaults give them (c10's enum)
_PRESERVE, _CONTIGUOUS = (None, 1, torch.preserve_format), (0, torch.contiguous_format)


def _layout(fmt: Any, shape: Shape) -> Any:
    """The strides a memory_format argument asks for ("auto": the operands')."""
    return "auto" if fmt in _PRESERVE else contiguous_strides(shape) if fmt in _CONTIGUOUS else None


def _like(p: dict) -> Out:
    """An op whose result has its first operand's shape (casts, softmax, ``zeros_like``)."""
    shape = tuple(_first(p).shape)
    return Out(shape, strides=_layout(p.get("memory_format"), shape))


def _copy(p: dict) -> Out:
    """clone, dropout: the operand's shape and dtype (no probe: dropout's would draw random numbers)."""
    out = _like(p)
    return Out(out.shape, _first(p).dtype, out.strides)


def _alias(p: dict) -> Out:
    x = _first(p)
    return Out(tuple(x.shape), x.dtype, x._strides)


def _contiguous_rule(p: dict) -> Out:
    x = p["self"]
    fmt = p.get("memory_format")
    return Out(tuple(x.shape), x.dtype, contiguous_strides(tuple(x.shape)) if fmt in _CONTIGUOUS else None)


def _reduce(p: dict) -> Out:
    x = p["self"]
    rank, dims, keep = x.dim(), p.get("dim"), bool(p.get("keepdim") or False)
    dims = range(rank) if dims is None or (isinstance(dims, (list, tuple)) and not dims) else dims
    dims = {_dim(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims)
    return Out(shape if rank else ())


def _layer_norm(p: dict) -> "Out | list[Out]":
    x, ns = p["input"], tuple(p["normalized_shape"])
    lead = x.dim() - len(ns)
    need(len(ns) >= 1 and lead >= 0 and tuple(x.shape[lead:]) == ns, f"layer_norm over {ns} of {list(x.shape)}")
    for w in (p.get("weight"), p.get("bias")):
        need(w is None or tuple(w.shape) == ns, "layer_norm weight or bias of another shape")
    if "cudnn_enable" in p:
        return Out(tuple(x.shape))
    stats = tuple(x.shape[:lead]) + (1,) * len(ns)
    return [Out(tuple(x.shape)), Out(stats), Out(stats)]


def _sdpa(p: dict) -> Out:
    """scaled_dot_product_attention where its shapes are plain ones (torch reports the rest
    through export's path): q [..., L, E], k [..., S, E], v [..., S, Ev] of one batch
    (heads grouped by enable_gqa), a mask that broadcasts to [..., L, S], not with is_causal."""
    q, k, v, mask = p["query"], p["key"], p["value"], p.get("attn_mask")
    need(min(q.dim(), k.dim(), v.dim()) >= 3 and q.dim() == k.dim() == v.dim(), "attention of other ranks")
    need(q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2] and k.shape[:-2] == v.shape[:-2],
         "attention of mismatched shapes")
    hq, hk = q.shape[-3], k.shape[-3]
    need(q.shape[:-3] == k.shape[:-3] and (hq == hk or (p.get("enable_gqa") and hk and hq % hk == 0)),
         "attention of other batch or head counts")
    need(mask is None or not p.get("is_causal"), "attention with both a mask and is_causal")
    if mask is not None:
        need(mask.dim() >= 2, "an attention mask of fewer than 2 dimensions")
        need(_broadcast([tuple(mask.shape), tuple(q.shape[:-1]) + (k.shape[-2],)])
             == tuple(q.shape[:-1]) + (k.shape[-2],), "an attention mask of another shape")
    return Out(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype)


def _scan(p: dict) -> Out:
    """cumsum, cumprod, logcumsumexp: the operand's shape (the dtype as torch gives it)."""
    x = p["self"]
    _dim(p["dim"], x.dim())
    return Out(tuple(x.shape), p.get("dtype"))


def _matmul(p: dict) -> Out:
    a, b = p["self"], p["other"]
    ra, rb = a.dim(), b.dim()
    need(ra >= 1 and rb >= 1, "matmul of a 0-d tensor")
    sa, sb = tuple(a.shape), tuple(b.shape)
    if ra == 1 and rb == 1:
        need(sa == sb, f"matmul of {sa} and {sb}")
        return Out(())
    ea = (1,) + sa if ra == 1 else sa
    eb = sb + (1,) if rb == 1 else sb
    need(ea[-1] == eb[-2], f"matmul of {sa} and {sb}")
    shape = _broadcast([ea[:-2], eb[:-2]]) + ea[-2:-1] + eb[-1:]
    if ra == 1:
        shape = shape[:-2] + shape[-1:]
    if rb == 1:
        shape = shape[:-1]
    # (1-d or 2-d) @ batched: aten computes (b^T @ a^T)^T, a transposed result
    return Out(shape, strides=None if ra <= 2 and rb >= 3 else "auto")


def _mm(p: dict, rank: int = 2) -> Out:
    a, b = p.get("mat1", p["self"]), p["mat2"]  # mm(self, mat2), bmm(self, mat2), addmm(self, mat1, mat2)
    need(a.dim() == rank and b.dim() == rank and a.shape[-1] == b.shape[-2]
          and (rank == 2 or a.shape[0] == b.shape[0]), f"mm of {list(a.shape)} and {list(b.shape)}")
    shape = tuple(a.shape[:-1]) + (b.shape[-1],)
    if "mat1" in p:
        need(_broadcast([shape, tuple(p["self"].shape)]) == shape, "addmm's bias does not broadcast")
    return Out(shape)


def _bmm(p: dict) -> Out:
    return _mm(p, rank=3)


def _linear(p: dict) -> Out:
    x, w, b = p["input"], p["weight"], p.get("bias")
    need(x.dim() >= 1 and w.dim() == 2 and x.shape[-1] == w.shape[1], f"linear of {list(x.shape)} by {list(w.shape)}")
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    need(b is None or _broadcast([shape, tuple(b.shape)]) == shape, "linear bias does not broadcast")
    return Out(shape)


def _permuted(x: Traced, perm: list[int]) -> Out:
    need(sorted(perm) == list(range(x.dim())), f"{perm} is not a permutation of {x.dim()} dims")
    strides = None if x._strides is None else tuple(x._strides[i] for i in perm)
    return Out(tuple(x.shape[i] for i in perm), x.dtype, strides)


def _permute(p: dict) -> Out:
    x = p["self"]
    return _permuted(x, [_dim(d, x.dim()) for d in p["dims"]])


def _transpose(p: dict) -> Out:
    x = p["self"]
    d0, d1 = (p["dim0"], p["dim1"]) if "dim0" in p else (p["axis0"], p["axis1"])
    perm = list(range(x.dim()))
    if x.dim():
        d0, d1 = _dim(d0, x.dim()), _dim(d1, x.dim())
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permuted(x, perm)


def _t(p: dict) -> Out:
    x = p["self"]
    need(x.dim() <= 2, "t() of more than 2 dims")
    return _permuted(x, list(reversed(range(x.dim()))))


def _numpy_t(p: dict) -> Out:
    x = p["self"]
    return _permuted(x, list(reversed(range(x.dim()))))


def _reshaped(x: Traced, size: Any, must_view: bool) -> Out:
    shape = _infer_size(size, x.numel())
    if x._strides is None:
        need(not must_view, "a view of a tensor of unknown strides")
        return Out(shape, x.dtype, None)
    strides = _view_strides(tuple(x.shape), x._strides, shape)
    need(strides is not None or not must_view, "view of a tensor whose strides do not allow it")
    return Out(shape, x.dtype, strides if strides is not None else contiguous_strides(shape))


def _view(p: dict) -> Out:
    x = p["self"]
    return _reshaped(x, p["other"].shape if "other" in p else p["size"], must_view=True)


def _reshape(p: dict) -> Out:
    x = p["self"]
    return _reshaped(x, p["other"].shape if "other" in p else p["shape"], must_view=False)


def _flatten(p: dict) -> Out:
    x = p["self"]
    if x.dim() == 0:
        return _reshaped(x, (1,), must_view=False)
    s, e = _dim(p["start_dim"], x.dim()), _dim(p["end_dim"], x.dim())
    need(s <= e, "flatten's start_dim after its end_dim")
    shape = tuple(x.shape[:s]) + (math.prod(x.shape[s:e + 1]),) + tuple(x.shape[e + 1:])
    return _reshaped(x, shape, must_view=False)


def _unflatten(p: dict) -> Out:
    x = p["self"]
    d = _dim(p["dim"], x.dim())
    sizes = _infer_size(p["sizes"], x.shape[d])
    return _reshaped(x, tuple(x.shape[:d]) + sizes + tuple(x.shape[d + 1:]), must_view=True)


def _unsqueeze(p: dict) -> Out:
    x = p["self"]
    d = _dim(p["dim"], x.dim() + 1)
    shape = tuple(x.shape[:d]) + (1,) + tuple(x.shape[d:])
    strides = None
    if x._strides is not None:
        new = x.shape[d] * x._strides[d] if d < x.dim() else 1
        strides = x._strides[:d] + (new,) + x._strides[d:]
    return Out(shape, x.dtype, strides)


def _squeeze(p: dict) -> Out:
    x = p["self"]
    dims = p.get("dim", None)
    dims = range(x.dim()) if dims is None else [dims] if isinstance(dims, int) else dims
    drop = {i for i in (_dim(d, x.dim()) for d in dims) if x.dim() and x.shape[i] == 1}
    keep = [i for i in range(x.dim()) if i not in drop]
    strides = None if x._strides is None else tuple(x._strides[i] for i in keep)
    return Out(tuple(x.shape[i] for i in keep), x.dtype, strides)


def _expand(p: dict) -> Out:
    x = p["self"]
    size = list(p["other"].shape if "other" in p else p["size"])
    lead = len(size) - x.dim()
    need(lead >= 0, f"expand of {list(x.shape)} to fewer dims {size}")
    shape, strides = [], []
    for i, s in enumerate(size):
        if i < lead:
            need(s >= 0, f"expand to {size}")
            shape.append(s)
            strides.append(0)
            continue
        have = x.shape[i - lead]
        s = have if s == -1 else s
        need(have == s or have == 1, f"expand of {list(x.shape)} to {size}")
        shape.append(s)
        strides.append(x._strides[i - lead] if x._strides is not None and have == s else 0)
    return Out(tuple(shape), x.dtype, tuple(strides) if x._strides is not None else None)


def _sliced(x: Traced, d: int, start: int, length: int, step: int = 1) -> Out:
    shape = list(x.shape)
    shape[d] = length
    strides = None
    if x._strides is not None:
        strides = list(x._strides)
        strides[d] *= step
        strides = tuple(strides)
    return Out(tuple(shape), x.dtype, strides)


def _slice(p: dict) -> Out:
    x = p["self"]
    need(x.dim() > 0, "slice of a 0-d tensor")
    d, step = _dim(p["dim"], x.dim()), p["step"]
    need(isinstance(step, int) and step > 0, "slice step must be positive")
    start, end, _ = slice(p["start"], p["end"], step).indices(x.shape[d])
    return _sliced(x, d, start, len(range(start, end, step)), step)


def _narrow(p: dict) -> Out:
    x = p["self"]
    need(x.dim() > 0, "narrow of a 0-d tensor")
    d, start, length = _dim(p["dim"], x.dim()), p["start"], p["length"]
    size = x.shape[d]
    need(-size <= start <= size and length >= 0, "narrow out of range")
    start = start + size if start < 0 else start
    need(start + length <= size, "narrow out of range")
    return _sliced(x, d, start, length)


def _select(p: dict) -> Out:
    x = p["self"]
    need(x.dim() > 0, "select of a 0-d tensor")
    d, i = _dim(p["dim"], x.dim()), p["index"]
    need(-x.shape[d] <= i < x.shape[d], f"index {i} out of range")
    keep = [k for k in range(x.dim()) if k != d]
    strides = None if x._strides is None else tuple(x._strides[k] for k in keep)
    return Out(tuple(x.shape[k] for k in keep), x.dtype, strides)


def _split(p: dict) -> list[Out]:
    x = p["self"]
    need(x.dim() > 0, "split of a 0-d tensor")
    d = _dim(p["dim"], x.dim())
    size = x.shape[d]
    if "split_sizes" in p:
        sizes = list(p["split_sizes"])
        need(all(s >= 0 for s in sizes) and sum(sizes) == size, f"split sizes {sizes} of {size}")
    else:
        if "chunks" in p:
            need(p["chunks"] > 0 and size > 0, "chunk into no pieces")
            n = -(-size // p["chunks"])
        else:
            n = p["split_size"]
        need(n > 0 and size > 0, "split of size 0")
        count = -(-size // n)
        sizes = [n] * (count - 1) + [size - n * (count - 1)]
    outs, start = [], 0
    for s in sizes:
        outs.append(_sliced(x, d, start, s))
        start += s
    return outs


def _cat(p: dict) -> Out:
    ts = [t for t in p["tensors"] if not (t.dim() == 1 and t.shape[0] == 0)]  # torch skips these
    need(bool(ts) and ts[0].dim() > 0, "cat of nothing, or of 0-d tensors")
    r = ts[0].dim()
    d = _dim(p["dim"], r)
    base = tuple(ts[0].shape)
    for t in ts:
        need(t.dim() == r and all(t.shape[i] == base[i] for i in range(r) if i != d), "cat of unequal shapes")
    return Out(base[:d] + (sum(t.shape[d] for t in ts),) + base[d + 1:])


def _stack(p: dict) -> Out:
    ts = list(p["tensors"])
    need(bool(ts) and all(t.shape == ts[0].shape for t in ts), "stack of unequal shapes")
    d = _dim(p["dim"], ts[0].dim() + 1)
    base = tuple(ts[0].shape)
    return Out(base[:d] + (len(ts),) + base[d:])


def _topk(p: dict) -> list[Out]:
    x = p["self"]
    d = _dim(p["dim"], x.dim())
    size = x.shape[d] if x.dim() else 1
    need(0 <= p["k"] <= size, f"topk k={p['k']} of {size}")
    shape = tuple(p["k"] if i == d else s for i, s in enumerate(x.shape))
    return [Out(shape, x.dtype), Out(shape, torch.int64)]


def _kthvalue(p: dict) -> list[Out]:
    x = p["self"]
    d = _dim(p["dim"], x.dim())
    size = x.shape[d] if x.dim() else 1
    need(1 <= p["k"] <= size, f"kthvalue k={p['k']} of {size}")
    if p["keepdim"]:
        shape = tuple(1 if i == d else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i != d)
    return [Out(shape, x.dtype), Out(shape, torch.int64)]


def _gather(p: dict) -> Out:
    x, idx = p["self"], p["index"]
    d = _dim(p["dim"], x.dim())
    need(idx.dim() == x.dim() and all(idx.shape[i] <= x.shape[i] for i in range(x.dim()) if i != d),
          "gather index of another shape")
    return Out(tuple(idx.shape))


def _index_select(p: dict) -> Out:
    x, idx = p["self"], p["index"]
    need(x.dim() > 0 and idx.dim() <= 1, "index_select of a 0-d tensor, or by a 2-d index")
    d = _dim(p["dim"], x.dim())
    return Out(tuple(idx.numel() if i == d else s for i, s in enumerate(x.shape)))


def _combinations(p: dict) -> Out:
    import math

    x, r = p["self"], p["r"]
    need(x.dim() == 1 and isinstance(r, int) and r >= 0, "combinations of a tensor that is not 1-d")
    n = x.shape[0]
    count = math.comb(n + r - 1, r) if p["with_replacement"] and n else math.comb(n, r)
    return Out((count, r) if r else (0,), x.dtype)


def _covariance(p: dict) -> Out:
    x = p.get("input", p.get("self"))
    need(x.dim() <= 2 and p.get("fweights") is None and p.get("aweights") is None,
         "cov of more than 2 dims, or with weights")
    rows = x.shape[0] if x.dim() == 2 else 1
    return Out((rows, rows) if rows > 1 else (), x.dtype if x.dtype.is_floating_point else None)


def _vander(p: dict) -> Out:
    x, n = p["x"], p["N"]
    need(x.dim() >= 1 and (n is None or isinstance(n, int)), "vander of a 0-d tensor")
    n = x.shape[-1] if n is None else n
    need(n > 1, "vander with N <= 1")
    return Out(tuple(x.shape) + (n,), x.dtype if x.dtype.is_floating_point else torch.int64)


def _cumulative_trapezoid(p: dict) -> Out:
    y, x = p["y"], p.get("x")
    need(y.dim() >= 1 and y.dtype.is_floating_point and (x is None or x.dim() <= y.dim()),
         "cumulative_trapezoid of integers, or of sample points of more dims")
    d = _dim(p["dim"], y.dim())
    if x is not None:
        need(x.shape[-1 if x.dim() == 1 else d - y.dim() + x.dim()] == y.shape[d] and x.dim() in (1, y.dim()),
             "cumulative_trapezoid's sample points of another shape")
    return Out(tuple(max(s - 1, 0) if i == d else s for i, s in enumerate(y.shape)), y.dtype)


def _embedding(p: dict) -> Out:
    w, idx = p["weight"], p["indices"]
    need(w.dim() == 2, "embedding of a weight that is not 2-d")
    return Out(tuple(idx.shape) + (w.shape[1],), w.dtype)


def _index_add(p: dict) -> Out:
    x, idx, src = p["self"], p["index"], p["source"]
    d = _dim(p["dim"], x.dim())
    need(x.dim() > 0 and idx.dim() <= 1 and src.dim() == x.dim() and src.shape[d] == idx.numel()
          and all(src.shape[i] == x.shape[i] for i in range(x.dim()) if i != d), "index_add of another shape")
    return Out(tuple(x.shape))


def _scatter_add(p: dict) -> Out:
    x, idx, src = p["self"], p["index"], p["src"]
    d = _dim(p["dim"], x.dim())
    need(idx.dim() == x.dim() == src.dim() and all(
        idx.shape[i] <= src.shape[i] and (i == d or idx.shape[i] <= x.shape[i]) for i in range(x.dim())),
        "scatter_add of another shape")
    return Out(tuple(x.shape))


def _scatter(p: dict) -> Out:
    """scatter (a source or one value) and scatter_reduce: scatter_add's shapes, the
    reductions torch names."""
    if "src" not in p:  # one value: the index's shape stands for the source's
        p = {**p, "src": p["index"]}
    need(p.get("reduce") in (None, "add", "multiply", "sum", "prod", "amax", "amin", "mean"),
         f"scatter reduce={p.get('reduce')!r}")
    return _scatter_add(p)


def _sort(p: dict) -> list[Out]:
    """sort: the values and their int64 positions, each of the operand's shape."""
    x = p["self"]
    _dim(p.get("dim", -1), x.dim())
    return [Out(tuple(x.shape), x.dtype), Out(tuple(x.shape), torch.int64)]


def _msort(p: dict) -> Out:
    return Out(tuple(p["self"].shape), p["self"].dtype)


def _argsort(p: dict) -> Out:
    return _sort(p)[1]


def _factory(p: dict) -> Out:
    size = tuple(p["size"])
    need(all(isinstance(s, int) and s >= 0 for s in size), f"invalid size {list(size)}")
    fmt = p.get("memory_format")
    return Out(size, strides=contiguous_strides(size) if fmt is None or fmt in _CONTIGUOUS else None)


def _scalar_tensor(p: dict) -> Out:
    return Out((), strides=())


RULES: dict[str, Callable[[dict], Any]] = {}
for _names, _rule in [
    (["add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "mul.Tensor", "mul.Scalar", "div.Tensor",
      "div.Scalar", "div.Tensor_mode", "true_divide.Tensor", "rsub.Scalar", "rsub.Tensor", "maximum.default",
      "minimum.default", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "eq.Scalar", "eq.Tensor",
      "ne.Scalar", "ne.Tensor", "lt.Scalar", "lt.Tensor", "le.Scalar", "le.Tensor", "gt.Scalar", "gt.Tensor",
      "ge.Scalar", "ge.Tensor", "where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar",
      "masked_fill.Scalar", "masked_fill.Tensor", "clamp.default", "clamp.Tensor", "neg.default",
      "abs.default", "exp.default", "log.default", "sqrt.default", "rsqrt.default", "reciprocal.default",
      "tanh.default", "erf.default", "sigmoid.default", "relu.default", "gelu.default", "silu.default",
      "logical_not.default", "lgamma.default", "digamma.default", "polygamma.default", "mvlgamma.default"],
     _elementwise),
    (["clone.default", "dropout.default", "lift_fresh_copy.default"], _copy),
    (["_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "type_as.default",
      "_autocast_to_reduced_precision.default",
      "_autocast_to_full_precision.default", "softmax.int", "_softmax.default", "log_softmax.int",
      "_log_softmax.default", "zeros_like.default", "ones_like.default", "empty_like.default",
      "full_like.default"], _like),
    (["alias.default", "detach.default", "detach_.default", "lift_fresh.default"], _alias),
    (["contiguous.default"], _contiguous_rule),
    (["sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default", "amin.default",
      "max.default", "min.default", "max.dim", "min.dim", "argmax.default", "var.correction", "var.dim",
      "var.default", "std.correction", "std.dim", "std.default"], _reduce),
    (["layer_norm.default", "native_layer_norm.default"], _layer_norm),
    (["matmul.default"], _matmul), (["mm.default", "addmm.default"], _mm), (["bmm.default"], _bmm),
    (["cumsum.default", "cumprod.default", "logcumsumexp.default"], _scan),
    (["linalg_vander.default"], _vander),
    (["cumulative_trapezoid.x", "cumulative_trapezoid.dx"], _cumulative_trapezoid),
    (["linear.default"], _linear), (["scaled_dot_product_attention.default"], _sdpa),
    (["t.default"], _t), (["numpy_T.default"], _numpy_t), (["transpose.int", "swapaxes.default"], _transpose),
    (["permute.default"], _permute),
    (["view.default", "_unsafe_view.default", "view_as.default"], _view),
    (["reshape.default", "reshape_as.default"], _reshape),
    (["flatten.using_ints"], _flatten), (["unflatten.int"], _unflatten), (["unsqueeze.default"], _unsqueeze),
    (["squeeze.default", "squeeze.dim", "squeeze.dims"], _squeeze),
    (["expand.default", "expand_as.default", "broadcast_to.default"], _expand),
    (["slice.Tensor"], _slice), (["narrow.default"], _narrow), (["select.int"], _select),
    (["split.Tensor", "split_with_sizes.default", "chunk.default"], _split),
    (["cat.default", "concat.default"], _cat), (["stack.default"], _stack),
    (["topk.default"], _topk), (["gather.default"], _gather), (["index_select.default"], _index_select),
    (["combinations.default"], _combinations), (["kthvalue.default"], _kthvalue), (["cov.default", "corrcoef.default"], _covariance),
    (["embedding.default"], _embedding), (["index_add.default"], _index_add),
    (["scatter_add.default"], _scatter_add),
    (["sort.default", "sort.stable"], _sort), (["argsort.default", "argsort.stable"], _argsort),
    (["msort.default"], _msort),
    (["scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce", "scatter_reduce.two"], _scatter),
    (["zeros.default", "ones.default", "empty.memory_format", "full.default", "new_zeros.default",
      "new_ones.default", "new_empty.default", "new_full.default"], _factory),
    (["scalar_tensor.default"], _scalar_tensor),
]:
    for _n in _names:
        RULES["aten." + _n] = _rule
ARANGE = frozenset({"aten.arange.default", "aten.arange.start", "aten.arange.start_step"})
# every rule is for an op kf lowers itself: the tracer never sends an op to torch-mlir
assert all(n in aten_to_kf.HANDLERS for n in list(RULES) + list(ARANGE)), "a shape rule for an op kf lacks"
