"""The light tracer: a kf function's ATen graph without torch.export.

torch.export imports torch._dynamo, sympy and much else on its first call: seconds of a
cold compile whose own work takes a tenth of that. Meta tensors are no way around it:
torch's meta kernels are Python (torch._refs) that import both on first use. This
tracer runs the function once on data-less tensors that carry a shape, dtype, strides
and the caller's device, under a TorchDispatchMode that records each ATen call as an FX
node. Each op's result shape comes from a shape rule below, and its dtype from running
the op itself on tiny CPU tensors of the same ranks and dtypes (type promotion is
torch's own, and so are dtype errors). Autograd's dispatch keys are excluded while it
runs, so the mode meets ops as export's training IR keeps them (``aten.matmul``,
``aten.softmax.int``, ``aten.linear``), not their decompositions (``bmm``, ``_softmax``).

The graph has export's shape: a placeholder per input tensor (``tensors_i``), one per
tensor the function reaches (a global, a closure cell, a module's parameter: the
``reached`` tensors capture is given, guards.py, read as inputs at every call:
``reached_j``), one per tensor the function made from data (``torch.tensor([...])``,
a constant),
``call_function`` nodes with ``meta["val"]`` (a meta tensor) and ``meta["stack_trace"]``
(the frames export would keep), and an output node that keeps the result's nesting.

It covers exactly what it is sure of. Anything else raises ``Fallback`` and capture runs
torch.export as it always has: an op with no shape rule (every other op kf lowers, and
all it sends to torch-mlir, which traces with export anyway), a mutation, a
data-dependent op (``.item()``, ``nonzero``, ``bool(t)``), tensors on two devices, a
view or a stride query of a tensor whose strides it does not know, a result that is not
tensors in tuples and lists, and any exception -- a user's shape error is then reported
by export's path, at the user's line, exactly as before.
"""

from __future__ import annotations

import itertools
import math
import operator
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import aten_to_kf
from .signature import Signature, rebuild_args
from .torch_ops import AUTOCAST_KEYS

Shape = tuple[int, ...]

_META = torch.device("meta")
_CPU = torch.device("cpu")
#: the one mutating op allowed: ``torch.tensor(...)`` calls it on the fresh constant, and
#: it changes no value (kf's converter treats it as the identity, on export's path too)
_HARMLESS_MUTATIONS = frozenset({"aten.detach_.default"})


class Fallback(Exception):
    """The light tracer cannot stand in for torch.export on this function (the message says
    why); ``stack_trace``: where the function wrote to a tensor, in export's format, when
    that is why (export's path reports its errors there)."""

    def __init__(self, reason: str, stack_trace: str = ""):
        super().__init__(reason)
        self.stack_trace = stack_trace


@dataclass
class Trace:
    graph_module: torch.fx.GraphModule
    #: placeholder name -> a tensor the function made from data, which becomes kf.constant
    constants: dict[str, torch.Tensor]
    #: placeholder name -> which of the reached tensors it is (an input after the arguments)
    reached: dict[str, int]
    #: constants that are neither made by the function nor reached tensors (see _Recorder.constant)
    unsourced: list[torch.Tensor]


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise Fallback(what)


# ----------------------------------------------------------------------------- tensors


class _Traced(torch.Tensor):
    """A tensor of the trace: shape, dtype, strides (``_strides``, None where unknown),
    the device the real tensor would be on -- so that ``x.device``, ``x.is_cuda`` and
    ``torch.zeros(n, device=x.device)`` read as in eager -- and the FX node that made it."""

    _strides: "tuple[int, ...] | None"
    _node: torch.fx.Node
    _rec: "_Recorder"

    @staticmethod
    def __new__(cls, val: torch.Tensor, known: bool, device: torch.device, node: torch.fx.Node,
                rec: "_Recorder") -> "_Traced":
        t = torch.Tensor._make_wrapper_subclass(cls, val.shape, strides=val.stride(), dtype=val.dtype,
                                                device=device, requires_grad=False)
        t._strides, t._node, t._rec = (tuple(val.stride()) if known else None), node, rec
        return t

    def __repr__(self) -> str:  # a print in the function must not run ops on no data
        return f"TracedTensor({list(self.shape)}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _STORAGE_QUERIES or (func in _STRIDE_QUERIES and args[0]._strides is None):
            args[0]._rec.fail(f"Tensor.{func.__name__}() of a tensor whose layout the light tracer does not know")
        elif func is torch.Tensor.contiguous and args[0]._strides is None:
            # C++'s contiguous() would ask the wrapper's placeholder strides
            return torch.ops.aten.contiguous.default(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise Fallback(f"{func} ran on a traced tensor outside the trace")


_STRIDE_QUERIES = frozenset({torch.Tensor.stride, torch.Tensor.is_contiguous})
_STORAGE_QUERIES = frozenset({torch.Tensor.storage_offset, torch.Tensor.data_ptr, torch.Tensor.untyped_storage})


def _contiguous(shape: Shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _is_contiguous(shape: Shape, strides: "tuple[int, ...] | None") -> bool:
    if strides is None:
        return False
    if math.prod(shape) == 0:
        return True
    acc = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if s != 1:
            if st != acc:
                return False
            acc *= s
    return True


# ----------------------------------------------------------------------------- shape rules


@dataclass
class _Out:
    shape: Shape
    dtype: torch.dtype | None = None  # None: the dtype the op gives on tiny CPU tensors
    strides: Any = "auto"  # "auto": contiguous where every tensor operand is, else unknown


def _dim(d: Any, rank: int) -> int:
    r = max(rank, 1)
    _need(isinstance(d, int) and -r <= d < r, f"dim {d} out of range for rank {rank}")
    return d % r


def _broadcast(shapes: list[Shape]) -> Shape:
    out = []
    for sizes in itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        other = {s for s in sizes if s != 1}
        _need(len(other) <= 1, f"shapes {shapes} do not broadcast")
        out.append(other.pop() if other else 1)
    return tuple(reversed(out))


def _infer_size(size: Any, numel: int) -> Shape:
    size = list(size)
    unknown = [i for i, s in enumerate(size) if s == -1]
    _need(len(unknown) <= 1 and all(s >= 0 for s in size if s != -1), f"invalid shape {size}")
    known = math.prod(s for s in size if s != -1)
    if unknown:
        _need(known != 0 and numel % known == 0, f"shape {size} is invalid for {numel} elements")
        size[unknown[0]] = numel // known
    _need(math.prod(size) == numel, f"shape {size} is invalid for {numel} elements")
    return tuple(size)


def _view_strides(shape: Shape, strides: tuple[int, ...], new: Shape) -> "tuple[int, ...] | None":
    """The strides of a view of (shape, strides) as new, or None where none exists
    (at::detail::computeStride)."""
    if not shape:
        return (1,) * len(new)
    numel = math.prod(shape)
    if numel == 0:
        return tuple(strides) if tuple(shape) == tuple(new) else _contiguous(new)
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


def _first(p: dict) -> _Traced:
    return next(v for v in p.values() if isinstance(v, _Traced))


def _elementwise(p: dict) -> _Out:
    return _Out(_broadcast([v.shape for v in p.values() if isinstance(v, _Traced)]))


#: memory_format arguments as the caller writes them, and as schema defaults give them (c10's enum)
_PRESERVE, _CONTIGUOUS = (None, 1, torch.preserve_format), (0, torch.contiguous_format)


def _layout(fmt: Any, shape: Shape) -> Any:
    """The strides a memory_format argument asks for ("auto": the operands')."""
    return "auto" if fmt in _PRESERVE else _contiguous(shape) if fmt in _CONTIGUOUS else None


def _like(p: dict) -> _Out:
    """An op whose result has its first operand's shape (casts, softmax, ``zeros_like``)."""
    shape = tuple(_first(p).shape)
    return _Out(shape, strides=_layout(p.get("memory_format"), shape))


def _copy(p: dict) -> _Out:
    """clone, dropout: the operand's shape and dtype (no probe: dropout's would draw random numbers)."""
    out = _like(p)
    return _Out(out.shape, _first(p).dtype, out.strides)


def _alias(p: dict) -> _Out:
    x = _first(p)
    return _Out(tuple(x.shape), x.dtype, x._strides)


def _contiguous_rule(p: dict) -> _Out:
    x = p["self"]
    fmt = p.get("memory_format")
    return _Out(tuple(x.shape), x.dtype, _contiguous(tuple(x.shape)) if fmt in _CONTIGUOUS else None)


def _reduce(p: dict) -> _Out:
    x = p["self"]
    rank, dims, keep = x.dim(), p.get("dim"), bool(p.get("keepdim") or False)
    dims = range(rank) if dims is None or (isinstance(dims, (list, tuple)) and not dims) else dims
    dims = {_dim(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims)
    return _Out(shape if rank else ())


def _layer_norm(p: dict) -> "_Out | list[_Out]":
    x, ns = p["input"], tuple(p["normalized_shape"])
    lead = x.dim() - len(ns)
    _need(len(ns) >= 1 and lead >= 0 and tuple(x.shape[lead:]) == ns, f"layer_norm over {ns} of {list(x.shape)}")
    for w in (p.get("weight"), p.get("bias")):
        _need(w is None or tuple(w.shape) == ns, "layer_norm weight or bias of another shape")
    if "cudnn_enable" in p:
        return _Out(tuple(x.shape))
    stats = tuple(x.shape[:lead]) + (1,) * len(ns)
    return [_Out(tuple(x.shape)), _Out(stats), _Out(stats)]


def _matmul(p: dict) -> _Out:
    a, b = p["self"], p["other"]
    ra, rb = a.dim(), b.dim()
    _need(ra >= 1 and rb >= 1, "matmul of a 0-d tensor")
    sa, sb = tuple(a.shape), tuple(b.shape)
    if ra == 1 and rb == 1:
        _need(sa == sb, f"matmul of {sa} and {sb}")
        return _Out(())
    ea = (1,) + sa if ra == 1 else sa
    eb = sb + (1,) if rb == 1 else sb
    _need(ea[-1] == eb[-2], f"matmul of {sa} and {sb}")
    shape = _broadcast([ea[:-2], eb[:-2]]) + ea[-2:-1] + eb[-1:]
    if ra == 1:
        shape = shape[:-2] + shape[-1:]
    if rb == 1:
        shape = shape[:-1]
    # (1-d or 2-d) @ batched: aten computes (b^T @ a^T)^T, a transposed result
    return _Out(shape, strides=None if ra <= 2 and rb >= 3 else "auto")


def _mm(p: dict, rank: int = 2) -> _Out:
    a, b = p.get("mat1", p["self"]), p["mat2"]  # mm(self, mat2), bmm(self, mat2), addmm(self, mat1, mat2)
    _need(a.dim() == rank and b.dim() == rank and a.shape[-1] == b.shape[-2]
          and (rank == 2 or a.shape[0] == b.shape[0]), f"mm of {list(a.shape)} and {list(b.shape)}")
    shape = tuple(a.shape[:-1]) + (b.shape[-1],)
    if "mat1" in p:
        _need(_broadcast([shape, tuple(p["self"].shape)]) == shape, "addmm's bias does not broadcast")
    return _Out(shape)


def _bmm(p: dict) -> _Out:
    return _mm(p, rank=3)


def _linear(p: dict) -> _Out:
    x, w, b = p["input"], p["weight"], p.get("bias")
    _need(x.dim() >= 1 and w.dim() == 2 and x.shape[-1] == w.shape[1], f"linear of {list(x.shape)} by {list(w.shape)}")
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    _need(b is None or _broadcast([shape, tuple(b.shape)]) == shape, "linear bias does not broadcast")
    return _Out(shape)


def _permuted(x: _Traced, perm: list[int]) -> _Out:
    _need(sorted(perm) == list(range(x.dim())), f"{perm} is not a permutation of {x.dim()} dims")
    strides = None if x._strides is None else tuple(x._strides[i] for i in perm)
    return _Out(tuple(x.shape[i] for i in perm), x.dtype, strides)


def _permute(p: dict) -> _Out:
    x = p["self"]
    return _permuted(x, [_dim(d, x.dim()) for d in p["dims"]])


def _transpose(p: dict) -> _Out:
    x = p["self"]
    d0, d1 = (p["dim0"], p["dim1"]) if "dim0" in p else (p["axis0"], p["axis1"])
    perm = list(range(x.dim()))
    if x.dim():
        d0, d1 = _dim(d0, x.dim()), _dim(d1, x.dim())
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permuted(x, perm)


def _t(p: dict) -> _Out:
    x = p["self"]
    _need(x.dim() <= 2, "t() of more than 2 dims")
    return _permuted(x, list(reversed(range(x.dim()))))


def _numpy_t(p: dict) -> _Out:
    x = p["self"]
    return _permuted(x, list(reversed(range(x.dim()))))


def _reshaped(x: _Traced, size: Any, must_view: bool) -> _Out:
    shape = _infer_size(size, x.numel())
    if x._strides is None:
        _need(not must_view, "a view of a tensor of unknown strides")
        return _Out(shape, x.dtype, None)
    strides = _view_strides(tuple(x.shape), x._strides, shape)
    _need(strides is not None or not must_view, "view of a tensor whose strides do not allow it")
    return _Out(shape, x.dtype, strides if strides is not None else _contiguous(shape))


def _view(p: dict) -> _Out:
    x = p["self"]
    return _reshaped(x, p["other"].shape if "other" in p else p["size"], must_view=True)


def _reshape(p: dict) -> _Out:
    x = p["self"]
    return _reshaped(x, p["other"].shape if "other" in p else p["shape"], must_view=False)


def _flatten(p: dict) -> _Out:
    x = p["self"]
    if x.dim() == 0:
        return _reshaped(x, (1,), must_view=False)
    s, e = _dim(p["start_dim"], x.dim()), _dim(p["end_dim"], x.dim())
    _need(s <= e, "flatten's start_dim after its end_dim")
    shape = tuple(x.shape[:s]) + (math.prod(x.shape[s:e + 1]),) + tuple(x.shape[e + 1:])
    return _reshaped(x, shape, must_view=False)


def _unflatten(p: dict) -> _Out:
    x = p["self"]
    d = _dim(p["dim"], x.dim())
    sizes = _infer_size(p["sizes"], x.shape[d])
    return _reshaped(x, tuple(x.shape[:d]) + sizes + tuple(x.shape[d + 1:]), must_view=True)


def _unsqueeze(p: dict) -> _Out:
    x = p["self"]
    d = _dim(p["dim"], x.dim() + 1)
    shape = tuple(x.shape[:d]) + (1,) + tuple(x.shape[d:])
    strides = None
    if x._strides is not None:
        new = x.shape[d] * x._strides[d] if d < x.dim() else 1
        strides = x._strides[:d] + (new,) + x._strides[d:]
    return _Out(shape, x.dtype, strides)


def _squeeze(p: dict) -> _Out:
    x = p["self"]
    dims = p.get("dim", None)
    dims = range(x.dim()) if dims is None else [dims] if isinstance(dims, int) else dims
    drop = {i for i in (_dim(d, x.dim()) for d in dims) if x.dim() and x.shape[i] == 1}
    keep = [i for i in range(x.dim()) if i not in drop]
    strides = None if x._strides is None else tuple(x._strides[i] for i in keep)
    return _Out(tuple(x.shape[i] for i in keep), x.dtype, strides)


def _expand(p: dict) -> _Out:
    x = p["self"]
    size = list(p["other"].shape if "other" in p else p["size"])
    lead = len(size) - x.dim()
    _need(lead >= 0, f"expand of {list(x.shape)} to fewer dims {size}")
    shape, strides = [], []
    for i, s in enumerate(size):
        if i < lead:
            _need(s >= 0, f"expand to {size}")
            shape.append(s)
            strides.append(0)
            continue
        have = x.shape[i - lead]
        s = have if s == -1 else s
        _need(have == s or have == 1, f"expand of {list(x.shape)} to {size}")
        shape.append(s)
        strides.append(x._strides[i - lead] if x._strides is not None and have == s else 0)
    return _Out(tuple(shape), x.dtype, tuple(strides) if x._strides is not None else None)


def _sliced(x: _Traced, d: int, start: int, length: int, step: int = 1) -> _Out:
    shape = list(x.shape)
    shape[d] = length
    strides = None
    if x._strides is not None:
        strides = list(x._strides)
        strides[d] *= step
        strides = tuple(strides)
    return _Out(tuple(shape), x.dtype, strides)


def _slice(p: dict) -> _Out:
    x = p["self"]
    _need(x.dim() > 0, "slice of a 0-d tensor")
    d, step = _dim(p["dim"], x.dim()), p["step"]
    _need(isinstance(step, int) and step > 0, "slice step must be positive")
    start, end, _ = slice(p["start"], p["end"], step).indices(x.shape[d])
    return _sliced(x, d, start, len(range(start, end, step)), step)


def _narrow(p: dict) -> _Out:
    x = p["self"]
    _need(x.dim() > 0, "narrow of a 0-d tensor")
    d, start, length = _dim(p["dim"], x.dim()), p["start"], p["length"]
    size = x.shape[d]
    _need(-size <= start <= size and length >= 0, "narrow out of range")
    start = start + size if start < 0 else start
    _need(start + length <= size, "narrow out of range")
    return _sliced(x, d, start, length)


def _select(p: dict) -> _Out:
    x = p["self"]
    _need(x.dim() > 0, "select of a 0-d tensor")
    d, i = _dim(p["dim"], x.dim()), p["index"]
    _need(-x.shape[d] <= i < x.shape[d], f"index {i} out of range")
    keep = [k for k in range(x.dim()) if k != d]
    strides = None if x._strides is None else tuple(x._strides[k] for k in keep)
    return _Out(tuple(x.shape[k] for k in keep), x.dtype, strides)


def _split(p: dict) -> list[_Out]:
    x = p["self"]
    _need(x.dim() > 0, "split of a 0-d tensor")
    d = _dim(p["dim"], x.dim())
    size = x.shape[d]
    if "split_sizes" in p:
        sizes = list(p["split_sizes"])
        _need(all(s >= 0 for s in sizes) and sum(sizes) == size, f"split sizes {sizes} of {size}")
    else:
        if "chunks" in p:
            _need(p["chunks"] > 0 and size > 0, "chunk into no pieces")
            n = -(-size // p["chunks"])
        else:
            n = p["split_size"]
        _need(n > 0 and size > 0, "split of size 0")
        count = -(-size // n)
        sizes = [n] * (count - 1) + [size - n * (count - 1)]
    outs, start = [], 0
    for s in sizes:
        outs.append(_sliced(x, d, start, s))
        start += s
    return outs


def _cat(p: dict) -> _Out:
    ts = [t for t in p["tensors"] if not (t.dim() == 1 and t.shape[0] == 0)]  # torch skips these
    _need(bool(ts) and ts[0].dim() > 0, "cat of nothing, or of 0-d tensors")
    r = ts[0].dim()
    d = _dim(p["dim"], r)
    base = tuple(ts[0].shape)
    for t in ts:
        _need(t.dim() == r and all(t.shape[i] == base[i] for i in range(r) if i != d), "cat of unequal shapes")
    return _Out(base[:d] + (sum(t.shape[d] for t in ts),) + base[d + 1:])


def _stack(p: dict) -> _Out:
    ts = list(p["tensors"])
    _need(bool(ts) and all(t.shape == ts[0].shape for t in ts), "stack of unequal shapes")
    d = _dim(p["dim"], ts[0].dim() + 1)
    base = tuple(ts[0].shape)
    return _Out(base[:d] + (len(ts),) + base[d:])


def _topk(p: dict) -> list[_Out]:
    x = p["self"]
    d = _dim(p["dim"], x.dim())
    size = x.shape[d] if x.dim() else 1
    _need(0 <= p["k"] <= size, f"topk k={p['k']} of {size}")
    shape = tuple(p["k"] if i == d else s for i, s in enumerate(x.shape))
    return [_Out(shape, x.dtype), _Out(shape, torch.int64)]


def _gather(p: dict) -> _Out:
    x, idx = p["self"], p["index"]
    d = _dim(p["dim"], x.dim())
    _need(idx.dim() == x.dim() and all(idx.shape[i] <= x.shape[i] for i in range(x.dim()) if i != d),
          "gather index of another shape")
    return _Out(tuple(idx.shape))


def _index_select(p: dict) -> _Out:
    x, idx = p["self"], p["index"]
    _need(x.dim() > 0 and idx.dim() <= 1, "index_select of a 0-d tensor, or by a 2-d index")
    d = _dim(p["dim"], x.dim())
    return _Out(tuple(idx.numel() if i == d else s for i, s in enumerate(x.shape)))


def _embedding(p: dict) -> _Out:
    w, idx = p["weight"], p["indices"]
    _need(w.dim() == 2, "embedding of a weight that is not 2-d")
    return _Out(tuple(idx.shape) + (w.shape[1],), w.dtype)


def _index_add(p: dict) -> _Out:
    x, idx, src = p["self"], p["index"], p["source"]
    d = _dim(p["dim"], x.dim())
    _need(x.dim() > 0 and idx.dim() <= 1 and src.dim() == x.dim() and src.shape[d] == idx.numel()
          and all(src.shape[i] == x.shape[i] for i in range(x.dim()) if i != d), "index_add of another shape")
    return _Out(tuple(x.shape))


def _scatter_add(p: dict) -> _Out:
    x, idx, src = p["self"], p["index"], p["src"]
    d = _dim(p["dim"], x.dim())
    _need(idx.dim() == x.dim() == src.dim() and all(
        idx.shape[i] <= src.shape[i] and (i == d or idx.shape[i] <= x.shape[i]) for i in range(x.dim())),
        "scatter_add of another shape")
    return _Out(tuple(x.shape))


def _factory(p: dict) -> _Out:
    size = tuple(p["size"])
    _need(all(isinstance(s, int) and s >= 0 for s in size), f"invalid size {list(size)}")
    fmt = p.get("memory_format")
    return _Out(size, strides=_contiguous(size) if fmt is None or fmt in _CONTIGUOUS else None)


def _scalar_tensor(p: dict) -> _Out:
    return _Out((), strides=())


_RULES: dict[str, Callable[[dict], Any]] = {}
for _names, _rule in [
    (["add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "mul.Tensor", "mul.Scalar", "div.Tensor",
      "div.Scalar", "div.Tensor_mode", "true_divide.Tensor", "rsub.Scalar", "rsub.Tensor", "maximum.default",
      "minimum.default", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "eq.Scalar", "eq.Tensor",
      "ne.Scalar", "ne.Tensor", "lt.Scalar", "lt.Tensor", "le.Scalar", "le.Tensor", "gt.Scalar", "gt.Tensor",
      "ge.Scalar", "ge.Tensor", "where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar",
      "masked_fill.Scalar", "masked_fill.Tensor", "clamp.default", "clamp.Tensor", "neg.default",
      "abs.default", "exp.default", "log.default", "sqrt.default", "rsqrt.default", "reciprocal.default",
      "tanh.default", "erf.default", "sigmoid.default", "relu.default", "gelu.default", "silu.default",
      "logical_not.default"], _elementwise),
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
    (["linear.default"], _linear),
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
    (["embedding.default"], _embedding), (["index_add.default"], _index_add),
    (["scatter_add.default"], _scatter_add),
    (["zeros.default", "ones.default", "empty.memory_format", "full.default", "new_zeros.default",
      "new_ones.default", "new_empty.default", "new_full.default"], _factory),
    (["scalar_tensor.default"], _scalar_tensor),
]:
    for _n in _names:
        _RULES["aten." + _n] = _rule
_ARANGE = frozenset({"aten.arange.default", "aten.arange.start", "aten.arange.start_step"})
# every rule is for an op kf lowers itself: the tracer never sends an op to torch-mlir
assert all(n in aten_to_kf.HANDLERS for n in list(_RULES) + list(_ARANGE)), "a shape rule for an op kf lacks"


# ----------------------------------------------------------------------------- the recorder


def _is_device(arg: torch._C.Argument) -> bool:
    return str(arg.type) in ("Device", "Optional[Device]")


def _bind(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by their schema names, defaults filled in."""
    p = {}
    for i, a in enumerate(func._schema.arguments):
        if not a.kwarg_only and i < len(args):
            p[a.name] = args[i]
        elif a.name in kwargs:
            p[a.name] = kwargs[a.name]
        else:
            p[a.name] = a.default_value if a.has_default_value() else None
    return p


class _Recorder(TorchDispatchMode):
    """Records each ATen call as an FX node with its result's shape, dtype and strides."""

    def __init__(self, fn: Callable, reached: "Sequence[torch.Tensor]" = ()):
        super().__init__()
        self.graph = torch.fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.reached: dict[str, int] = {}
        self._reached_index = {id(t): j for j, t in enumerate(reached)}
        self.unsourced: list[torch.Tensor] = []
        self._constant_of: dict[int, _Traced] = {}  # id of a real tensor -> its constant
        self._last_constant: torch.fx.Node | None = None
        self.failed: str | None = None  # set once, so a user's try/except cannot hide it
        self.failed_at = ""  # the stack trace of a write that made it fail
        code = fn.__code__
        # export keeps the frames of functions named forward and of registered anchors
        # (torch >= 2.12 registers the user's function, see capture._traceable)
        register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if register is not None:
            register(fn)
        self._anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", set()) | {(code.co_filename, code.co_name)}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # else TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo: the cost this tracer exists to avoid. Capture
        # never runs inside a Dynamo trace (kf's op runs it outside, see torch_ops._opaque).
        return False

    def fail(self, reason: str, stack_trace: str = "") -> None:
        if self.failed is None:
            self.failed, self.failed_at = reason, stack_trace
        raise Fallback(reason, stack_trace)

    def wrap(self, val: torch.Tensor, known: bool, device: torch.device, node: torch.fx.Node) -> _Traced:
        return _Traced(val, known, device, node, self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.failed:
            raise Fallback(self.failed, self.failed_at)
        if not isinstance(func, torch._ops.OpOverload):
            self.fail(f"{func} is not an ATen op")
        if func is torch.ops.aten.lift_fresh.default and not isinstance(args[0], _Traced):
            return self.constant(args[0], fresh=True)  # torch.tensor([...]): the data, made into a constant
        name = aten_to_kf._target_name(func)
        if func._schema.is_mutable and name not in _HARMLESS_MUTATIONS:
            self.fail(f"{name} mutates a tensor", self._stack_trace())
        rule = _RULES.get(name)
        if rule is None and name not in _ARANGE:
            self.fail(f"{name}: the light tracer has no shape rule for it")
        args, kwargs = tree_map(self._as_traced, (tuple(args), dict(kwargs)))
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, _Traced)]
        device = self._result_device(func, name, args, kwargs, tensors)
        try:
            outs = self._outs(func, name, rule, args, kwargs)
        except Exception as e:  # the user's own error, most likely: export's path reports it
            self.fail(f"{name}: {type(e).__name__}: {e}")
        contiguous = all(_is_contiguous(tuple(t.shape), t._strides) for t in tensors)
        vals, known = [], []
        for o in outs:
            strides = (_contiguous(o.shape) if contiguous else None) if o.strides == "auto" else o.strides
            vals.append(torch.empty_strided(o.shape, strides or _contiguous(o.shape), dtype=o.dtype, device=_META))
            known.append(strides is not None)
        returns = func._schema.returns
        node_args, node_kwargs = tree_map(lambda a: a._node if isinstance(a, _Traced) else a, (args, kwargs))
        single = len(returns) == 1 and str(returns[0].type) == "Tensor"
        node = self._node(func, node_args, node_kwargs, vals[0] if single else vals, self._stack_trace())
        if single:
            return self.wrap(vals[0], known[0], device, node)
        trace = node.meta["stack_trace"]
        items = [self.wrap(v, k, device, self._node(operator.getitem, (node, i), {}, v, trace))
                 for i, (v, k) in enumerate(zip(vals, known))]
        return tuple(items) if len(returns) > 1 else items

    def _outs(self, func, name: str, rule, args: tuple, kwargs: dict) -> list[_Out]:
        """The results' shapes, dtypes and strides."""
        if rule is None:  # arange: its values become a constant anyway, so make them
            real = func(*args, **{**kwargs, "device": _CPU})
            return [_Out(tuple(real.shape), real.dtype, _contiguous(tuple(real.shape)))]
        outs = rule(_bind(func, args, kwargs))
        outs = [outs] if isinstance(outs, _Out) else list(outs)
        n = len(func._schema.returns)
        if n > 1 and len(outs) == 1:
            outs = outs * n  # max.dim, min.dim: values and indices of one shape
        if any(o.dtype is None for o in outs):
            dtypes = [t.dtype for t in tree_leaves(_probe(func, args, kwargs)) if isinstance(t, torch.Tensor)]
            _need(len(dtypes) == len(outs), f"{name}: {len(dtypes)} results on CPU, {len(outs)} here")
            outs = [_Out(o.shape, o.dtype or d, o.strides) for o, d in zip(outs, dtypes)]
        return outs

    def _node(self, target, args, kwargs, val, stack_trace: str) -> torch.fx.Node:
        packet = getattr(target, "overloadpacket", None)  # export's node names: mul, mul_1, ...
        node = self.graph.create_node("call_function", target, args, kwargs, name=packet and packet.__name__)
        node.meta["val"] = val
        node.meta["stack_trace"] = stack_trace
        return node

    def _as_traced(self, a: Any) -> Any:
        """Tensors of the trace as they are; a real tensor (closure, Python data) as a constant."""
        if isinstance(a, torch.Tensor) and not isinstance(a, _Traced):
            return self.constant(a)
        return a

    def constant(self, t: torch.Tensor, fresh: bool = False) -> _Traced:
        """A placeholder for a tensor with data, before the inputs, as export lifts them;
        for a tensor the function reaches, an input after the arguments. ``fresh``: one the
        function made from Python data; any other that is not a reached tensor came from
        somewhere the walk of what the function reads did not see (``unsourced``)."""
        known = self._constant_of.get(id(t))
        if known is not None:
            return known
        j = self._reached_index.get(id(t))
        if j is not None:
            return self._reached_input(t, j)
        if t.device.type == "meta" or type(t) is not torch.Tensor:
            self.fail("a tensor without data of its own reached the trace")
        if not fresh:
            self.unsourced.append(t)
        name = f"c_lifted_tensor_{len(self.constants)}"
        if self._last_constant is not None:
            where = self.graph.inserting_after(self._last_constant)
        else:
            where = self.graph.inserting_before(next(iter(self.graph.nodes), None))
        with where:
            node = self.graph.placeholder(name)
        self._last_constant = node
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        self.constants[name] = t.detach()
        traced = self._constant_of[id(t)] = self.wrap(val, True, t.device, node)
        return traced

    def _reached_input(self, t: torch.Tensor, j: int) -> _Traced:
        """A placeholder after the arguments' (and the reached tensors' met before) for
        reached tensor j, which the program reads at every call."""
        after = [n for n in self.graph.nodes if n.op == "placeholder" and n.name not in self.constants]
        where = self.graph.inserting_after(after[-1]) if after else self.graph.inserting_before(
            next(iter(self.graph.nodes), None))
        with where:
            node = self.graph.placeholder(f"reached_{j}")
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        self.reached[node.name] = j
        traced = self._constant_of[id(t)] = self.wrap(val, True, t.device, node)
        return traced

    def _result_device(self, func, name: str, args: tuple, kwargs: dict, tensors: list[_Traced]) -> torch.device:
        """The device eager would put the result on: the one the op is asked for, else
        its tensors' (a CPU scalar tensor goes with any); two devices fall back."""
        for i, arg in enumerate(func._schema.arguments):
            if _is_device(arg):
                value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
                if value is not None:
                    return torch.device(value)
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1:
            self.fail(f"{name} meets tensors on {sorted(map(str, devices))}")
        if devices:
            return devices.pop()
        return tensors[0].device if tensors else torch.get_default_device()

    def _stack_trace(self) -> str:
        """The frames export would keep, outermost first, in the traceback format
        ``capture._user_loc`` reads."""
        lines = []
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "forward" or (code.co_filename, code.co_name) in self._anchors:
                lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
            frame = frame.f_back
        return "\n".join(reversed(lines))


_PROBE_SIZES = frozenset({"size", "normalized_shape"})


def _probe(func, args: tuple, kwargs: dict) -> Any:
    """The op run on tiny CPU tensors of the operands' ranks and dtypes (ones; zeros for
    integers, which index safely): its results' dtypes are the op's."""
    def small(a):
        if isinstance(a, _Traced):
            shape = [min(s, 2) for s in a.shape]
            return (torch.ones if a.dtype.is_floating_point else torch.zeros)(shape, dtype=a.dtype)
        return a

    args, kwargs = tree_map(small, (list(args), dict(kwargs)))
    for i, arg in enumerate(func._schema.arguments):
        if _is_device(arg) or arg.name in _PROBE_SIZES:
            positional = not arg.kwarg_only and i < len(args)
            value = args[i] if positional else kwargs.get(arg.name)
            if _is_device(arg):
                value = _CPU
            elif value is not None:
                value = [min(s, 2) for s in value]
            if positional:
                args[i] = value
            elif _is_device(arg) or arg.name in kwargs:
                kwargs[arg.name] = value
    with warnings.catch_warnings():  # var() of one element warns; the dtype is all it is for
        warnings.simplefilter("ignore")
        return func(*args, **kwargs)


def _output(x: Any) -> Any:
    """The function's result with nodes for tensors, nested as it was."""
    if isinstance(x, _Traced):
        return x._node
    if type(x) in (tuple, list) and x:
        return type(x)(_output(y) for y in x)
    raise Fallback(f"the function returns a {type(x).__name__}")


def trace(fn: Callable, sig: Signature, tensors: list[torch.Tensor], reached: Sequence[torch.Tensor] = ()) -> Trace:
    """The ATen graph of fn specialized to sig; raises Fallback where export must trace it.
    ``reached``: tensors fn reads besides its arguments (guards.Reads.tensors), which
    become inputs where it uses them.

    Like capture.export_graph, it traces outside any torch.autocast region of the caller,
    and below autograd (no_grad's semantics: nothing records a backward)."""
    rec = _Recorder(fn, reached)
    inputs = []
    for i, t in enumerate(tensors):
        node = rec.graph.placeholder(f"tensors_{i}")
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        inputs.append(rec.wrap(val, True, t.device, node))
    try:
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS), torch._C._AutoDispatchBelowAutograd(), rec:
            result = fn(**rebuild_args(sig, inputs))
    except Fallback:
        raise
    except Exception as e:
        raise Fallback(rec.failed or f"the function raised {type(e).__name__}: {e}", rec.failed_at) from None
    if rec.failed:
        raise Fallback(rec.failed, rec.failed_at)
    rec.graph.output(_output(result))
    return Trace(torch.fx.GraphModule(torch.nn.Module(), rec.graph), rec.constants, rec.reached, rec.unsourced)
